package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// recorder is a Watcher's handler (client.SyncedHandler too) that keeps
// what it saw.
type recorder struct {
	mu      sync.Mutex        // guards the fields below
	objects map[string]string // key -> resourceVersion
	events  []string
	// handed keeps every object handed to the handler with a deep copy
	// taken then: the library must never modify them afterwards.
	handed  [][2]*unstructured.Unstructured
	synced  chan struct{}
	changed chan struct{} // closed and replaced on every event
}

func newRecorder() *recorder {
	return &recorder{objects: map[string]string{}, synced: make(chan struct{}), changed: make(chan struct{})}
}

func (r *recorder) record(ev string, obj *unstructured.Unstructured, del bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := obj.GetNamespace() + "/" + obj.GetName()
	if del {
		delete(r.objects, k)
	} else {
		r.objects[k] = obj.GetResourceVersion()
	}
	r.events = append(r.events, ev+" "+k)
	r.handed = append(r.handed, [2]*unstructured.Unstructured{obj, obj.DeepCopy()})
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) OnAdd(obj any, _ bool) { r.record("ADD", obj.(*unstructured.Unstructured), false) }
func (r *recorder) OnUpdate(_, obj any)   { r.record("UPDATE", obj.(*unstructured.Unstructured), false) }
func (r *recorder) OnDelete(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	r.record("DELETE", obj.(*unstructured.Unstructured), true)
}
func (r *recorder) OnSynced() { close(r.synced) }
func (r *recorder) snapshot() (map[string]string, []string, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.objects), slices.Clone(r.events), r.changed
}

// checkUnmutated fails the test if any object handed to the handler was
// modified afterwards (the mutation detector).
func (r *recorder) checkUnmutated(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.handed {
		if !reflect.DeepEqual(h[0].Object, h[1].Object) {
			t.Fatalf("an object handed to the handler was modified afterwards:\nhanded: %v\nnow:    %v", h[1].Object, h[0].Object)
		}
	}
}

// waitFor waits until the recorder's objects satisfy cond.
func (r *recorder) waitFor(ctx context.Context, t *testing.T, what string, cond func(map[string]string) bool) {
	t.Helper()
	for {
		objs, evs, changed := r.snapshot()
		if cond(objs) {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("%s: never happened; objects %v, events %v", what, objs, evs)
		}
	}
}

// runWatcher runs a client Watcher until the test ends.
func runWatcher(t *testing.T, c *client.Client, opts client.WatchOptions, h toolscache.ResourceEventHandler) *client.Watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := client.NewWatcher(c, opts, h, client.WatcherOptions{
		Backoff: client.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		OnError: func(err error) { t.Logf("watcher %s reconnects after: %v", opts.ClientName, err) },
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watcher %s: %v", opts.ClientName, err)
		}
	})
	return w
}

// listState is the API server's view: key -> resourceVersion.
func listState(ctx context.Context, t *testing.T, gvr schema.GroupVersionResource, ns string) map[string]string {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, o := range l.Items {
		out[o.GetNamespace()+"/"+o.GetName()] = o.GetResourceVersion()
	}
	return out
}

