package address

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/informerd/informerd/cache"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// servers is the Server-like related kind of the tests.
var servers = RelatedKind{
	Resource:     schema.GroupVersionResource{Group: "policy.test", Version: "v1", Resource: "servers"},
	SelectorPath: "spec.podSelector", PortPath: "spec.port", Fields: []string{"spec.proxyProtocol"},
}

// podOpts describe a test pod; zero values give a Running, ready pod.
type podOpts struct {
	ns, name, uid string
	labels        map[string]string
	ip, hostIP    string
	ports         []corev1.ContainerPort
	hostNetwork   bool
	phase         corev1.PodPhase
	notReady      bool
	deleting      bool
	created       time.Time
	annotations   map[string]string
	// owner replaces the default controller, a ReplicaSet "rs".
	owner *metav1.OwnerReference
}

// podObject encodes a pod as the cache holds it.
func podObject(t testing.TB, o podOpts) *cache.Object {
	t.Helper()
	if o.ns == "" {
		o.ns = "ns"
	}
	if o.uid == "" {
		o.uid = o.name + "-uid"
	}
	if o.phase == "" {
		o.phase = corev1.PodRunning
	}
	if o.created.IsZero() {
		o.created = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	ready := corev1.ConditionTrue
	if o.notReady {
		ready = corev1.ConditionFalse
	}
	controller := true
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", Controller: &controller}
	if o.owner != nil {
		owner = *o.owner
	}
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: o.ns, Name: o.name, UID: types.UID(o.uid), Labels: o.labels, Annotations: o.annotations,
			CreationTimestamp: metav1.NewTime(o.created),
			OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "v1", Kind: "ConfigMap", Name: "not-the-controller"},
				owner,
			},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: "sa", HostNetwork: o.hostNetwork,
			Containers: []corev1.Container{{Name: "app", Image: "x", Ports: o.ports}},
		},
		Status: corev1.PodStatus{
			Phase: o.phase, PodIP: o.ip, HostIP: o.hostIP,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}},
		},
	}
	if o.ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: o.ip}}
	}
	if o.deleting {
		now := metav1.NewTime(o.created.Add(time.Minute))
		p.DeletionTimestamp = &now
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &cache.Object{Namespace: o.ns, Name: o.name, Labels: o.labels, Data: b}
}

