package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestHandoffUpgrade: a daemon started beside a running one (a surge
// upgrade) takes over through -handoff-socket: the listening socket, so
// that no connection is refused at any moment; the informers, so that it
// serves them without a LIST; and a client whose stream the old daemon
// ends resumes on the new one from the handoff's Bookmark with no RESET,
// then receives new changes. The old daemon, unready once it handed off,
// leaves the socket in place when it is stopped.
func TestHandoffUpgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "handoff")
	for i := range 20 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("before-%d", i), nil)
	}
	dir := t.TempDir()
	socket, handoff := filepath.Join(dir, "run", "informerd.sock"), filepath.Join(dir, "handoff", "handoff.sock")
	old := startDaemonProcess(t, socket, "-handoff-socket", handoff)
	c := dialWith(t, socket, client.WithToken(identity(t, reads(configMaps, ns))))
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "handoff"}
	s := openStream(ctx, t, c, opts, "")
	s.until(ctx, t, "the stream syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	// Connections in a loop throughout: none may be refused.
	var dials, refused atomic.Int64
	probeCtx, stopProbe := context.WithCancel(ctx)
	var probing sync.WaitGroup
	probing.Add(1)
	go func() { // ends with stopProbe
		defer probing.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-probeCtx.Done():
				return
			case <-tick.C:
			}
			conn, err := net.Dial("unix", socket)
			dials.Add(1)
			if err != nil {
				refused.Add(1)
				t.Errorf("a connection during the handoff: %v", err)
				continue
			}
			_ = conn.Close()
		}
	}()

	started := time.Now()
	nu := startDaemonProcess(t, socket, "-handoff-socket", handoff)
	// The old daemon ends the stream once the new one serves.
	got, endErr := s.rest(ctx, t)
	t.Logf("the old daemon ended the stream %s after the new one started: %v", time.Since(started).Round(time.Millisecond), endErr)
	if len(got) == 0 || got[len(got)-1].GetType() != informerdv1.EventType_EVENT_TYPE_BOOKMARK {
		t.Fatalf("before its end the stream got %s, want the handoff's Bookmark last", describe(got))
	}
	at := got[len(got)-1].GetResourceVersion()

	resumed := openStream(ctx, t, c, opts, at)
	createConfigMap(ctx, t, ns, "after", nil)
	isAfter := func(ev *informerdv1.Event) bool {
		o, err := decodeUnstructured(ev.GetObject())
		return err == nil && ev.GetType() == informerdv1.EventType_EVENT_TYPE_ADDED && o.GetName() == "after"
	}
	evs := resumed.until(ctx, t, "the change after the handoff arrives", isAfter)
	for _, ev := range evs {
		if ev.GetType() == informerdv1.EventType_EVENT_TYPE_RESET {
			t.Fatalf("resumed at %s on the new daemon, the stream got %s: want no RESET", at, describe(evs))
		}
	}
	if n := nu.metric("informerd_upstream_lists_total"); n != 0 {
		t.Errorf("the new daemon listed %v times, want 0", n)
	}

	resp, err := http.Get(old.metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("the old daemon's /readyz after the handoff: %s %q, want 503", resp.Status, body)
	}
	old.signal(syscall.SIGTERM)
	stopProbe()
	probing.Wait()
	t.Logf("%d connections during the handoff, %d refused", dials.Load(), refused.Load())
	if _, err := os.Stat(socket); err != nil {
		t.Fatalf("the old daemon, stopped, took the socket with it: %v", err)
	}
	createConfigMap(ctx, t, ns, "last", nil)
	resumed.until(ctx, t, "a change after the old daemon stopped arrives", func(ev *informerdv1.Event) bool {
		o, err := decodeUnstructured(ev.GetObject())
		return err == nil && o.GetName() == "last"
	})
	fresh := openStream(ctx, t, dialWith(t, socket, client.WithToken(identity(t, reads(configMaps, ns)))), opts, "")
	fresh.until(ctx, t, "a new client syncs on the new daemon", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
}

// TestHandoffFallsBackCold: a handoff the new daemon cannot use, here one
// that stalls past -handoff-timeout (the old daemon's side is a socket
// that accepts and says nothing), starts the new daemon cold, serving on
// the socket's path in the old one's place.
func TestHandoffFallsBackCold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "handoff-cold")
	createConfigMap(ctx, t, ns, "one", nil)
	dir := t.TempDir()
	socket, handoff := filepath.Join(dir, "run", "informerd.sock"), filepath.Join(dir, "handoff", "handoff.sock")
	old := startDaemonProcess(t, socket) // a daemon without handoff support
	if err := os.MkdirAll(filepath.Dir(handoff), 0o700); err != nil {
		t.Fatal(err)
	}
	stall, err := net.Listen("unix", handoff)
	if err != nil {
		t.Fatal(err)
	}
	stall.(*net.UnixListener).SetUnlinkOnClose(false) // the path is the new daemon's by then
	var held sync.WaitGroup
	defer held.Wait()
	defer stall.Close()
	held.Add(1)
	go func() { // ends when stall closes
		defer held.Done()
		for {
			conn, err := stall.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()

	nu := startDaemonProcess(t, socket, "-handoff-socket", handoff, "-handoff-timeout", "1s")
	// The new daemon serves on the path; the old one still serves the
	// connections it has.
	fresh := openStream(ctx, t, dialWith(t, socket, client.WithToken(identity(t, reads(configMaps, ns)))), client.WatchOptions{Resource: configMaps, Namespace: ns}, "")
	fresh.until(ctx, t, "a new client syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	eventually(ctx, t, "the new daemon lists, cold", func() bool { return nu.metric("informerd_upstream_lists_total") >= 1 })
	old.signal(syscall.SIGTERM)
	if _, err := os.Stat(socket); err != nil {
		t.Fatalf("the old daemon, stopped, removed the new one's socket: %v", err)
	}
}
