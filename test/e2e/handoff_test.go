package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

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

// TestHandoffThroughAnOutage: a daemon that takes over while the API server
// is unreachable serves what the old one held to the old one's clients,
// whose tokens and accesses it trusts as the old one did (it can verify
// nothing): the resumed stream without a RESET, a new stream's snapshot,
// a Get, an address and a status. Readiness and the stale gauge say it
// serves without upstream. Once the API server is back it resumes each
// informer from the handoff's position, without a LIST, and a change made
// then reaches the resumed stream.
func TestHandoffThroughAnOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := podNamespace(ctx, t, "outage")
	for i := range 20 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("before-%d", i), nil)
	}
	pod := createPod(ctx, t, ns, podSpec{name: "web", labels: map[string]string{"app": "web"}, ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}})
	dir := t.TempDir()
	socket, handoff := filepath.Join(dir, "run", "informerd.sock"), filepath.Join(dir, "handoff", "handoff.sock")
	old := startDaemonProcess(t, socket, "-handoff-socket", handoff)

	// Every client is served once by the old daemon, which so verifies
	// its token and access.
	c := dialWith(t, socket, client.WithToken(identity(t, reads(configMaps, ns))))
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "outage"}
	s := openStream(ctx, t, c, opts, "")
	s.until(ctx, t, "the stream syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	get := &informerdv1.GetRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: ns, Name: "before-7", ClientName: "outage"}
	if _, err := c.API().Get(ctx, get); err != nil {
		t.Fatal(err)
	}
	proxy := dialWith(t, socket, client.WithToken(identity(t, readsPods)))
	addr := pod.Status.PodIP + ":8080"
	const podAnswer = "web Running ready=true pod_ip port=http/8080/0 app=web"
	watchAddress(t, proxy, addr, "app").expect(ctx, t, podAnswer)
	statusOf := &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{{Kind: "ConfigMap", Namespace: ns, Name: "before-3"}}, ClientName: "outage"}
	firstStatus(ctx, t, c, statusOf)
	if n := old.metric("informerd_upstream_lists_total"); n == 0 {
		t.Fatal("the old daemon never listed")
	}

	held := listSelected(ctx, t, ns, "")
	restart := stopAPIServer(t)
	// The upgrade comes while the old daemon serves without upstream.
	eventually(ctx, t, "the old daemon's informers are counted stale", func() bool { return old.metricSum("informerd_sources_stale") >= 2 })
	nu := startDaemonProcess(t, socket, "-handoff-socket", handoff)
	nu.scraper = old.scraper // verified by the old daemon: the new one can verify nothing
	got, err := s.rest(ctx, t)
	if len(got) == 0 || got[len(got)-1].GetType() != informerdv1.EventType_EVENT_TYPE_BOOKMARK {
		t.Fatalf("the old daemon ended the stream (%v) after %s, want the handoff's Bookmark last", err, describe(got))
	}
	at := got[len(got)-1].GetResourceVersion()

	// Each served within a second of asking, measured (not asserted).
	reconnected := time.Now()
	resumed := openStream(ctx, t, c, opts, at)
	resumedIn := time.Since(reconnected)
	start := time.Now()
	snap := openStream(ctx, t, c, opts, "").until(ctx, t, "a new stream syncs from the handed-off state", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	snapIn := time.Since(start)
	if got := snapshotOf(t, snap); !maps.Equal(got, held) {
		t.Errorf("a new stream's snapshot during the outage:\n got %v\nwant %v (the API server's before it stopped)", got, held)
	}
	start = time.Now()
	if _, err := c.API().Get(ctx, get); err != nil {
		t.Errorf("a Get during the outage: %v", err)
	}
	getIn := time.Since(start)
	start = time.Now()
	watchAddress(t, proxy, addr, "app").expect(ctx, t, podAnswer)
	addrIn := time.Since(start)
	start = time.Now()
	firstStatus(ctx, t, c, statusOf)
	statusIn := time.Since(start)
	t.Logf("served during the outage: resumed stream %s, new stream synced %s, Get %s, WatchAddress %s, WatchStatus %s",
		resumedIn.Round(time.Millisecond), snapIn.Round(time.Millisecond), getIn.Round(time.Millisecond), addrIn.Round(time.Millisecond), statusIn.Round(time.Millisecond))

	resp, err := http.Get(nu.metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "serving the informers' last state") {
		t.Errorf("the new daemon's /readyz during the outage: %s %q, want 503 saying it serves the last state", resp.Status, body)
	}
	eventually(ctx, t, "the new daemon's informers are counted stale", func() bool { return nu.metricSum("informerd_sources_stale") >= 2 })

	restart(ctx)
	createConfigMap(ctx, t, ns, "after", nil)
	evs := resumed.until(ctx, t, "a change after the outage arrives", isAdded("after"))
	for _, ev := range evs {
		if ev.GetType() == informerdv1.EventType_EVENT_TYPE_RESET {
			t.Fatalf("resumed at %s on the new daemon, the stream got %s: want no RESET", at, describe(evs))
		}
	}
	// Converged: a new stream holds what the API server holds.
	want := listSelected(ctx, t, ns, "")
	if got := snapshotOf(t, openStream(ctx, t, c, opts, "").until(ctx, t, "a new stream syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))); !maps.Equal(got, want) {
		t.Errorf("after the outage a new stream holds\n %v\nwant %v", got, want)
	}
	eventually(ctx, t, "the new daemon is ready once the API server is back", func() bool {
		resp, err := http.Get(nu.metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The restarted API server's watch cache begins after the handoff's
	// position: it answers each informer's watch from there 410 Gone, so
	// each relists once (what a relist changed reaches its streams as
	// changes, not a RESET). Nothing else lists.
	lists, relists := nu.metric("informerd_upstream_lists_total"), nu.metric("informerd_upstream_relists_total")
	t.Logf("after the outage the new daemon listed %v times, %v of them relists", lists, relists)
	if lists > 2 || lists != relists {
		t.Errorf("the new daemon listed %v times (%v relists), want at most a relist for each of its 2 informers", lists, relists)
	}
	if n := nu.metricSum("informerd_sources_stale"); n != 0 {
		t.Errorf("%v informers still stale after the API server returned", n)
	}
}

// snapshotOf is a snapshot's objects (until SYNCED) as listSelected has
// them: namespace/name to resourceVersion.
func snapshotOf(t *testing.T, evs []*informerdv1.Event) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ev := range evs {
		if ev.GetType() != informerdv1.EventType_EVENT_TYPE_ADDED {
			continue
		}
		o, err := decodeUnstructured(ev.GetObject())
		if err != nil {
			t.Fatal(err)
		}
		out[o.GetNamespace()+"/"+o.GetName()] = o.GetResourceVersion()
	}
	return out
}

// firstStatus opens a status stream of req and waits for its first status,
// which must be CURRENT.
func firstStatus(ctx context.Context, t *testing.T, c *client.Client, req *informerdv1.WatchStatusRequest) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.API().WatchStatus(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("the status stream ended before a status: %v", err)
		}
		for _, ev := range resp.GetEvents() {
			if ev.GetType() == informerdv1.StatusEventType_STATUS_EVENT_TYPE_STATUS {
				if st := ev.GetStatus().GetStatus(); st != informerdv1.Status_STATUS_CURRENT {
					t.Fatalf("status %v, want CURRENT", st)
				}
				return
			}
		}
	}
}

// TestHandoffOfAnIdleDaemon: a daemon that holds no informer hands off too
// (the listening socket, nothing else): it is then unready, and the new
// daemon serves.
func TestHandoffOfAnIdleDaemon(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "handoff-idle")
	dir := t.TempDir()
	socket, handoff := filepath.Join(dir, "run", "informerd.sock"), filepath.Join(dir, "handoff", "handoff.sock")
	old := startDaemonProcess(t, socket, "-handoff-socket", handoff)
	startDaemonProcess(t, socket, "-handoff-socket", handoff)
	eventually(ctx, t, "the old daemon says it handed off", func() bool {
		resp, err := http.Get(old.metrics + "/readyz")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "handed off")
	})
	s := openStream(ctx, t, dialWith(t, socket, client.WithToken(identity(t, reads(configMaps, ns)))), client.WatchOptions{Resource: configMaps, Namespace: ns}, "")
	s.until(ctx, t, "a new client syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
}

