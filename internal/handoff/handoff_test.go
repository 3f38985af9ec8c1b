package handoff

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// sample writes a handoff of two Sources, the first with two objects (one
// in two buffers), the second with none.
func sample(t *testing.T) ([]byte, []Handed) {
	t.Helper()
	want := []Handed{
		{Source: Source{Version: "v1", Resource: "pods", Namespace: "ns", APIVersion: "v1", Kind: "Pod", ResourceVersion: "42", Count: 2},
			Objects: [][]byte{[]byte(`{"a":1}`), []byte(`{"b":2}`)}},
		{Source: Source{Group: "apps", Version: "v1", Resource: "deployments", Protobuf: true, APIVersion: "apps/v1", Kind: "Deployment", ResourceVersion: "7", Count: 0},
			Objects: [][]byte{}},
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, h := range want {
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

// Every truncation, and every flipped byte, is an error: never a partial
// state.
func TestDamagedHandoffsReadNothing(t *testing.T) {
	data, _ := sample(t)
	for n := range len(data) {
		if got, err := Read(bytes.NewReader(data[:n]), Limits{}); err == nil || got != nil {
			t.Fatalf("truncated to %d of %d bytes: read %d Sources, err %v", n, len(data), len(got), err)
		}
	}
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x20
		if got, err := Read(bytes.NewReader(bad), Limits{}); err == nil || got != nil {
			t.Fatalf("byte %d flipped: read %d Sources, err %v", i, len(got), err)
		}
	}
}

func TestAnotherVersionIsRefused(t *testing.T) {
	data, _ := sample(t)
	binary.BigEndian.PutUint32(data[len(magic):], Version+1)
	_, err := Read(bytes.NewReader(data), Limits{})
	if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("err %v, want ErrVersion naming version 2", err)
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
				t.Fatalf("read %d Sources, err %v", len(got), err)
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