// decoded is podObject decoded as the pod reader decodes it.
func decoded(t testing.TB, o podOpts) *Pod {
	t.Helper()
	p, err := decodePod(podObject(t, o))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// serverObject encodes a Server-like object; port is an int, a string or nil.
func serverObject(t testing.TB, ns, name string, selector map[string]string, port any, protocol string) *cache.Object {
	t.Helper()
	spec := map[string]any{"proxyProtocol": protocol}
	if selector != nil {
		spec["podSelector"] = map[string]any{"matchLabels": selector}
	}
	if port != nil {
		spec["port"] = port
	}
	b, err := json.Marshal(map[string]any{
		"apiVersion": "policy.test/v1", "kind": "Server",
		"metadata": map[string]any{"namespace": ns, "name": name}, "spec": spec,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &cache.Object{Namespace: ns, Name: name, Data: b}
}

func decodedServer(t testing.TB, ns, name string, selector map[string]string, port any, protocol string) *relObj {
	t.Helper()
	r, err := servers.decode(serverObject(t, ns, name, selector, port, protocol))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tcp(name string, port int32) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: port, Protocol: corev1.ProtocolTCP}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// fakeEvents is a subscription fed by a test.
type fakeEvents struct {
	batches chan []*cache.Event
	end     chan error // the error Next returns once fed
	closed  chan struct{}
	once    sync.Once
}

func newFakeEvents() *fakeEvents {
	return &fakeEvents{batches: make(chan []*cache.Event), end: make(chan error, 1), closed: make(chan struct{})}
}

func (f *fakeEvents) Next(ctx context.Context, _ int) ([]*cache.Event, error) {
	select {
	case evs := <-f.batches:
		return evs, nil
	case err := <-f.end:
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *fakeEvents) Close() { f.once.Do(func() { close(f.closed) }) }

// feed delivers events to the reader (waiting until it takes them).
func (f *fakeEvents) feed(t testing.TB, evs ...*cache.Event) {
	t.Helper()
	select {
	case f.batches <- evs:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never took the events")
	}
}

// fakeCluster is a Subscriber: each Subscribe of a served resource gets a
// new fakeEvents, handed to the test on subs.
type fakeCluster struct {
	mu     sync.Mutex // guards served, podsFail and fail
	served map[schema.GroupVersionResource]bool
	// podsFail, if set, is what subscribing to pods returns.
	podsFail error
	// fail maps resources to what subscribing to them returns.
	fail map[schema.GroupVersionResource]error
	subs chan *subscription
}

type subscription struct {
	req cache.Request
	ev  *fakeEvents
}

func newFakeCluster(served ...schema.GroupVersionResource) *fakeCluster {
	c := &fakeCluster{served: map[schema.GroupVersionResource]bool{podsGVR: true}, subs: make(chan *subscription, 16)}
	for _, r := range served {
		c.served[r] = true
	}
	return c
}

func (c *fakeCluster) subscribe(ctx context.Context, req cache.Request) (Events, error) {
	c.mu.Lock()
	served, podsFail, fail := c.served[req.GVR], c.podsFail, c.fail[req.GVR]
	c.mu.Unlock()
	switch {
	case fail != nil:
		return nil, fail
	case podsFail != nil && req.GVR == podsGVR:
		return nil, podsFail
	case !served && !req.WaitForResource:
		return nil, fmt.Errorf("%w: %s", cache.ErrUnknownResource, req.GVR)
	case !served:
		<-ctx.Done() // the tests never serve it later
		return nil, ctx.Err()
	}
	s := &subscription{req: req, ev: newFakeEvents()}
	c.subs <- s
	return s.ev, nil
}

// setFail makes subscribing to r fail with err (nil: succeed).
func (c *fakeCluster) setFail(r schema.GroupVersionResource, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail == nil {
		c.fail = map[schema.GroupVersionResource]error{}
	}
	c.fail[r] = err
}

// nextOf returns the next subscriptions made, one of each resource of rs,
// in any order.
func (c *fakeCluster) nextOf(t testing.TB, rs ...schema.GroupVersionResource) map[schema.GroupVersionResource]*subscription {
	t.Helper()
	got := map[schema.GroupVersionResource]*subscription{}
	for range rs {
		s := c.next(t)
		got[s.req.GVR] = s
	}
	for _, r := range rs {
		if got[r] == nil {
			t.Fatalf("subscriptions %v, want one of each of %v", got, rs)
		}
	}
	return got
}

// next returns the next subscription made.
func (c *fakeCluster) next(t testing.TB) *subscription {
	t.Helper()
	select {
	case s := <-c.subs:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription was made")
		return nil
	}
}

func added(o *cache.Object) *cache.Event    { return &cache.Event{Type: cache.Added, Object: o} }
func modified(o *cache.Object) *cache.Event { return &cache.Event{Type: cache.Modified, Object: o} }
func deleted(o *cache.Object) *cache.Event  { return &cache.Event{Type: cache.Deleted, Object: o} }
func synced() *cache.Event                  { return &cache.Event{Type: cache.Synced} }

// next reads the next answer with a deadline.
func next(t testing.TB, w *Watch) *Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return a
}

// pending reports whether Next would return an answer now.
func pending(w *Watch) bool {
	st := w.e.state.Load()
	if st.err != nil {
		return true
	}
	if w.wlSynced != nil {
		select {
		case <-w.wlSynced:
		default:
			return false
		}
	}
	return st.answer != nil && st.answer != w.shared && (w.last == nil || !sameAnswer(w.last, w.view(st.answer), w.keys, false))
}

// describe summarizes an answer for comparisons in tests.
func describe(a *Answer) string {
	if a.Pod == nil {
		return "none" + describeUnavailable(a)
	}
	s := fmt.Sprintf("%s/%s uid=%s %s ready=%v match=%d claimants=%d", a.Pod.Namespace, a.Pod.Name, a.Pod.UID, a.Pod.Phase, a.Pod.Ready, a.Match, a.Claimants)
	if a.Port != nil {
		s += fmt.Sprintf(" port=%s/%d/%d/%s", a.Port.Name, a.Port.ContainerPort, a.Port.HostPort, a.Port.Protocol)
	}
	for _, r := range a.Related {
		s += fmt.Sprintf(" related=%s/%s%v", r.Namespace, r.Name, r.Fields)
	}
	if a.Workload != nil {
		s += fmt.Sprintf(" workload=%s/%s", a.Workload.Kind, a.Workload.Name)
	}
	return s + describeUnavailable(a)
}

// describeUnavailable names the kinds an answer lacks.
func describeUnavailable(a *Answer) string {
	s := ""
	for _, u := range a.Unavailable {
		s += " unavailable=" + u.Resource.Resource
	}
	return s
}