// TestHandoffThroughALongOutage: an upgrade well into an outage, when the
// old daemon can no longer verify its callers' tokens (their verifications
// expired; it serves their streams on for the grace after their re-checks
// began to fail) still serves them: the new daemon carries the grace, and
// the resumed stream, a new one and a Get of the same caller are served
// from the handed-off state; a caller the old daemon did not serve is not.
func TestHandoffThroughALongOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "long-outage")
	createConfigMap(ctx, t, ns, "one", nil)
	dir := t.TempDir()
	socket, handoff := filepath.Join(dir, "run", "informerd.sock"), filepath.Join(dir, "handoff", "handoff.sock")
	flags := []string{"-handoff-socket", handoff, "-token-cache-ttl", "2s"}
	oldLog := &syncBuffer{}
	startDaemonProcessTo(t, socket, oldLog, flags...)
	c := dialWith(t, socket, client.WithToken(identity(t, reads(configMaps, ns))))
	stranger := dialWith(t, socket, client.WithToken(identity(t, reads(configMaps, ns))))
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "long-outage"}
	s := openStream(ctx, t, c, opts, "")
	s.until(ctx, t, "the stream syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	restart := stopAPIServer(t)
	// Past the token's verification and its first failed re-check, the
	// old daemon serves the stream in its grace only.
	eventually(ctx, t, "the old daemon serves the stream in its grace", func() bool {
		return strings.Contains(oldLog.String(), "serving on within the grace")
	})
	startDaemonProcess(t, socket, flags...)
	got, err := s.rest(ctx, t)
	if len(got) == 0 || got[len(got)-1].GetType() != informerdv1.EventType_EVENT_TYPE_BOOKMARK {
		t.Fatalf("the old daemon ended the stream (%v) after %s, want the handoff's Bookmark last", err, describe(got))
	}
	at := got[len(got)-1].GetResourceVersion()
	resumed := openStream(ctx, t, c, opts, at)
	openStream(ctx, t, c, opts, "").until(ctx, t, "a new stream of the caller syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	get := &informerdv1.GetRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: ns, Name: "one", ClientName: "long-outage"}
	if _, err := c.API().Get(ctx, get); err != nil {
		t.Errorf("a Get of the caller: %v", err)
	}
	if _, err := stranger.API().Get(ctx, get); status.Code(err) != codes.Unavailable {
		t.Errorf("a Get of a caller the old daemon never served: %v, want UNAVAILABLE", err)
	}

	restart(ctx)
	createConfigMap(ctx, t, ns, "after", nil)
	evs := resumed.until(ctx, t, "a change after the outage arrives", isAdded("after"))
	for _, ev := range evs {
		if ev.GetType() == informerdv1.EventType_EVENT_TYPE_RESET {
			t.Fatalf("resumed at %s on the new daemon, the stream got %s: want no RESET", at, describe(evs))
		}
	}
}

// stopAPIServer stops the API server until the func it returns starts it
// again (startAPIServer); if the test ends first, its cleanup does, for
// the tests after it.
func stopAPIServer(t *testing.T) (restart func(context.Context)) {
	t.Helper()
	env.StopAPIServer()
	started := false
	t.Cleanup(func() {
		if !started {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = env.StartAPIServer(ctx)
			_ = env.RestartWatchers(ctx)
		}
	})
	return func(ctx context.Context) {
		t.Helper()
		startAPIServer(ctx, t)
		started = true
	}
}