func createConfigMap(ctx context.Context, t *testing.T, ns, name string, data map[string]string) *corev1.ConfigMap {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	cm, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// waitCaughtUp waits until the daemon's only Source has seen rv.
func waitCaughtUp(ctx context.Context, t *testing.T, d *testDaemon, rv string) {
	t.Helper()
	want, _ := strconv.ParseUint(rv, 10, 64)
	eventually(ctx, t, "daemon caught up with resourceVersion "+rv, func() bool {
		src := d.mgr.Sources()
		if len(src) != 1 {
			return false
		}
		got, _ := strconv.ParseUint(src[0].ResourceVersion, 10, 64)
		return got >= want
	})
}

// TestOneUpstreamWatchForManyClients: N clients of one resource cost the
// API server one watch per namespace they ask for under the default
// (automatic) scope, per the API server's own metrics; once one asks for
// every namespace, one cluster-wide watch serves them all, and the
// namespaced clients move to it without a RESET, a reconnect, or an event
// lost or twice.
func TestOneUpstreamWatchForManyClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gadgets := schema.GroupVersionResource{Group: "fanout.informerd.dev", Version: "v1", Resource: "gadgets"}
	createCRD(ctx, t, dyn, gadgets, "Gadget")
	nss := []string{createNamespace(ctx, t, "fan-a"), createNamespace(ctx, t, "fan-b"), createNamespace(ctx, t, "fan-c")}
	before := upstreamWatches(t, gadgets)
	create := func(name string) {
		t.Helper()
		for _, ns := range nss {
			o := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "fanout.informerd.dev/v1", "kind": "Gadget",
				"metadata": map[string]any{"name": name, "namespace": ns},
			}}
			if _, err := dyn.Resource(gadgets).Namespace(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	create("g1")

	reg := prometheus.NewRegistry()
	// The namespaces' informers stop 2 s after their subscribers moved.
	d := startDaemon(t, cache.Options{LingerTTL: 2 * time.Second, Registerer: reg})
	var recs []*recorder
	var nsOf []string
	start := func(name, ns string) {
		r := newRecorder()
		recs, nsOf = append(recs, r), append(nsOf, ns)
		runWatcher(t, d.dial(t, reads(gadgets, ns)), client.WatchOptions{Resource: gadgets, Namespace: ns, ClientName: name}, r)
		select {
		case <-r.synced:
		case <-ctx.Done():
			t.Fatalf("client %s never synced", name)
		}
	}
	for i := range 10 {
		start(fmt.Sprintf("same-ns-%d", i), nss[0])
	}
	eventually(ctx, t, "one upstream watch for 10 clients in one namespace", func() bool {
		return upstreamWatches(t, gadgets) == before+1
	})
	for i := range 10 {
		start(fmt.Sprintf("spread-%d", i), nss[i%3])
	}
	eventually(ctx, t, "one upstream watch per namespace for 20 clients in 3 namespaces", func() bool {
		return upstreamWatches(t, gadgets) == before+3
	})

	start("cluster-wide", "")
	// A subscriber moves once its namespace's informer has passed the
	// cluster-wide one's list: at its next event or bookmark, which the API
	// server sends about once a minute.
	poll(ctx, t, 2*time.Minute, "every namespaced client moved to the cluster-wide informer", func() bool {
		return counterValue(reg, "informerd_subscriber_moves_total", "") == 20
	})
	eventually(ctx, t, "one upstream watch once the namespaces' informers stopped", func() bool {
		return upstreamWatches(t, gadgets) == before+1
	})
	create("g2")

	// Every client sees what it asked for, and only that, each change once.
	for i, r := range recs {
		want := []string{}
		for _, ns := range nss {
			if nsOf[i] == "" || nsOf[i] == ns {
				want = append(want, "ADD "+ns+"/g1")
			}
		}
		for _, ns := range nss {
			if nsOf[i] == "" || nsOf[i] == ns {
				want = append(want, "ADD "+ns+"/g2")
			}
		}
		r.waitFor(ctx, t, "the client sees its namespaces' two gadgets", func(m map[string]string) bool { return len(m) == len(want) })
		r.mu.Lock()
		got := slices.Clone(r.events)
		r.mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("client %d of namespace %q saw %q, want %q", i, nsOf[i], got, want)
		}
	}

	// Introspection tells the same story: one informer, 21 subscribers
	// and the scope's own hold.
	resp, err := d.dial(t, introspects).API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	infs := resp.GetInformers()
	if len(infs) != 1 || infs[0].GetRefCount() != 22 || infs[0].GetState() != "synced" || infs[0].GetNamespace() != "" ||
		infs[0].GetObjects() != 6 || !slices.Contains(infs[0].GetHolders(), "cluster-wide") || !slices.Contains(infs[0].GetHolders(), "same-ns-0") {
		t.Fatalf("ListInformers = %v, want one synced cluster-wide informer of 6 objects held 22 times", infs)
	}
}

