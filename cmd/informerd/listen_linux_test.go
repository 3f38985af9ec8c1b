package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

// dirEvent is one inotify event of a watched directory.
type dirEvent struct {
	name string
	mask uint32
}

// watchDir returns a function that returns the inotify events of dir
// queued since watchDir: its entries created, moved in, and changed
// (IN_ATTRIB: a chmod among others).
func watchDir(t *testing.T, dir string) func() []dirEvent {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_CREATE|syscall.IN_MOVED_TO|syscall.IN_ATTRIB); err != nil {
		t.Fatal(err)
	}
	return func() []dirEvent {
		var evs []dirEvent
		buf := make([]byte, 64<<10)
		for {
			n, err := syscall.Read(fd, buf)
			if errors.Is(err, syscall.EAGAIN) {
				return evs
			}
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off < n; {
				ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(ev.Len)]
				evs = append(evs, dirEvent{name: string(bytes.TrimRight(name, "\x00")), mask: ev.Mask})
				off += syscall.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// TestListenUnixNeverWidensTheMode: under a umask that narrows nothing,
// the socket appears at its path with its final mode and is never changed
// there (no IN_ATTRIB after it appears): there is no moment at which
// another user could connect to a 0600 socket. Nothing else is left in
// the directory, a stale socket is replaced, and closing removes it.
func TestListenUnixNeverWidensTheMode(t *testing.T) {
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	for _, tt := range []struct {
		name  string
		mode  os.FileMode
		stale bool
	}{
		{"local only", 0o600, false},
		{"every caller has a token", 0o666, false},
		{"over a stale socket", 0o600, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "informerd.sock")
			if tt.stale {
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				l.SetUnlinkOnClose(false)
				_ = l.Close()
			}
			events := watchDir(t, dir)
			l, err := listenUnix(path, tt.mode, false)
			if err != nil {
				t.Fatal(err)
			}
			appeared := false
			for _, ev := range events() {
				switch {
				case ev.name == filepath.Base(path) && ev.mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
					appeared = true
				case ev.name == filepath.Base(path) && ev.mask&syscall.IN_ATTRIB != 0 && appeared:
					t.Fatalf("the socket's attributes changed after it appeared at %s (events %+v): it existed there with another mode", path, ev)
				case ev.name != filepath.Base(path) && ev.mask&syscall.IN_ISDIR == 0:
					t.Fatalf("listenUnix created %s, not a directory, beside the socket", ev.name)
				}
			}
			fi, err := os.Lstat(path)
			if err != nil || !appeared {
				t.Fatalf("the socket at %s: %v, appeared %t", path, err, appeared)
			}
			if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != tt.mode {
				t.Fatalf("the socket's mode is %v, want a socket with %v", fi.Mode(), tt.mode)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Fatalf("the directory holds %v, want only the socket", entries)
			}
			if l.Addr().String() != path {
				t.Fatalf("the listener's address is %s, want %s", l.Addr(), path)
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("after Close, the socket: %v; want it removed", err)
			}
		})
	}
}
