package e2e

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// startAPIServer restarts the kube-apiserver that StopAPIServer stopped,
// then the components that watch it, and waits until they work with it
// again (a new namespace gets its kube-root-ca.crt from
// kube-controller-manager), so that later tests start from a healthy
// control plane.
func startAPIServer(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := env.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := env.RestartWatchers(ctx); err != nil {
		t.Fatal(err)
	}
	createNamespace(ctx, t, "recovered")
}

// startWatchers runs n Watchers of ConfigMaps in ns against socket and
// waits until each has synced.
func startWatchers(ctx context.Context, t *testing.T, socket, ns string, n int) ([]*recorder, []*client.Watcher) {
	t.Helper()
	recs := make([]*recorder, n)
	ws := make([]*client.Watcher, n)
	for i := range n {
		c := dialSocket(t, socket, reads(configMaps, ns))
		recs[i] = newRecorder()
		ws[i] = runWatcher(t, c, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: fmt.Sprintf("w%d", i)}, recs[i])
	}
	for _, r := range recs {
		select {
		case <-r.synced:
		case <-ctx.Done():
			t.Fatal("a watcher never synced")
		}
	}
	return recs, ws
}

// expectNoResets fails the test if any watcher received a RESET: the fault
// (named by why) must not reach clients as one.
func expectNoResets(t *testing.T, ws []*client.Watcher, why string) {
	t.Helper()
	for i, w := range ws {
		if n := w.Resets(); n != 0 {
			t.Errorf("watcher %d saw %d RESETs after %s: an upstream fault must not reach clients as a RESET", i, n, why)
		}
	}
}

// converge waits until every recorder holds exactly want, the API
// server's state (same objects, same resourceVersions).
func converge(ctx context.Context, t *testing.T, want map[string]string, recs []*recorder) {
	t.Helper()
	for i, r := range recs {
		r.waitFor(ctx, t, fmt.Sprintf("watcher %d converges on the API server's state", i), func(m map[string]string) bool {
			return maps.Equal(m, want)
		})
		r.checkUnmutated(t)
	}
}

// TestAPIServerRestart: kube-apiserver restarts while clients stream and
// objects change. The daemon re-establishes its watch (relisting and
// diffing if its position is gone); clients see no RESET and converge.
func TestAPIServerRestart(t *testing.T) {
	if !env.Owned() {
		t.Skip("needs a control plane this test binary started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "apirestart")
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	for i := range 10 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), nil)
	}
	reg := prometheus.NewRegistry()
	d := startDaemon(t, cache.Options{Scope: cache.ScopeNamespace, Registerer: reg})
	recs, ws := startWatchers(ctx, t, d.socket, ns, 5)

	env.StopAPIServer()
	startAPIServer(ctx, t)
	for i := range 5 {
		cm, err := cms.Get(ctx, fmt.Sprintf("cm%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data = map[string]string{"after": "restart"}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cms.Delete(ctx, "cm9", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createConfigMap(ctx, t, ns, "born-after-restart", nil)
	converge(ctx, t, listState(ctx, t, configMaps, ns), recs)
	// A fresh API server's watch cache starts past the daemon's position:
	// the daemon got 410 Gone and relisted, and published the difference.
	if n := gauge(t, reg, "informerd_upstream_relists_total"); n < 1 {
		t.Errorf("the daemon did not relist after the API server restarted (%v relists)", n)
	}
	for i, r := range recs {
		_, evs, _ := r.snapshot()
		// 10 (+kube-root-ca.crt) initial adds, then 5 updates, 1 delete, 1 add.
		if got := len(evs) - 11; got != 7 {
			t.Errorf("watcher %d saw %d changes after its snapshot, want the 7 real ones: %v", i, got, evs[11:])
		}
	}
	expectNoResets(t, ws, "an API server restart")
}

// TestDaemonRestartWithManyClients: the daemon restarts gracefully under
// 50 clients; see restartUnderClients.
func TestDaemonRestartWithManyClients(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "informerd.sock")
	// Cluster scope and LIST: the daemon's LIST is the only cluster-wide one.
	opts := cache.Options{Scope: cache.ScopeCluster, DisableWatchList: true}
	d := startDaemonAt(t, socket, opts)
	restartUnderClients(t, socket, d.stop, func() { startDaemonAt(t, socket, opts) })
}

// restartUnderClients runs 50 clients of a daemon on socket, stops the
// daemon, changes objects, starts it again, and checks that the clients
// reconnect and converge, that their handlers see only the real changes
// (the snapshot they get is diffed against their stores), and that the API
// server sees one LIST for the daemon's one Source, not one per client.
func restartUnderClients(t *testing.T, socket string, stop, start func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "restart")
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	for i := range 5 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), nil)
	}
	recs, _ := startWatchers(ctx, t, socket, ns, 50)

	stop()
	if err := cms.Delete(ctx, "cm0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createConfigMap(ctx, t, ns, "while-down", nil)
	want := listState(ctx, t, configMaps, ns)
	listsBefore := upstreamLists(ctx, t, configMaps)
	start()
	converge(ctx, t, want, recs)
	lists := upstreamLists(ctx, t, configMaps) - listsBefore
	t.Logf("after the restart, 50 clients cost the API server %d LIST(s)", lists)
	if lists != 1 {
		t.Errorf("50 clients reconnecting caused %d LISTs of configmaps, want 1", lists)
	}
	for i, r := range recs {
		_, evs, _ := r.snapshot()
		// 5 objects + kube-root-ca.crt, then the two changes.
		if after := evs[6:]; len(after) != 2 {
			t.Errorf("watcher %d saw %v after the restart, want only the deletion of cm0 and the new object", i, after)
		}
	}
}