// TestListerWatcherMatchesDirectInformer: a client-go informer over the
// client's ListerWatcher ends with the same store as a direct informer,
// including a delete that happens while the daemon side is disconnected.
func TestListerWatcherMatchesDirectInformer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "lw")
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	for i := range 5 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), map[string]string{"v": "0"})
	}
	socket := filepath.Join(t.TempDir(), "informerd.sock")
	d := startDaemonAt(t, socket, cache.Options{})

	lw := client.NewListerWatcher(d.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "lw"})
	shared := toolscache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, toolscache.Indexers{})
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dynamic.NewForConfigOrDie(env.RESTConfig()), 0, ns, nil)
	direct := factory.ForResource(configMaps).Informer()

	ictx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); factory.Shutdown(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); shared.RunWithContext(ictx) }()
	factory.Start(ictx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), shared.HasSynced, direct.HasSynced) {
		t.Fatal("informers never synced")
	}

	cms := admin.CoreV1().ConfigMaps(ns)
	for i := range 5 {
		cm, err := cms.Get(ctx, fmt.Sprintf("cm%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["v"] = "1"
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cms.Delete(ctx, "cm0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createConfigMap(ctx, t, ns, "late", nil)

	// Stop the daemon (the reflector's watch ends), delete while nothing
	// serves the socket, then start a new daemon on the same socket: the
	// reflector re-watches, is told its position is gone, and relists.
	d.stop()
	if err := cms.Delete(ctx, "cm1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	startDaemonAt(t, socket, cache.Options{})

	storeState := func(s toolscache.Store) map[string]string {
		out := map[string]string{}
		for _, o := range s.List() {
			u := o.(*unstructured.Unstructured)
			out[u.GetNamespace()+"/"+u.GetName()] = u.GetResourceVersion()
		}
		return out
	}
	want := listState(ctx, t, configMaps, ns)
	ok := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return maps.Equal(storeState(shared.GetStore()), want) && maps.Equal(storeState(direct.GetStore()), want), nil
	})
	if ok != nil {
		t.Fatalf("informers did not converge on the API server's state %v:\nvia informerd: %v\ndirect:        %v",
			want, storeState(shared.GetStore()), storeState(direct.GetStore()))
	}
}

// TestResume: a client that reconnects inside the log window continues
// without a snapshot; outside it gets a RESET whose snapshot its store
// turns into the net changes only.
func TestResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	for _, tc := range []struct {
		name      string
		limits    cache.LogLimits
		wantReset bool
	}{
		{name: "inside the window", limits: cache.LogLimits{}},
		{name: "tiny window", limits: cache.LogLimits{MaxEvents: 1, MinAge: -1, MaxTombstones: 1}, wantReset: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := createNamespace(ctx, t, "resume")
			cms := admin.CoreV1().ConfigMaps(ns)
			for i := range 4 {
				createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), nil)
			}
			// Namespace scope: other tests' churn stays out of this log.
			d := startDaemon(t, cache.Options{Log: tc.limits, Scope: cache.ScopeNamespace})
			c := d.dial(t, reads(configMaps, ns))
			opts := client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "resumer"}
			s, err := c.Stream(ctx, opts, "")
			if err != nil {
				t.Fatal(err)
			}
			resume := ""
			for resume == "" {
				evs, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range evs {
					if ev.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED {
						resume = ev.GetResourceVersion()
					}
				}
			}
			s.Close()

			// While disconnected: update one, delete two, create one, and
			// churn another many times (net: one update): 9 changes.
			cm, _ := cms.Get(ctx, "cm0", metav1.GetOptions{})
			cm.Data = map[string]string{"x": "1"}
			if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"cm1", "cm3"} {
				if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			createConfigMap(ctx, t, ns, "cm-new-"+strings.ReplaceAll(tc.name, " ", "-"), nil)
			var last *corev1.ConfigMap
			for i := range 5 {
				cm, _ := cms.Get(ctx, "cm2", metav1.GetOptions{})
				cm.Data = map[string]string{"i": fmt.Sprint(i)}
				if last, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// Wait until the daemon has seen the last write.
			waitCaughtUp(ctx, t, d, last.ResourceVersion)

			s, err = c.Stream(ctx, opts, resume)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// Inside the window: exactly the 9 changes, no snapshot. Outside
			// (two deletions push the one-tombstone horizon past the resume
			// point): RESET, the snapshot, SYNCED.
			var types []string
			for !slices.Contains(types, "SYNCED") && len(types) < 9 {
				evs, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range evs {
					if ev.GetType() != informerdv1.EventType_EVENT_TYPE_BOOKMARK {
						types = append(types, strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_"))
					}
				}
			}
			if !tc.wantReset && (len(types) != 9 || types[0] != "MODIFIED") {
				t.Fatalf("resumed stream = %v, want the 9 changes only", types)
			}
			gotReset := len(types) > 0 && types[0] == "RESET"
			if gotReset != tc.wantReset {
				t.Fatalf("resumed stream began %v; want RESET: %v", types, tc.wantReset)
			}
		})
	}
}

