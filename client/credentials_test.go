package client

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTokenFileFollowsRotation: the token is read again when the kubelet
// replaces the file (a symlink swap, as projected volumes do), and a
// missing file fails the call with UNAUTHENTICATED unless it is the
// optional default.
func TestTokenFileFollowsRotation(t *testing.T) {
	dir := t.TempDir()
	write := func(name, token string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "token")
	swap := func(target string) {
		tmp := link + ".tmp"
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, link); err != nil {
			t.Fatal(err)
		}
	}
	get := func(f *tokenFile) (string, error) {
		md, err := f.GetRequestMetadata(context.Background())
		return md["authorization"], err
	}
	write("v1", "first")
	swap(filepath.Join(dir, "v1"))
	f := &tokenFile{path: link}
	if got, err := get(f); err != nil || got != "Bearer first" {
		t.Fatalf("first read: %q, %v", got, err)
	}
	write("v2", "second")
	swap(filepath.Join(dir, "v2"))
	if got, err := get(f); err != nil || got != "Bearer second" {
		t.Fatalf("after the rotation: %q, %v; want the new token", got, err)
	}
	// Rewritten in place with a new modification time.
	write("v2", "third")
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(dir, "v2"), later, later); err != nil {
		t.Fatal(err)
	}
	if got, _ := get(f); got != "Bearer third" {
		t.Fatalf("after a rewrite: %q; want the new token", got)
	}

	missing := &tokenFile{path: filepath.Join(dir, "absent")}
	if _, err := get(missing); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a missing token file: %v, want UNAUTHENTICATED", err)
	}
	optional := &tokenFile{path: filepath.Join(dir, "absent"), optional: true}
	if md, err := optional.GetRequestMetadata(context.Background()); err != nil || len(md) != 0 {
		t.Fatalf("a missing default token file: %v, %v; want no token and no error", md, err)
	}
}

// TestDialKeepsTokensOffPlaintextNetworks: a token reaches a Unix socket or
// loopback in the clear, anything else only over TLS.
func TestDialKeepsTokensOffPlaintextNetworks(t *testing.T) {
	for _, target := range []string{"/run/informerd.sock", "unix:///run/x.sock", "127.0.0.1:7650", "localhost:7650", "[::1]:7650"} {
		c, err := Dial(target, WithToken("t"))
		if err != nil {
			t.Errorf("Dial(%q): %v", target, err)
			continue
		}
		c.Close()
	}
	for _, target := range []string{"10.0.0.5:7650", "node-1:7650", "dns:///informerd:7650"} {
		if _, err := Dial(target, WithToken("t")); err == nil || !strings.Contains(err.Error(), "WithTLS") {
			t.Errorf("Dial(%q) without TLS: %v; want an error naming WithTLS", target, err)
		}
	}
	if _, err := Dial("10.0.0.5:7650", WithTLS(filepath.Join(t.TempDir(), "absent.pem"), "informerd")); err == nil || !strings.Contains(err.Error(), "CA bundle") {
		t.Errorf("Dial with a missing CA bundle: %v", err)
	}
}

func TestWatcherRetries(t *testing.T) {
	for _, tt := range []struct {
		code       codes.Code
		progressed bool
		want       bool
	}{
		{codes.Unavailable, false, true},
		{codes.ResourceExhausted, false, true},
		{codes.PermissionDenied, false, true},
		{codes.Unauthenticated, true, true},
		{codes.Unauthenticated, false, false},
		{codes.NotFound, true, false},
		{codes.InvalidArgument, false, false},
	} {
		if got := retryable(status.Error(tt.code, "x"), tt.progressed); got != tt.want {
			t.Errorf("retryable(%s, progressed %v) = %v, want %v", tt.code, tt.progressed, got, tt.want)
		}
	}
}
