package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestFieldSelectorRejectedByTheAPIServer (defect 9.4): a field selector
// the API server does not support for the resource ends the stream once
// with INVALID_ARGUMENT carrying the API server's message; a Watcher stops
// with it instead of reconnecting forever.
func TestFieldSelectorRejectedByTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ""))
	opts := client.WatchOptions{Resource: configMaps, FieldSelector: "spec.nonsense=x", ClientName: "bad-field"}
	s, err := c.Stream(ctx, opts, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Recv()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"spec.nonsense" is not a known field selector`) {
		t.Fatalf("stream ended with %v, want INVALID_ARGUMENT with the API server's message", err)
	}
	w := client.NewWatcher(c, opts, newRecorder(), client.WatcherOptions{Backoff: client.Backoff{Initial: time.Millisecond}})
	if err := w.Run(ctx); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Watcher.Run = %v, want the INVALID_ARGUMENT at once", err)
	}
	// One upstream attempt per request, not a retry loop: the informer is
	// stopped, not stale.
	for _, in := range d.mgr.Sources() {
		if in.Key.FieldSelector != "" && in.State != "stopped" {
			t.Errorf("the rejected informer is %s, want stopped", in.State)
		}
	}
}

// TestStalledSnapshotReadersAreBounded (defect 9.3): clients that stop
// reading in the middle of a 10,000-object snapshot while every object is
// rewritten pin one frozen generation of the store (shared, not copied
// per client) until -stream-write-timeout cuts them off; then the
// daemon's live heap is back where it was.
func TestStalledSnapshotReadersAreBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	objects := 10000
	if v := os.Getenv("INFORMERD_E2E_OBJECTS"); v != "" {
		objects, _ = strconv.Atoi(v)
	}
	ns := createNamespace(ctx, t, "stall")
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	payload := strings.Repeat("x", 2048)
	writeAll := func(round int) time.Duration {
		start := time.Now()
		parallel(ctx, t, objects, func(i int) error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}, Data: map[string]string{"round": strconv.Itoa(round), "pad": payload}}
			var err error
			if round == 0 {
				_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			} else {
				_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			}
			return err
		})
		return time.Since(start)
	}
	took := writeAll(0)
	// Longer than a rewrite usually takes, so that the stall is measured
	// before the cut.
	const timeout = 30 * time.Second
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"), "-scope", "namespace",
		"-log-max-events", "1000", "-log-min-age", "0s", "-enable-pprof", "-stream-write-timeout", timeout.String())
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns}
	bystander := newRecorder()
	runWatcher(t, dialSocket(t, d.socket, reads(configMaps, ns)), withName(opts, "bystander"), bystander)
	<-bystander.synced
	base := d.liveHeap()

	// Each stalled client reads one batch of its snapshot, then nothing,
	// while every object is rewritten.
	var stalled []*client.Stream
	for i := range 3 {
		s, err := dialSocket(t, d.socket, reads(configMaps, ns)).Stream(ctx, withName(opts, fmt.Sprintf("stalled-%d", i)), "")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, s)
	}
	stallStart := time.Now()
	writeAll(1)
	want := listState(ctx, t, configMaps, ns)
	bystander.waitFor(ctx, t, "the bystander sees every write", func(objs map[string]string) bool { return maps.Equal(objs, want) })
	during := d.liveHeap()
	if stalled := time.Since(stallStart); stalled >= timeout {
		t.Logf("the rewrite took %s (creating took %s), past the write timeout: the heap while stalled was measured after the cut", stalled, took)
	}

	// Past the write timeout all are cut off (reading before that would
	// unblock them) and what they pinned is free.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*timeout, true, func(context.Context) (bool, error) {
		return d.metric("informerd_streams") == 1, nil // the bystander's
	})
	if err != nil {
		t.Fatalf("the stalled streams were not cut off within %s: %v", 2*timeout, err)
	}
	for i, s := range stalled {
		for {
			_, err := s.Recv()
			if err == nil {
				continue
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("stalled client %d ended with %v, want UNAVAILABLE", i, err)
			}
			break
		}
	}
	after := d.liveHeap()
	t.Logf("%d objects of 2 KiB, 3 clients stalled mid-snapshot while every object was rewritten: daemon live heap %.1f MiB before, %.1f MiB while stalled, %.1f MiB after the %s write timeout",
		objects, base/(1<<20), during/(1<<20), after/(1<<20), timeout)
	if during > base*2.5 {
		t.Errorf("3 stalled clients pinned %.1f MiB over a %.1f MiB heap: more than one frozen generation", (during-base)/(1<<20), base/(1<<20))
	}
	if after > base*1.25+(4<<20) {
		t.Errorf("the daemon's live heap is %.1f MiB after the stalled clients were cut off, against %.1f MiB before", after/(1<<20), base/(1<<20))
	}
}

// TestExpensiveSelectorsDoNotStallBystanders (defect 9.3): clients that
// subscribe over and over with large set-based selectors to a 10,000-object
// informer filter outside its lock: a bystander's latency is measured and
// reported with and without them.
func TestExpensiveSelectorsDoNotStallBystanders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	objects := 10000
	if v := os.Getenv("INFORMERD_E2E_OBJECTS"); v != "" {
		objects, _ = strconv.Atoi(v)
	}
	big := createNamespace(ctx, t, "big")
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1()
	parallel(ctx, t, objects, func(i int) error {
		_, err := cms.ConfigMaps(big).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Labels: map[string]string{"i": strconv.Itoa(i)}}}, metav1.CreateOptions{})
		return err
	})
	mine := createNamespace(ctx, t, "bystander")
	for i := range 10 {
		createConfigMap(ctx, t, mine, fmt.Sprintf("lat-%d", i), map[string]string{"ts": "0"})
	}
	// Selectors and requests this large are over informerd's default
	// limits: raised, so that the attack reaches the filters.
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"), "-scope", "cluster",
		"-max-selector-bytes", "131072", "-max-request-bytes", "262144")
	lat := newLatencies()
	runWatcher(t, dialSocket(t, d.socket, reads(configMaps, mine)), client.WatchOptions{Resource: configMaps, Namespace: mine, ClientName: "bystander"}, lat)
	<-lat.synced
	lat.take(ctx, t, 10)
	measure := func(n int) []time.Duration {
		for i := range n {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lat-%d", i%10)}, Data: map[string]string{"ts": strconv.FormatInt(time.Now().UnixNano(), 10)}}
			if _, err := cms.ConfigMaps(mine).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			hold(ctx, 20*time.Millisecond) // the bystander's own pace
		}
		return lat.take(ctx, t, n)
	}
	alone := measure(100)

	// 4 attackers, each subscribing cluster-wide over and over with a
	// 4,000-requirement selector (about 60 KiB).
	var reqs []string
	for i := range 4000 {
		reqs = append(reqs, fmt.Sprintf("k%d notin (a,b)", i))
	}
	sel := strings.Join(reqs, ",")
	actx, stopAttack := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var snapshots sync.Map
	for a := range 4 {
		c := dialSocket(t, d.socket, reads(configMaps, ""))
		wg.Add(1)
		go func() { // ends with actx
			defer wg.Done()
			n := 0
			for actx.Err() == nil {
				s, err := c.Stream(actx, client.WatchOptions{Resource: configMaps, LabelSelector: sel, ClientName: "attacker"}, "")
				if err != nil {
					return
				}
				for actx.Err() == nil {
					evs, err := s.Recv()
					if err != nil || slices.ContainsFunc(evs, func(e *informerdv1.Event) bool { return e.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED }) {
						break
					}
				}
				s.Close()
				n++
			}
			snapshots.Store(a, n)
		}()
	}
	attacked := measure(100)
	stopAttack()
	wg.Wait()
	total := 0
	snapshots.Range(func(_, v any) bool { total += v.(int); return true })
	t.Logf("bystander latency over 100 updates: p50 %s p99 %s max %s alone; p50 %s p99 %s max %s while 4 clients read %d snapshots of %d objects through a 4,000-requirement selector",
		p50(alone), p99(alone), slices.Max(alone), p50(attacked), p99(attacked), slices.Max(attacked), total, objects)
	if m := slices.Max(attacked); m > 3*time.Second {
		t.Errorf("a bystander update took %s to arrive while others filtered snapshots: the Source's lock was held", m)
	}
}

// TestReconnectAfterDaemonOutage (defect 9.9): a connection made before
// the daemon went away is served again within about a second of the
// daemon being back, not after gRPC's default backoff (up to 2 minutes).
// INFORMERD_E2E_OUTAGES (default "20s") lists the outages measured.
func TestReconnectAfterDaemonOutage(t *testing.T) {
	outages := "20s"
	if v := os.Getenv("INFORMERD_E2E_OUTAGES"); v != "" {
		outages = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "outage")
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"), "-scope", "namespace")
	c := dialSocket(t, d.socket, reads(configMaps, ns))
	for _, o := range strings.Split(outages, ",") {
		outage, err := time.ParseDuration(o)
		if err != nil {
			t.Fatalf("INFORMERD_E2E_OUTAGES: %v", err)
		}
		if _, err := c.API().ListInformers(ctx, &informerdv1.ListInformersRequest{}); err != nil {
			t.Fatal(err) // the connection is up before the outage
		}
		d.signal(syscall.SIGTERM)
		hold(ctx, outage) // the outage is what is measured
		d.start()
		back := time.Now()
		s, err := c.Stream(ctx, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "reconnect"}, "")
		if err != nil {
			t.Fatal(err)
		}
		for {
			_, err := s.Recv()
			if err == nil {
				break
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatal(err)
			}
			s.Close()
			hold(ctx, 20*time.Millisecond) // retrying as a client does
			if s, err = c.Stream(ctx, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "reconnect"}, ""); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		took := time.Since(back)
		t.Logf("after a %s daemon outage the old connection was served %s after the daemon was back", outage, took)
		if took > 5*time.Second {
			t.Errorf("after a %s outage the connection took %s to be served again, want about a second", outage, took)
		}
	}
}

// parallel runs f(0..n-1) on 16 workers, failing the test on an error.
func parallel(ctx context.Context, t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() { // ends when next is closed
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

func withName(o client.WatchOptions, name string) client.WatchOptions {
	o.ClientName = name
	return o
}

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// liveHeap forces a garbage collection in the daemon (through pprof) and
// returns the heap it then holds.
func (d *daemonProc) liveHeap() float64 {
	d.t.Helper()
	resp := d.scrape("/debug/pprof/heap?gc=1")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return d.metric("go_memstats_heap_alloc_bytes")
}