// TestResetGivesHandlersOnlyNetChanges: a Watcher whose stream is RESET
// hands its handler the net changes, not a storm of the whole snapshot.
func TestResetGivesHandlersOnlyNetChanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "netchange")
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	for i := range 20 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), nil)
	}
	// A daemon with a one-event log: any reconnect after two changes is a RESET.
	// Namespace scope: other tests' churn stays out of this log.
	d1 := startDaemon(t, cache.Options{Scope: cache.ScopeNamespace, Log: cache.LogLimits{MaxEvents: 1, MinAge: -1, MaxTombstones: 1}})
	r := newRecorder()
	c := d1.dial(t, reads(configMaps, ns))
	ctxW, stopW := context.WithCancel(ctx)
	w := client.NewWatcher(c, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "net"}, r, client.WatcherOptions{Backoff: client.Backoff{Initial: 10 * time.Millisecond}})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctxW) }()
	<-r.synced
	_, before, _ := r.snapshot()

	// Stop the watcher, change three objects, start it again.
	stopW()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "cm0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "cm1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := createConfigMap(ctx, t, ns, "fresh", nil)
	want := listState(ctx, t, configMaps, ns)
	waitCaughtUp(ctx, t, d1, fresh.ResourceVersion)
	ctxW, stopW = context.WithCancel(ctx)
	defer stopW()
	go func() { done <- w.Run(ctxW) }()
	r.waitFor(ctx, t, "store equals the API server", func(m map[string]string) bool { return maps.Equal(m, want) })
	stopW()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, after, _ := r.snapshot()
	net := after[len(before):]
	slices.Sort(net)
	wantNet := []string{"ADD " + ns + "/fresh", "DELETE " + ns + "/cm0", "DELETE " + ns + "/cm1"}
	if !slices.Equal(net, wantNet) {
		t.Fatalf("handler saw %v after the reconnect, want only %v", net, wantNet)
	}
	if n := w.Resets(); n != 1 {
		t.Fatalf("watcher saw %d RESETs, want 1", n)
	}
}

