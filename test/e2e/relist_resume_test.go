package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/internal/resumetest"
)

// TestResumeInsideARealRelistDifference (issue 28): objects are modified,
// deleted and created again while the daemon cannot reach the API server,
// which then restarts; the daemon's watch from its old position is
// answered 410 Gone by the fresh watch cache, and it relists and publishes
// the difference. Clients broken right after each event of that
// difference, each by the rule it resumes with (client.Watcher from the
// last event position, the client-go adapters from the last object's
// resourceVersion, client-go's reflector watching again from it), end
// with the API server's state, without a relist or a RESET of theirs.
func TestResumeInsideARealRelistDifference(t *testing.T) {
	if !env.Owned() {
		t.Skip("needs a control plane this test binary started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "reldiff")
	for _, name := range []string{"keep", "mod1", "mod2", "del1", "del2", "again"} {
		createConfigMap(ctx, t, ns, name, nil)
	}
	u, err := url.Parse(env.APIServerURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFaultProxy(t, u.Host)
	cfg := env.RESTConfig()
	cfg.Host = "https://" + proxy.addr()
	reg := prometheus.NewRegistry()
	d := startDaemon(t, cache.Options{Config: cfg, Scope: cache.ScopeNamespace, UpstreamTimeout: 3 * time.Second, Registerer: reg})
	token := client.WithToken(identity(t, reads(configMaps, ns)))
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns}

	// The difference: DELETED del1, del2, again; MODIFIED mod1, mod2;
	// ADDED again (another uid), new.
	const diffObjects = 7
	type clientUnderTest struct {
		name   string
		store  func() []any
		synced func() bool
		sawEnd chan struct{} // the marker object after the difference
		broke  func() bool
		lists  func() int   // an informer's requests for an initial state
		resets func() int64 // a Watcher's RESETs
	}
	var clients []*clientUnderTest
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	onEnd := func(c *clientUnderTest) func(any) {
		return func(obj any) {
			if u, ok := obj.(*unstructured.Unstructured); ok && u.GetName() == "end" {
				select {
				case c.sawEnd <- struct{}{}:
				default:
				}
			}
		}
	}
	for k := 1; k <= diffObjects; k++ {
		b := &resumetest.Breaker{K: k}
		c := &clientUnderTest{name: fmt.Sprintf("Watcher broken after event %d", k), sawEnd: make(chan struct{}, 1), broke: b.Broke}
		w := client.NewWatcher(dialWith(t, d.socket, token, b.DialOption()), opts,
			toolscache.ResourceEventHandlerFuncs{AddFunc: onEnd(c)}, client.WatcherOptions{})
		c.store, c.synced, c.resets = w.Indexer().List, w.HasSynced, w.Resets
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(runCtx) }()
		clients = append(clients, c)

		for _, reflector := range []bool{false, true} {
			b := &resumetest.Breaker{K: k}
			dial := []grpc.DialOption{token}
			name := fmt.Sprintf("adapter's stream broken after event %d", k)
			if reflector {
				name = fmt.Sprintf("reflector's watch ended after event %d", k)
			} else {
				dial = append(dial, b.DialOption())
			}
			lw := &resumetest.BreakingLW{ListerWatcher: client.NewListerWatcher(dialWith(t, d.socket, dial...), opts)}
			if reflector {
				lw.Breaker = b
			}
			c := &clientUnderTest{name: name, sawEnd: make(chan struct{}, 1), broke: b.Broke, lists: lw.Initial}
			inf := toolscache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, toolscache.Indexers{})
			if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onEnd(c)}); err != nil {
				t.Fatal(err)
			}
			c.store, c.synced = inf.GetStore().List, inf.HasSynced
			wg.Add(1)
			go func() { defer wg.Done(); inf.RunWithContext(runCtx) }()
			clients = append(clients, c)
		}
	}
	for _, c := range clients {
		if !toolscache.WaitForCacheSync(ctx.Done(), c.synced) {
			t.Fatalf("%s never synced", c.name)
		}
	}

	// Cut off, the daemon misses the changes; the restarted API server's
	// watch cache starts after them.
	proxy.Hang()
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	for _, name := range []string{"mod1", "mod2"} {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data = map[string]string{"changed": "while cut off"}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"del1", "del2", "again"} {
		if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createConfigMap(ctx, t, ns, "again", nil)
	createConfigMap(ctx, t, ns, "new", nil)
	env.StopAPIServer()
	startAPIServer(ctx, t)
	proxy.Resume()
	// The marker every client waits for: in the difference (last, it is
	// the newest) or after it, depending on when the daemon relists.
	createConfigMap(ctx, t, ns, "end", nil)

	want := stateWithUIDs(ctx, t, ns)
	for _, c := range clients {
		select {
		case <-c.sawEnd:
		case <-ctx.Done():
			t.Fatalf("%s never received the object after the difference; it holds %v", c.name, holdingsWithUIDs(c.store()))
		}
		if got := holdingsWithUIDs(c.store()); !maps.Equal(got, want) {
			t.Errorf("%s holds %v, want the API server's %v", c.name, got, want)
		}
		if !c.broke() {
			t.Errorf("%s: the break did not happen", c.name)
		}
		if c.lists != nil && c.lists() != 1 {
			t.Errorf("%s asked for an initial state %d times, want once (no relist)", c.name, c.lists())
		}
		if c.resets != nil && c.resets() != 0 {
			t.Errorf("%s had %d RESETs, want none", c.name, c.resets())
		}
	}
	if n := gauge(t, reg, "informerd_upstream_relists_total"); n < 1 {
		t.Errorf("the daemon did not relist (%v relists): no difference was tested", n)
	}
}

// stateWithUIDs returns the ConfigMaps of ns from the API server as name
// -> uid@resourceVersion.
func stateWithUIDs(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	l, err := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, cm := range l.Items {
		out[cm.Name] = string(cm.UID) + "@" + cm.ResourceVersion
	}
	return out
}

// holdingsWithUIDs renders a client's store as stateWithUIDs does.
func holdingsWithUIDs(objs []any) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		out[u.GetName()] = string(u.GetUID()) + "@" + u.GetResourceVersion()
	}
	return out
}
