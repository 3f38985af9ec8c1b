package address

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/informerd/informerd/cache"
)

// newTestTracker returns a Tracker over a fake cluster that serves pods
// and, if serveServers, the servers kind.
func newTestTracker(t *testing.T, serveServers bool) (*Tracker, *fakeCluster, *prometheus.Registry) {
	t.Helper()
	c := newFakeCluster()
	if serveServers {
		c.served[servers.Resource] = true
	}
	reg := prometheus.NewRegistry()
	tr, err := New(Options{Subscribe: c.subscribe, Related: []RelatedKind{servers}, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return tr, c, reg
}

// TestWatchAnswersOnceSyncedAndOnChangeOnly: the first answer waits for
// the pods and the related kind; afterwards only changes are returned, as
// the watcher's label keys see them, and a slow watcher gets the latest.
func TestWatchAnswersOnceSyncedAndOnChangeOnly(t *testing.T) {
	tr, c, reg := newTestTracker(t, true)
	w := tr.Watch(Request{Address: ap("[::ffff:10.0.0.1]:8080"), LabelKeys: []string{"app", "app"}})
	defer w.Close()
	pods, srvs := c.next(t), c.next(t)
	if pods.req.GVR != podsGVR || srvs.req.GVR != servers.Resource {
		pods, srvs = srvs, pods
	}
	if pods.req.Namespace != "" || pods.req.Protobuf || pods.req.Holder != "informerd/address" {
		t.Fatalf("pod subscription %+v, want all namespaces in JSON held by informerd/address", pods.req)
	}
	web := podOpts{name: "web", ip: "10.0.0.1", labels: map[string]string{"app": "web"}, ports: []corev1.ContainerPort{tcp("http", 8080)}}
	pods.ev.feed(t, added(podObject(t, web)), synced())
	if pending(w) {
		t.Fatal("an answer before the related kind synced")
	}
	srvs.ev.feed(t, added(serverObject(t, "ns", "s", map[string]string{"app": "web"}, "http", "opaque")), synced())
	first := next(t, w)
	if got := describe(first); got != `ns/web uid=web-uid Running ready=true match=1 claimants=1 port=http/8080/0/TCP related=ns/smap[spec.proxyProtocol:"opaque"]` {
		t.Fatalf("first answer: %s", got)
	}
	if first.Pod.Owner == nil || *first.Pod.Owner != (Owner{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs"}) || first.Pod.ServiceAccount != "sa" {
		t.Fatalf("identity: owner %+v, service account %q", first.Pod.Owner, first.Pod.ServiceAccount)
	}

	// A label the watcher does not see, and an annotation: nothing.
	web.labels = map[string]string{"app": "web", "unseen": "1"}
	pods.ev.feed(t, modified(podObject(t, web)))
	web.annotations = map[string]string{"a": "b"}
	pods.ev.feed(t, modified(podObject(t, web)))
	// Three flips before the watcher reads: it gets the latest only.
	for _, notReady := range []bool{true, false, true} {
		web.notReady = notReady
		pods.ev.feed(t, modified(podObject(t, web)))
	}
	// The feeds above are taken in order by one reader, whose previous
	// batch the owner has applied before it takes the next; one more makes
	// sure the last flip is applied.
	pods.ev.feed(t)
	if got := next(t, w); got.Pod.Ready || got.Pod.Labels["unseen"] != "1" {
		t.Fatalf("after three flips: %s", describe(got))
	}
	if pending(w) {
		t.Fatal("an answer is pending after the latest was read")
	}
	if got := metricValue(t, reg, "informerd_ip_port_updates_total"); got != 2 {
		t.Fatalf("informerd_ip_port_updates_total = %v, want 2", got)
	}
	if got := metricValue(t, reg, "informerd_ip_port_subscribers"); got != 1 {
		t.Fatalf("informerd_ip_port_subscribers = %v, want 1", got)
	}
	pods.ev.feed(t, deleted(podObject(t, web)))
	if got := describe(next(t, w)); got != "none" {
		t.Fatalf("after the pod was deleted: %s", got)
	}
}

// TestWatchSharesOneSubscription: every watch shares one pod subscription,
// opened with the first and closed with the last.
func TestWatchSharesOneSubscription(t *testing.T) {
	tr, c, reg := newTestTracker(t, false) // servers not served: no objects
	w1 := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	pods := c.next(t)
	pods.ev.feed(t, added(podObject(t, podOpts{name: "a", ip: "10.0.0.1"})), synced())
	w2 := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	w3 := tr.Watch(Request{Address: ap("10.0.0.2:80")})
	for _, w := range []*Watch{w1, w2} {
		if got := describe(next(t, w)); got != "ns/a uid=a-uid Running ready=true match=1 claimants=1" {
			t.Fatalf("answer: %s", got)
		}
	}
	if got := describe(next(t, w3)); got != "none" {
		t.Fatalf("answer: %s", got)
	}
	select {
	case s := <-c.subs:
		t.Fatalf("a second subscription %+v", s.req)
	default:
	}
	if got := metricValue(t, reg, "informerd_ip_port_subscribers"); got != 3 {
		t.Fatalf("informerd_ip_port_subscribers = %v, want 3", got)
	}
	w1.Close()
	w2.Close()
	select {
	case <-pods.ev.closed:
		t.Fatal("the pod subscription closed while a watch is open")
	default:
	}
	w3.Close()
	w3.Close()
	<-pods.ev.closed
	if got := metricValue(t, reg, "informerd_ip_port_subscribers"); got != 0 {
		t.Fatalf("informerd_ip_port_subscribers = %v, want 0", got)
	}
	// The next watch subscribes again.
	w4 := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	defer w4.Close()
	c.next(t).ev.feed(t, synced())
	if got := describe(next(t, w4)); got != "none" {
		t.Fatalf("answer after resubscribing: %s", got)
	}
}

// TestWatchResetReplacesThePods: after a Reset, the snapshot replaces the
// pods: those it lacks are gone.
func TestWatchResetReplacesThePods(t *testing.T) {
	tr, c, _ := newTestTracker(t, false)
	w := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	defer w.Close()
	pods := c.next(t)
	pods.ev.feed(t, added(podObject(t, podOpts{name: "a", ip: "10.0.0.1"})), synced())
	if got := describe(next(t, w)); !strings.HasPrefix(got, "ns/a ") {
		t.Fatalf("answer: %s", got)
	}
	pods.ev.feed(t, &cache.Event{Type: cache.Reset}, added(podObject(t, podOpts{name: "b", ip: "10.0.0.2"})))
	if pending(w) {
		t.Fatal("an answer before the snapshot ended")
	}
	pods.ev.feed(t, synced())
	if got := describe(next(t, w)); got != "none" {
		t.Fatalf("after the reset: %s", got)
	}
}

// TestWatchFailure: a pod subscription that cannot start, or that ends,
// fails the watches with the cause; the next watch starts afresh.
func TestWatchFailure(t *testing.T) {
	tr, c, _ := newTestTracker(t, false)
	c.podsFail = cache.ErrNotSynced
	w := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	if _, err := w.Next(context.Background()); !errors.Is(err, cache.ErrNotSynced) {
		t.Fatalf("Next = %v, want ErrNotSynced", err)
	}
	c.mu.Lock()
	c.podsFail = nil
	c.mu.Unlock()
	w2 := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	defer w2.Close()
	w.Close()
	pods := c.next(t)
	pods.ev.feed(t, synced())
	if got := describe(next(t, w2)); got != "none" {
		t.Fatalf("answer: %s", got)
	}
	pods.ev.end <- cache.ErrStopped
	if _, err := w2.Next(context.Background()); !errors.Is(err, cache.ErrStopped) || !strings.Contains(err.Error(), "pods") {
		t.Fatalf("Next = %v, want ErrStopped naming pods", err)
	}
}

// TestRelatedKindRemoved: a related kind whose resource is removed has no
// objects any more; the answers lose them.
func TestRelatedKindRemoved(t *testing.T) {
	tr, c, _ := newTestTracker(t, true)
	w := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	defer w.Close()
	a, b := c.next(t), c.next(t)
	pods, srvs := a, b
	if a.req.GVR != podsGVR {
		pods, srvs = b, a
	}
	pods.ev.feed(t, added(podObject(t, podOpts{name: "a", ip: "10.0.0.1", labels: map[string]string{"app": "web"}})), synced())
	srvs.ev.feed(t, added(serverObject(t, "ns", "s", map[string]string{"app": "web"}, nil, "opaque")), synced())
	if got := next(t, w); len(got.Related) != 1 {
		t.Fatalf("answer: %s", describe(got))
	}
	c.mu.Lock()
	delete(c.served, servers.Resource)
	c.mu.Unlock()
	srvs.ev.end <- cache.ErrResourceRemoved
	if got := next(t, w); len(got.Related) != 0 {
		t.Fatalf("answer after the kind was removed: %s", describe(got))
	}
}

func TestNewRejectsBadRelatedKinds(t *testing.T) {
	c := newFakeCluster()
	bad := []RelatedKind{
		{Resource: servers.Resource},
		{Resource: servers.Resource, SelectorPath: "spec..podSelector"},
		{SelectorPath: "spec.podSelector"},
	}
	for _, k := range bad {
		if _, err := New(Options{Subscribe: c.subscribe, Related: []RelatedKind{k}}); err == nil {
			t.Errorf("New accepted %+v", k)
		}
	}
	if _, err := New(Options{Subscribe: c.subscribe, Related: []RelatedKind{servers, servers}}); err == nil {
		t.Error("New accepted a kind twice")
	}
}

// metricValue reads a registered gauge or counter.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if len(m.GetLabel()) > 0 {
				t.Fatalf("%s has labels %v", name, m.GetLabel())
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// TestRelatedKindUnavailable: a related kind that cannot be read (here
// the daemon may not list it) fails nothing: every address is answered
// without its objects, naming it Unavailable with the cause; once a retry
// reads it, answers gain its objects. A kind that fails after it was read
// loses its objects the same way.
func TestRelatedKindUnavailable(t *testing.T) {
	tr, c, _ := newTestTracker(t, true)
	forbidden := fmt.Errorf("%w: servers: servers.policy.test is forbidden: cannot list", cache.ErrNotSynced)
	c.setFail(servers.Resource, forbidden)
	w := tr.Watch(Request{Address: ap("10.0.0.1:8080")})
	defer w.Close()
	bystander := tr.Watch(Request{Address: ap("10.0.0.2:8080")})
	defer bystander.Close()
	pods := c.next(t)
	web := podOpts{name: "web", ip: "10.0.0.1", labels: map[string]string{"app": "web"}, ports: []corev1.ContainerPort{tcp("http", 8080)}}
	pods.ev.feed(t, added(podObject(t, web)), added(podObject(t, podOpts{name: "b", ip: "10.0.0.2"})), synced())
	const pod = "ns/web uid=web-uid Running ready=true match=1 claimants=1 port=http/8080/0/TCP"
	a := next(t, w)
	if got := describe(a); got != pod+" unavailable=servers" {
		t.Fatalf("answer while servers cannot be read: %s", got)
	}
	if a.Unavailable[0].Resource != servers.Resource || !strings.Contains(a.Unavailable[0].Reason, "forbidden") {
		t.Fatalf("unavailable %+v, want servers with the cause", a.Unavailable)
	}
	if got := describe(next(t, bystander)); got != "ns/b uid=b-uid Running ready=true match=1 claimants=1 unavailable=servers" {
		t.Fatalf("bystander: %s", got)
	}
	// A pod change is still answered.
	web.notReady = true
	pods.ev.feed(t, modified(podObject(t, web)))
	if got := describe(next(t, w)); !strings.Contains(got, "ready=false") || !strings.HasSuffix(got, "unavailable=servers") {
		t.Fatalf("after a pod change: %s", got)
	}

	// Readable now: the retry reads it.
	c.setFail(servers.Resource, nil)
	srvs := c.next(t)
	if srvs.req.GVR != servers.Resource {
		t.Fatalf("retry subscribed to %s", srvs.req.GVR)
	}
	srvs.ev.feed(t, added(serverObject(t, "ns", "s", map[string]string{"app": "web"}, "http", "opaque")), synced())
	const withServer = "ns/web uid=web-uid Running ready=false match=1 claimants=1 port=http/8080/0/TCP related=ns/smap[spec.proxyProtocol:\"opaque\"]"
	if got := describe(next(t, w)); got != withServer {
		t.Fatalf("once servers are readable: %s", got)
	}

	// It fails after it was read: its objects leave, the rest stays.
	srvs.ev.end <- fmt.Errorf("%w: upstream said no", cache.ErrRejected)
	if got := describe(next(t, w)); got != "ns/web uid=web-uid Running ready=false match=1 claimants=1 port=http/8080/0/TCP unavailable=servers" {
		t.Fatalf("after servers failed: %s", got)
	}
	c.next(t).ev.feed(t, added(serverObject(t, "ns", "s", map[string]string{"app": "web"}, "http", "opaque")), synced())
	if got := describe(next(t, w)); got != withServer {
		t.Fatalf("once servers are read again: %s", got)
	}
}

// TestWatchWithhold: a watch whose caller may not read a related kind gets
// answers without its objects, naming it Unavailable with the reason, and
// no answer for a change of them; a watch of the same address that may
// read it sees them.
func TestWatchWithhold(t *testing.T) {
	tr, c, _ := newTestTracker(t, true)
	withheld := tr.Watch(Request{Address: ap("10.0.0.1:8080"), Withhold: []Unavailable{{Resource: servers.Resource, Reason: "may not list servers"}}})
	defer withheld.Close()
	full := tr.Watch(Request{Address: ap("10.0.0.1:8080")})
	defer full.Close()
	subs := c.nextOf(t, podsGVR, servers.Resource)
	web := podOpts{name: "web", ip: "10.0.0.1", labels: map[string]string{"app": "web"}, ports: []corev1.ContainerPort{tcp("http", 8080)}}
	subs[podsGVR].ev.feed(t, added(podObject(t, web)), synced())
	subs[servers.Resource].ev.feed(t, added(serverObject(t, "ns", "s", map[string]string{"app": "web"}, "http", "opaque")), synced())
	const pod = "ns/web uid=web-uid Running ready=true match=1 claimants=1 port=http/8080/0/TCP"
	a := next(t, withheld)
	if got := describe(a); got != pod+" unavailable=servers" || a.Unavailable[0].Reason != "may not list servers" {
		t.Fatalf("withheld watch: %s %+v", got, a.Unavailable)
	}
	if got := describe(next(t, full)); got != pod+` related=ns/smap[spec.proxyProtocol:"opaque"]` {
		t.Fatalf("full watch: %s", got)
	}
	subs[servers.Resource].ev.feed(t, modified(serverObject(t, "ns", "s", map[string]string{"app": "web"}, "http", "HTTP/2")))
	if got := describe(next(t, full)); got != pod+` related=ns/smap[spec.proxyProtocol:"HTTP/2"]` {
		t.Fatalf("full watch after the server changed: %s", got)
	}
	if pending(withheld) {
		t.Fatalf("the withheld watch has an answer for a server change: %s", describe(withheld.e.state.Load().answer))
	}
}