// TestLingerAndRefCount: the Source outlives its last client by the linger
// TTL, a client inside the TTL causes no new LIST, and after the TTL the
// Source stops (introspection and the API server agree).
func TestLingerAndRefCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gvr := schema.GroupVersionResource{Group: "linger.informerd.dev", Version: "v1", Resource: "lingerers"}
	createCRD(ctx, t, dyn, gvr, "Lingerer")
	ns := createNamespace(ctx, t, "linger")
	const ttl = 3 * time.Second
	// Cluster scope and LIST: the daemon's LIST is the only cluster-wide
	// one (kube-controller-manager lists the namespaces it deletes).
	d := startDaemon(t, cache.Options{LingerTTL: ttl, DisableWatchList: true, Scope: cache.ScopeCluster})
	c := d.dial(t, reads(gvr, ns))
	opts := client.WatchOptions{Resource: gvr, Namespace: ns, ClientName: "lingerer"}

	listsBefore := upstreamLists(ctx, t, gvr)
	subscribeOnce := func() {
		s, err := c.Stream(ctx, opts, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	subscribeOnce()
	eventually(ctx, t, "source released and lingering", func() bool {
		src := d.mgr.Sources()
		return len(src) == 1 && src[0].RefCount == 0
	})
	if got := upstreamLists(ctx, t, gvr) - listsBefore; got != 1 {
		t.Fatalf("first subscription caused %d LISTs, want 1", got)
	}
	subscribeOnce() // inside the TTL
	if got := upstreamLists(ctx, t, gvr) - listsBefore; got != 1 {
		t.Fatalf("re-subscribing inside the linger TTL caused %d LISTs in all, want still 1", got)
	}
	// The Source opens its watch after the LIST that served the snapshot:
	// the API server may count it a moment later, but within the TTL.
	eventually(ctx, t, "the API server holds the lingering Source's one watch", func() bool {
		src := d.mgr.Sources()
		return len(src) == 1 && src[0].RefCount == 0 && upstreamWatches(t, gvr) == 1
	})
	eventually(ctx, t, "source stopped after the TTL", func() bool { return len(d.mgr.Sources()) == 0 })
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return upstreamWatches(t, gvr) == 0, nil
	})
	if err != nil {
		var lines []string
		for _, l := range strings.Split(scrapeAPIServer(ctx, t).text, "\n") {
			if strings.Contains(l, gvr.Resource) && strings.Contains(l, "longrunning") {
				lines = append(lines, l)
			}
		}
		t.Fatalf("API server still holds a watch after the Source stopped: %v", lines)
	}
}

// TestCRDLifecycle: a subscription made before its CRD exists waits and
// then streams; deleting the CRD ends the stream with NOT_FOUND.
func TestCRDLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gvr := schema.GroupVersionResource{Group: "late.informerd.dev", Version: "v1", Resource: "sprockets"}
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(gvr, ""))

	// Without waiting, an unknown resource is NOT_FOUND at once.
	s, err := c.Stream(ctx, client.WatchOptions{Resource: gvr}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "sprockets.late.informerd.dev") {
		t.Fatalf("unknown resource: got %v, want NotFound naming sprockets.late.informerd.dev", err)
	}

	r := newRecorder()
	w := client.NewWatcher(c, client.WatchOptions{Resource: gvr, WaitForResource: true, ClientName: "early"}, r, client.WatcherOptions{})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	createCRD(ctx, t, dyn, gvr, "Sprocket")
	ns := createNamespace(ctx, t, "late")
	o := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "late.informerd.dev/v1", "kind": "Sprocket", "metadata": map[string]any{"name": "s1", "namespace": ns},
	}}
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(ctx, t, "event after the CRD appeared", func(m map[string]string) bool { return m[ns+"/s1"] != "" })

	// A second stream that holds the Source and is never read: the
	// Source outlives its CRD while it is held.
	holder, err := c.Stream(ctx, client.WatchOptions{Resource: gvr, ClientName: "holder"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.Recv(); err != nil {
		t.Fatal(err)
	}

	if err := dyn.Resource(crdGVR).Delete(ctx, gvr.Resource+"."+gvr.Group, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if status.Code(err) != codes.NotFound {
			t.Fatalf("after the CRD was deleted the watch ended with %v, want NotFound", err)
		}
		t.Logf("terminal notice: %v", err)
	case <-ctx.Done():
		t.Fatal("the watch did not end after its CRD was deleted")
	}

	// The CRD comes back: a new subscription gets a new Source, although
	// the holder still holds the dead one.
	crdName := gvr.Resource + "." + gvr.Group
	eventually(ctx, t, "CRD gone", func() bool {
		_, err := dyn.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	createCRD(ctx, t, dyn, gvr, "Sprocket")
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	again := newRecorder()
	runWatcher(t, c, client.WatchOptions{Resource: gvr, WaitForResource: true, ClientName: "again"}, again)
	again.waitFor(ctx, t, "events after the CRD came back", func(m map[string]string) bool { return m[ns+"/s1"] != "" })
}

// TestBadRequests: each bad request gets its code and a message naming the
// problem, and another client's stream is unaffected.
func TestBadRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "bad")
	d := startDaemon(t, cache.Options{})
	good := newRecorder()
	runWatcher(t, d.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "bystander"}, good)
	<-good.synced

	c := d.dial(t, reads(configMaps, ""))
	tests := []struct {
		name     string
		opts     client.WatchOptions
		resume   string
		code     codes.Code
		contains string
	}{
		{"unknown resource", client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: "pineapples"}}, "", codes.NotFound, "pineapples"},
		{"malformed label selector", client.WatchOptions{Resource: configMaps, LabelSelector: "app in (a"}, "", codes.InvalidArgument, "label_selector"},
		{"malformed field selector", client.WatchOptions{Resource: configMaps, FieldSelector: "metadata.name=a=b=c"}, "", codes.InvalidArgument, "field_selector"},
		{"overlong resourceVersion", client.WatchOptions{Resource: configMaps}, strings.Repeat("9", 300), codes.InvalidArgument, "resume_resource_version"},
		{"missing resource", client.WatchOptions{}, "", codes.InvalidArgument, "resource"},
		{"bad namespace", client.WatchOptions{Resource: configMaps, Namespace: "Not_A_Namespace"}, "", codes.InvalidArgument, "namespace"},
		{"kind and resource", client.WatchOptions{Resource: configMaps, Kind: "ConfigMap"}, "", codes.InvalidArgument, "both set"},
		{"unknown kind", client.WatchOptions{Kind: "Pineapple"}, "", codes.NotFound, "Pineapple"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := c.Stream(ctx, tt.opts, tt.resume)
			if err == nil {
				_, err = s.Recv()
				s.Close()
			}
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.contains) {
				t.Fatalf("got %v, want %s mentioning %q", err, tt.code, tt.contains)
			}
		})
	}
	createConfigMap(ctx, t, ns, "after-bad-requests", nil)
	good.waitFor(ctx, t, "bystander still streams", func(m map[string]string) bool { return m[ns+"/after-bad-requests"] != "" })
}

