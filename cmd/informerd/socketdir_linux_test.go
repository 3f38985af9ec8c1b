package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The roles this test binary plays when run again as another user
// (TestNonRootDaemonServesOtherUsers).
const (
	roleEnv   = "INFORMERD_TEST_ROLE"
	socketEnv = "INFORMERD_TEST_SOCKET"
)

// runRole plays role ("daemon": listen on socket as the daemon does and
// serve one connection; "client": connect to it) and returns the exit code.
func runRole(role, socket string) int {
	switch role {
	case "daemon":
		l, err := listenUnix(socket, 0o666, false)
		if err != nil {
			fmt.Fprintln(os.Stderr, "listen:", err)
			return 1
		}
		defer l.Close()
		fmt.Println("listening")
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "accept:", err)
			return 1
		}
		_, _ = c.Write([]byte("served"))
		_ = c.Close()
		return 0
	case "client":
		c, err := net.Dial("unix", socket)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dial:", err)
			return 1
		}
		defer c.Close()
		buf := make([]byte, 6)
		if _, err := c.Read(buf); err != nil || string(buf) != "served" {
			fmt.Fprintln(os.Stderr, "read:", err, string(buf))
			return 1
		}
		return 0
	}
	return 2
}

// TestNonRootDaemonServesOtherUsers (issue 20): what the DaemonSet does.
// The init step (-prepare-socket-dir 65532:65532, as root) makes the
// kubelet's root-owned socket directory the daemon's user's; the daemon,
// as uid 65532 with no capability, replaces a stale socket left by a root
// daemon and listens there; a client of another uid (1000) connects.
// Needs root (to run the others as other users), as CI has.
func TestNonRootDaemonServesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the daemon and the client as other users")
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} { // the test's own temp dirs: let the others through
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "run", "informerd") // as the kubelet creates it: root, 0755
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "informerd.sock")
	stale, err := net.Listen("unix", socket) // a root daemon's socket, left behind
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	// This test binary, where the other users may run it.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "informerd.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	as := func(role string, uid uint32) *exec.Cmd {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"="+role, socketEnv+"="+socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		return cmd
	}
	// Without the init step, the daemon's user cannot even replace the
	// stale socket.
	if out, err := as("daemon", 65532).CombinedOutput(); err == nil || !strings.Contains(string(out), "listen:") {
		t.Fatalf("a daemon of uid 65532 in a root-owned directory: %v, %s; want it refused", err, out)
	}

	if err := prepareSocketDir(dir, owner{65532, 65532}, 0o755); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65532 || st.Gid != 65532 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("after -prepare-socket-dir: %s owned by %d:%d, want 65532:65532, 0755", fi.Mode(), st.Uid, st.Gid)
	}
	daemon := as("daemon", 65532)
	daemon.Stderr = os.Stderr
	stdout, err := daemon.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("listening"))
	if _, err := stdout.Read(buf); err != nil {
		t.Fatalf("the daemon of uid 65532 did not listen: %v", err)
	}
	if out, err := as("client", 1000).CombinedOutput(); err != nil {
		t.Errorf("a client of uid 1000: %v, %s", err, out)
	}
	if err := daemon.Wait(); err != nil {
		t.Errorf("the daemon of uid 65532: %v", err)
	}
	// Idempotent: the init step runs again at every pod start.
	if err := prepareSocketDir(dir, owner{65532, 65532}, 0o755); err != nil {
		t.Fatalf("-prepare-socket-dir again: %v", err)
	}
}
