package handoff

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"net"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// sample writes a handoff of two Sources, the first with two objects (one
// in two buffers), the second with none, and two extras, one before the
// Sources and one between them.
func sample(t *testing.T) ([]byte, *Contents) {
	t.Helper()
	sources := []Handed{
		{Source: Source{Version: "v1", Resource: "pods", Namespace: "ns", APIVersion: "v1", Kind: "Pod", ResourceVersion: "42", Count: 2},
			Objects: [][]byte{[]byte(`{"a":1}`), []byte(`{"b":2}`)}},
		{Source: Source{Group: "apps", Version: "v1", Resource: "deployments", Protobuf: true, APIVersion: "apps/v1", Kind: "Deployment", ResourceVersion: "7", Count: 0},
			Objects: [][]byte{}},
	}
	want := &Contents{Sources: sources, Extras: map[string][]byte{"auth": []byte(`{"tokens":[]}`), "empty": {}}}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.Extra("auth", want.Extras["auth"]); err != nil {
		t.Fatal(err)
	}
	for i, h := range sources {
		if i == 1 {
			if err := w.Extra("empty", nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.WriteSource(h.Source); err != nil {
			t.Fatal(err)
		}
		for _, o := range h.Objects {
			if err := w.Object([][]byte{o[:2], o[2:]}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), want
}

func TestRoundTrip(t *testing.T) {
	data, want := sample(t)
	got, err := Read(bytes.NewReader(data), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v, wrote %+v", got, want)
	}
}

// A handoff of version 1 (no extras) is read as it was written.
func TestVersion1IsRead(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	src := Source{Version: "v1", Resource: "pods", APIVersion: "v1", Kind: "Pod", ResourceVersion: "3", Count: 1}
	if err := w.WriteSource(src); err != nil {
		t.Fatal(err)
	}
	if err := w.Object([][]byte{[]byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	// The checksum covers the header: sum again.
	binary.BigEndian.PutUint32(data[len(magic):], 1)
	resum(data)
	got, err := Read(bytes.NewReader(data), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (&Contents{Sources: []Handed{{Source: src, Objects: [][]byte{[]byte("{}")}}}}); !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v, want %+v", got, want)
	}
}

// resum rewrites the checksum at the end of a handoff after its bytes
// were changed.
func resum(data []byte) {
	n := len(data) - 4
	binary.BigEndian.PutUint32(data[n:], crc32.Checksum(data[:n], castagnoli))
}

func TestExtrasChecked(t *testing.T) {
	data, _ := sample(t)
	if _, err := Read(bytes.NewReader(data), Limits{MaxExtraBytes: 12}); err == nil || !strings.Contains(err.Error(), `extra "auth" has 13 bytes, over the limit of 12`) {
		t.Errorf("an extra of 13 bytes under MaxExtraBytes 12: err %v", err)
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	_ = w.Extra("a", nil)
	_ = w.Extra("a", []byte("again"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(&buf, Limits{}); err == nil || got != nil || !strings.Contains(err.Error(), `two extras "a"`) {
		t.Errorf("two extras of one name: read %v, err %v", got, err)
	}
	if err := NewWriter(io.Discard).Extra("", nil); err == nil {
		t.Error("an extra without a name was written")
	}
}

// Every truncation, and every flipped byte, is an error: never a partial
// state.
func TestDamagedHandoffsReadNothing(t *testing.T) {
	data, _ := sample(t)
	for n := range len(data) {
		if got, err := Read(bytes.NewReader(data[:n]), Limits{}); err == nil || got != nil {
			t.Fatalf("truncated to %d of %d bytes: read %v, err %v", n, len(data), got, err)
		}
	}
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x20
		if got, err := Read(bytes.NewReader(bad), Limits{}); err == nil || got != nil {
			t.Fatalf("byte %d flipped: read %v, err %v", i, got, err)
		}
	}
}

func TestAnotherVersionIsRefused(t *testing.T) {
	data, _ := sample(t)
	binary.BigEndian.PutUint32(data[len(magic):], Version+1)
	_, err := Read(bytes.NewReader(data), Limits{})
	if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("err %v, want ErrVersion naming version 3", err)
	}
}

func TestLimits(t *testing.T) {
	data, _ := sample(t)
	if _, err := Read(bytes.NewReader(data), Limits{MaxObjectBytes: 6}); err == nil || !strings.Contains(err.Error(), "over the limit of 6") {
		t.Errorf("an object of 7 bytes under MaxObjectBytes 6: err %v", err)
	}
	if _, err := Read(bytes.NewReader(data), Limits{MaxBytes: int64(len(data) / 2)}); err == nil || !strings.Contains(err.Error(), "over its limit") {
		t.Errorf("under MaxBytes of half its size: err %v", err)
	}
	if _, err := Read(bytes.NewReader(data), Limits{MaxObjectBytes: 7, MaxBytes: int64(len(data))}); err != nil {
		t.Errorf("at its limits exactly: %v", err)
	}
}

func TestRecordsOutOfOrder(t *testing.T) {
	for name, write := range map[string]func(w *Writer){
		"an object before any Source": func(w *Writer) { _ = w.Object([][]byte{[]byte("x")}) },
		"an extra among a Source's objects": func(w *Writer) {
			_ = w.WriteSource(Source{Version: "v1", Resource: "pods", ResourceVersion: "1", Count: 2})
			_ = w.Object([][]byte{[]byte("x")})
			_ = w.Extra("e", nil)
			_ = w.Object([][]byte{[]byte("y")})
		},
		"fewer objects than counted": func(w *Writer) {
			_ = w.WriteSource(Source{Version: "v1", Resource: "pods", ResourceVersion: "1", Count: 2})
			_ = w.Object([][]byte{[]byte("x")})
		},
		"more objects than counted": func(w *Writer) {
			_ = w.WriteSource(Source{Version: "v1", Resource: "pods", ResourceVersion: "1", Count: 1})
			_ = w.Object([][]byte{[]byte("x")})
			_ = w.Object([][]byte{[]byte("y")})
		},
		"a Source without a position": func(w *Writer) {
			_ = w.WriteSource(Source{Version: "v1", Resource: "pods"})
		},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			write(w)
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if got, err := Read(&buf, Limits{}); err == nil || got != nil {
				t.Fatalf("read %v, err %v", got, err)
			}
		})
	}
}

func TestSendFile(t *testing.T) {
	a, b := socketPair(t)
	f, err := os.CreateTemp(t.TempDir(), "f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("handed"); err != nil {
		t.Fatal(err)
	}
	if err := SendFile(a, f, 'L'); err != nil {
		t.Fatal(err)
	}
	got, tag, err := RecvFile(b, "got")
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if tag != 'L' {
		t.Errorf("tag %q, want 'L'", tag)
	}
	data := make([]byte, 16)
	n, _ := got.ReadAt(data, 0) // the same open file: read from its start
	if data = data[:n]; string(data) != "handed" {
		t.Errorf("the descriptor received reads %q, want the file sent", data)
	}
}

func TestRecvFileWithoutDescriptor(t *testing.T) {
	a, b := socketPair(t)
	if _, err := a.Write([]byte{'L'}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RecvFile(b, "got"); err == nil || !strings.Contains(err.Error(), "0 descriptors") {
		t.Errorf("a message without a descriptor: err %v", err)
	}
	_ = a.Close()
	if _, _, err := RecvFile(b, "got"); err == nil {
		t.Error("a closed connection: no error")
	}
}

func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}