// TestAPIServerDown: while kube-apiserver is down the daemon keeps serving
// what it has (a new client still gets a snapshot), reports the informer
// stale (introspection and metrics), backs off instead of looping, and
// recovers; clients converge without a RESET.
func TestAPIServerDown(t *testing.T) {
	if !env.Owned() {
		t.Skip("needs a control plane this test binary started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "apidown")
	for i := range 5 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), nil)
	}
	reg := prometheus.NewRegistry()
	d := startDaemon(t, cache.Options{Scope: cache.ScopeNamespace, Registerer: reg})
	recs, ws := startWatchers(ctx, t, d.socket, ns, 3)
	// A client that the daemon has authenticated and authorized before the
	// outage: its answers are cached. A new caller could not be checked
	// while the API server is away (it would get UNAVAILABLE).
	late := d.dial(t, reads(configMaps, ns))
	lateOpts := client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "during-outage"}
	readSnapshot := func() error {
		s, err := late.Stream(ctx, lateOpts, "")
		if err != nil {
			return err
		}
		defer s.Close()
		for {
			evs, err := s.Recv()
			if err != nil {
				return err
			}
			for _, ev := range evs {
				if ev.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED {
					return nil
				}
			}
		}
	}
	if err := readSnapshot(); err != nil {
		t.Fatal(err)
	}

	env.StopAPIServer()
	downAt := time.Now()
	watchesAtStop := gauge(t, reg, "informerd_upstream_watches_total")
	eventually(ctx, t, "informer marked stale", func() bool {
		src := d.mgr.Sources()
		return len(src) == 1 && src[0].State == cache.StateStale && gauge(t, reg, "informerd_sources_stale") == 1
	})
	// Still serving: a new stream gets the last known state and SYNCED.
	if err := readSnapshot(); err != nil {
		t.Fatalf("a new stream during the outage: %v", err)
	}

	// Stay down for outage (10 s, or $INFORMERD_E2E_OUTAGE), then count the
	// watch attempts: backoff from 0.8 s doubling, so a handful, not a loop.
	outage := 10 * time.Second
	if v := os.Getenv("INFORMERD_E2E_OUTAGE"); v != "" {
		var err error
		if outage, err = time.ParseDuration(v); err != nil {
			t.Fatalf("INFORMERD_E2E_OUTAGE: %v", err)
		}
	}
	hold(ctx, time.Until(downAt.Add(outage))) // the outage itself is what is tested
	attempts := gauge(t, reg, "informerd_upstream_watches_total") - watchesAtStop
	maxAttempts := 2 + math.Log2(outage.Seconds()/0.8)*2
	t.Logf("%d watch attempts during a %s outage (bound %.0f)", int(attempts), outage, maxAttempts)
	if attempts < 1 || attempts > maxAttempts {
		t.Errorf("%v watch attempts during a %s outage, want between 1 and %.0f (jittered exponential backoff)", attempts, outage, maxAttempts)
	}

	startAPIServer(ctx, t)
	createConfigMap(ctx, t, ns, "after-outage", nil)
	converge(ctx, t, listState(ctx, t, configMaps, ns), recs)
	eventually(ctx, t, "informer synced again", func() bool {
		src := d.mgr.Sources()
		return len(src) == 1 && src[0].State == cache.StateSynced && gauge(t, reg, "informerd_sources_stale") == 0
	})
	expectNoResets(t, ws, "an API server outage")
}

// gauge sums the samples of a metric in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return total
}

// TestDaemonKilled: kill -9 of the informerd process under 50 clients; a
// new process on the same socket (the stale socket file is replaced)
// serves them again; see restartUnderClients.
func TestDaemonKilled(t *testing.T) {
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"), "-scope", "cluster", "-disable-watch-list")
	restartUnderClients(t, d.socket, func() { d.signal(syscall.SIGKILL) }, d.start)
}

// TestChurningClients: clients that connect and leave in a loop, many at
// once on the same Key, while objects change: one reflector throughout,
// the ref count returns to the steady clients', the steady clients
// converge (goleak checks the goroutines at the end of the package).
func TestChurningClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "churn")
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	reg := prometheus.NewRegistry()
	d := startDaemon(t, cache.Options{Scope: cache.ScopeNamespace, Registerer: reg})
	steady, _ := startWatchers(ctx, t, d.socket, ns, 3)

	stopWrites := make(chan struct{})
	writes := make(chan error, 1)
	go func() { // ends when stopWrites closes
		for i := 0; ; i++ {
			select {
			case <-stopWrites:
				writes <- nil
				return
			default:
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i%20)}, Data: map[string]string{"i": fmt.Sprint(i)}}
			_, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
			if apierrors.IsNotFound(err) {
				_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				writes <- err
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for g := range 20 {
		c := d.dial(t, reads(configMaps, ns))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				s, err := c.Stream(ctx, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: fmt.Sprintf("churn-%d", g)}, "")
				if err != nil {
					errs <- err
					return
				}
				for synced := false; !synced; {
					evs, err := s.Recv()
					if err != nil {
						s.Close()
						errs <- err
						return
					}
					for _, ev := range evs {
						synced = synced || ev.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED
					}
				}
				s.Close()
			}
		}()
	}
	wg.Wait()
	close(stopWrites)
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(ctx, t, "ref count back to the 3 steady clients", func() bool {
		src := d.mgr.Sources()
		return len(src) == 1 && src[0].RefCount == 3
	})
	if w := gauge(t, reg, "informerd_upstream_watches_total"); w != 1 {
		t.Fatalf("200 connections opened %v upstream watches, want 1", w)
	}
	converge(ctx, t, listState(ctx, t, configMaps, ns), steady)
}
