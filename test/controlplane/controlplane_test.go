package controlplane

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestStartFailsOnBusyPort: a given port that is in use fails Start with a
// message naming the port and the component, before anything starts.
func TestStartFailsOnBusyPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	// BinDir points nowhere: Start must fail before it needs a binary.
	_, err = Start(context.Background(), Options{APIServerPort: port, BinDir: "/nonexistent", Dir: dir})
	if err == nil || !strings.Contains(err.Error(), strconv.Itoa(port)) || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Fatalf("Start with busy port %d = %v, want an error naming the port and kube-apiserver", port, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("Start left %d entries in its directory, want none", len(entries))
	}
}