// TestUpstreamUnavailable: a request whose Source cannot list gets
// UNAVAILABLE with the upstream cause, here a daemon identity that may not
// list ConfigMaps.
func TestUpstreamUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "unavail")
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	token, err := controlplane.ServiceAccountToken(ctx, admin, ns, "powerless")
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cache.Options{Config: env.TokenConfig(token)})
	s, err := d.dial(t, reads(configMaps, ns)).Stream(ctx, client.WatchOptions{Resource: configMaps, Namespace: ns}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Recv()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("got %v, want Unavailable with the upstream cause (forbidden)", err)
	}
}

// TestNamespaceScopeStrategy: under the namespace strategy each namespace
// costs a watch, until a cluster-wide Source runs: it then serves new
// namespaced requests by filtering.
func TestNamespaceScopeStrategy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gvr := schema.GroupVersionResource{Group: "scope.informerd.dev", Version: "v1", Resource: "scopers"}
	createCRD(ctx, t, dyn, gvr, "Scoper")
	nss := []string{createNamespace(ctx, t, "scope-a"), createNamespace(ctx, t, "scope-b"), createNamespace(ctx, t, "scope-c")}
	d := startDaemon(t, cache.Options{Scope: cache.ScopeNamespace})
	start := func(ns string) {
		r := newRecorder()
		runWatcher(t, d.dial(t, reads(gvr, ns)), client.WatchOptions{Resource: gvr, Namespace: ns, ClientName: "scoped-" + ns}, r)
		<-r.synced
	}
	start(nss[0])
	start(nss[1])
	eventually(ctx, t, "one watch per namespace", func() bool { return upstreamWatches(t, gvr) == 2 })
	start("")
	eventually(ctx, t, "plus a cluster-wide watch", func() bool { return upstreamWatches(t, gvr) == 3 })
	start(nss[2])
	if got := upstreamWatches(t, gvr); got != 3 {
		t.Fatalf("a new namespace caused a watch of its own (%d) although a cluster-wide one runs", got)
	}
	if n := len(d.mgr.Sources()); n != 3 {
		t.Fatalf("daemon runs %d sources, want 3", n)
	}
}
