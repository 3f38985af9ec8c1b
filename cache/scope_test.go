package cache

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"
)

// fakeCluster is one history of a namespaced resource, as an API server
// serves it: every upstream of it lists the same state and watches the
// same changes (filtered to its namespace), with the same
// resourceVersions; a bookmark reaches every watch.
type fakeCluster struct {
	mu      sync.Mutex // guards the fields below
	rv      uint64
	objs    map[string]*Object // by namespace/name
	hist    []clusterEvent
	changed chan struct{}  // closed and replaced at every change
	lists   map[string]int // lists per namespace ("" for all)
}

type clusterEvent struct {
	t   EventType
	obj *Object // nil for a bookmark
	rv  uint64
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{rv: 1, objs: map[string]*Object{}, changed: make(chan struct{}), lists: map[string]int{}}
}

func clusterObj(ns, name string, rv uint64) *Object {
	r := strconv.FormatUint(rv, 10)
	return &Object{Namespace: ns, Name: name, ResourceVersion: r,
		Data: fmt.Appendf(nil, `{"metadata":{"name":%q,"namespace":%q,"resourceVersion":%q}}`, name, ns, r)}
}

// set creates or modifies ns/name.
func (c *fakeCluster) set(ns, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rv++
	t := Modified
	if c.objs[ns+"/"+name] == nil {
		t = Added
	}
	o := clusterObj(ns, name, c.rv)
	c.objs[ns+"/"+name] = o
	c.appendLocked(clusterEvent{t: t, obj: o, rv: c.rv})
}

// bookmark sends every watch a bookmark at the current resourceVersion,
// after one change elsewhere (as a busy cluster's would be).
func (c *fakeCluster) bookmark() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rv++
	c.appendLocked(clusterEvent{t: Bookmark, rv: c.rv})
}

func (c *fakeCluster) appendLocked(ev clusterEvent) {
	c.hist = append(c.hist, ev)
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *fakeCluster) listsOf(ns string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists[ns]
}

// clusterUpstream is the upstream of one Key of the cluster.
type clusterUpstream struct {
	c  *fakeCluster
	ns string
}

func (u *clusterUpstream) list(context.Context) ([]*Object, string, error) {
	u.c.mu.Lock()
	defer u.c.mu.Unlock()
	u.c.lists[u.ns]++
	var objs []*Object
	for _, o := range u.c.objs {
		if u.ns == "" || o.Namespace == u.ns {
			objs = append(objs, o)
		}
	}
	slices.SortFunc(objs, compareObjects)
	return objs, strconv.FormatUint(u.c.rv, 10), nil
}

func (u *clusterUpstream) watch(ctx context.Context, from string) (watchStream, error) {
	n, err := strconv.ParseUint(from, 10, 64)
	if err != nil {
		return nil, err
	}
	return &clusterStream{ctx: ctx, u: u, after: n}, nil
}

type clusterStream struct {
	ctx   context.Context
	u     *clusterUpstream
	after uint64
}

func (s *clusterStream) next() (EventType, *Object, string, error) {
	c := s.u.c
	for {
		c.mu.Lock()
		for _, ev := range c.hist {
			if ev.rv <= s.after || (ev.obj != nil && s.u.ns != "" && ev.obj.Namespace != s.u.ns) {
				continue
			}
			s.after = ev.rv
			c.mu.Unlock()
			return ev.t, ev.obj, strconv.FormatUint(ev.rv, 10), nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-s.ctx.Done():
			return 0, nil, "", s.ctx.Err()
		case <-ch:
		}
	}
}

func (s *clusterStream) close() {}

// reader reads a subscription on a goroutine of its own until its
// context ends, and hands on what it read.
type reader struct {
	sub  *Subscription
	evs  chan *Event
	done chan struct{}
}

func startReader(ctx context.Context, sub *Subscription) *reader {
	r := &reader{sub: sub, evs: make(chan *Event, 1024), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			evs, err := sub.Next(ctx, 100)
			if err != nil {
				return
			}
			for _, e := range evs {
				r.evs <- e
			}
		}
	}()
	return r
}

// until returns what r read up to and with an event at resourceVersion
// rv (a change's object or a marker's position).
func (r *reader) until(t *testing.T, ctx context.Context, rv string) []string {
	t.Helper()
	var got []*Event
	for {
		select {
		case e := <-r.evs:
			got = append(got, e)
			marker := e.Type == Synced || e.Type == Bookmark
			if (marker && e.ResourceVersion == rv) || (!marker && e.Object.ResourceVersion == rv) {
				return describe(got)
			}
		case <-ctx.Done():
			t.Fatalf("never read %s; read %q", rv, describe(got))
		}
	}
}

func newScopeTestManager(t *testing.T, c *fakeCluster, clusterAt int, linger time.Duration) *Manager {
	t.Helper()
	opts, err := Options{Scope: ScopeAutomatic, ClusterAt: clusterAt, LingerTTL: linger, Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(opts, newStaticMapper(), func(k Key) upstream { return &clusterUpstream{c: c, ns: k.Namespace} })
	m.scopeCache[testGVR] = scopeDecision{cluster: true, at: time.Now().Add(time.Hour)} // the daemon may watch it cluster-wide
	t.Cleanup(m.Close)
	return m
}

func (m *Manager) clusterScope(base Key) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.scopes[base]
	return st != nil && st.cluster
}

// lingerDone waits until no rebalance of base's scope is pending: the
// linger that would move its subscriptions back to an informer per
// namespace, if one runs, has run out and asked them to move.
func (m *Manager) lingerDone(t *testing.T, ctx context.Context, base Key) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		st := m.scopes[base]
		return st == nil || st.timer == nil, nil
	}); err != nil {
		t.Fatalf("the linger of %s never ran out: %v", base, err)
	}
}

// TestAutomaticScopeMovesWithoutAReset (issue 30): while subscriptions
// ask for fewer than ClusterAt namespaces each has an informer of its
// namespace; the ClusterAt-th starts one cluster-wide informer, and the
// others move to it; once they ask for at most half as many, for the
// linger, they move back to an informer per namespace. Every subscriber
// reads every change of its namespace once, in order, without a RESET,
// across both moves; the informers they left are released.
func TestAutomaticScopeMovesWithoutAReset(t *testing.T) {
	c := newFakeCluster()
	for _, ns := range []string{"n0", "n1", "n2", "n3"} {
		c.set(ns, "a")
	}
	m := newScopeTestManager(t, c, 3, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := Key{GVR: testGVR}
	subscribe := func(ns string) *reader {
		t.Helper()
		s, err := m.Subscribe(ctx, Request{GVR: testGVR, Namespace: ns, Holder: "client-" + ns, Owner: "test"})
		if err != nil {
			t.Fatal(err)
		}
		r := startReader(ctx, s)
		t.Cleanup(s.Close)
		return r
	}
	r0, r1 := subscribe("n0"), subscribe("n1")
	if got := r0.until(t, ctx, "5"); !slices.Equal(got, []string{"ADDED a@2", "SYNCED @5"}) {
		t.Fatalf("n0's snapshot: %q", got)
	}
	r1.until(t, ctx, "5")
	if k0, k1 := r0.sub.Key(), r1.sub.Key(); k0.Namespace != "n0" || k1.Namespace != "n1" || m.clusterScope(base) {
		t.Fatalf("2 namespaces are served by %s and %s, want an informer each", k0, k1)
	}

	c.set("n3", "b")      // 6: a change the namespaces' informers do not see
	r2 := subscribe("n2") // the third: cluster-wide, listed at 6
	if got := r2.until(t, ctx, "6"); !slices.Equal(got, []string{"ADDED a@4", "SYNCED @6"}) {
		t.Fatalf("n2's snapshot: %q", got)
	}
	if k := r2.sub.Key(); k != base || !m.clusterScope(base) {
		t.Fatalf("the third namespace is served by %s (cluster scope %v), want the cluster-wide informer", k, m.clusterScope(base))
	}
	// n0 and n1 are at 5, before the cluster-wide informer's start: they
	// move once their own informers pass it.
	c.set("n0", "a") // 7
	c.set("n1", "b") // 8
	c.set("n2", "a") // 9
	c.bookmark()     // 10
	if got, want := r0.until(t, ctx, "10"), []string{"MODIFIED a@7", "BOOKMARK @10"}; !slices.Equal(got, want) {
		t.Errorf("n0 across its move: %q, want %q", got, want)
	}
	if got, want := r1.until(t, ctx, "10"), []string{"ADDED b@8", "BOOKMARK @10"}; !slices.Equal(got, want) {
		t.Errorf("n1 across its move: %q, want %q", got, want)
	}
	if got, want := r2.until(t, ctx, "10"), []string{"MODIFIED a@9", "BOOKMARK @10"}; !slices.Equal(got, want) {
		t.Errorf("n2: %q, want %q", got, want)
	}
	c.set("n0", "b") // 11
	c.set("n1", "a") // 12
	if got, want := r0.until(t, ctx, "11"), []string{"ADDED b@11"}; !slices.Equal(got, want) {
		t.Errorf("n0 after its move: %q, want %q", got, want)
	}
	if got, want := r1.until(t, ctx, "12"), []string{"MODIFIED a@12"}; !slices.Equal(got, want) {
		t.Errorf("n1 after its move: %q, want %q", got, want)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return r0.sub.Key() == base && r1.sub.Key() == base, nil
	}); err != nil {
		t.Fatalf("n0 reads %s and n1 %s, want the cluster-wide informer", r0.sub.Key(), r1.sub.Key())
	}
	for _, ns := range []string{"n0", "n1"} {
		if e := m.entryFor(t, Key{GVR: testGVR, Namespace: ns}); e != nil && e.refs != 0 {
			t.Errorf("%s's informer after its subscriber moved: %d refs, want it released", ns, e.refs)
		}
	}

	// Down to one namespace: after the linger, n0 moves back to its own.
	r1.sub.Close()
	r2.sub.Close()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return !m.clusterScope(base), nil
	}); err != nil {
		t.Fatal("the scope stayed cluster-wide with one namespace asked for")
	}
	c.set("n0", "c") // 13
	c.bookmark()     // 14
	c.set("n0", "a") // 15
	if got, want := r0.until(t, ctx, "15"), []string{"ADDED c@13", "BOOKMARK @14", "MODIFIED a@15"}; !slices.Equal(got, want) {
		t.Errorf("n0 across its move back: %q, want %q", got, want)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return r0.sub.Key() == Key{GVR: testGVR, Namespace: "n0"}, nil
	}); err != nil {
		t.Fatalf("n0 reads %s, want its namespace's informer again", r0.sub.Key())
	}
	if e := m.entryFor(t, base); e == nil || e.refs != 0 {
		t.Errorf("the cluster-wide informer once nobody reads it: %+v, want it released", e)
	}
	if n := c.listsOf("n1"); n != 1 {
		t.Errorf("%d lists of n1, want 1", n)
	}
}

// TestAutomaticScopeChurnLosesNothing (issue 30): subscriptions that come
// and go in three namespaces take the scope across ClusterAt and back
// many times while every namespace changes; two subscribers that stay
// read every change of their namespace exactly once, in order, and never
// a RESET, whichever informers served them meanwhile.
func TestAutomaticScopeChurnLosesNothing(t *testing.T) {
	c := newFakeCluster()
	namespaces := []string{"n0", "n1", "n2", "n3", "n4"}
	for _, ns := range namespaces {
		c.set(ns, "a")
	}
	m := newScopeTestManager(t, c, 4, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(ns string) *Subscription {
		t.Helper()
		s, err := m.Subscribe(ctx, Request{GVR: testGVR, Namespace: ns, Holder: "client-" + ns, Owner: "test"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	stay := map[string]*reader{}
	start := map[string]string{}
	for _, ns := range []string{"n0", "n1"} {
		s := open(ns)
		defer s.Close()
		stay[ns] = startReader(ctx, s)
		start[ns] = "6"
		stay[ns].until(t, ctx, "6") // the snapshot, at the list's 6
	}
	churn := map[string]*Subscription{}
	for i := range 300 {
		ns := namespaces[i%len(namespaces)]
		c.set(ns, fmt.Sprintf("o%d", i%7))
		switch i % 11 {
		case 3, 7: // the other namespaces' subscriptions come and go
			other := namespaces[2+i%3]
			if s := churn[other]; s != nil {
				s.Close()
				delete(churn, other)
			} else {
				churn[other] = open(other)
			}
		case 5:
			c.bookmark()
		}
		if i%50 == 49 { // now and then, let a pending linger run out
			m.lingerDone(t, ctx, Key{GVR: testGVR})
		}
	}
	for _, s := range churn {
		s.Close()
	}
	c.bookmark()
	c.mu.Lock()
	end := strconv.FormatUint(c.rv, 10)
	hist := slices.Clone(c.hist)
	c.mu.Unlock()
	for ns, r := range stay {
		var want []string
		from, _ := strconv.ParseUint(start[ns], 10, 64)
		for _, ev := range hist {
			if ev.obj != nil && ev.obj.Namespace == ns && ev.rv > from {
				want = append(want, fmt.Sprintf("%s %s@%d", ev.t, ev.obj.Name, ev.rv))
			}
		}
		var got []string
		for _, e := range r.until(t, ctx, end) {
			if !strings.HasPrefix(e, "BOOKMARK") {
				got = append(got, e)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s read %d changes, want the %d of its namespace:\n got %q\nwant %q", ns, len(got), len(want), got, want)
		}
	}
	if got := testutil.ToFloat64(m.metrics.scopeChanges.WithLabelValues("cluster")); got < 2 {
		t.Errorf("the scope went cluster-wide %v times, want the churn to cross ClusterAt more often", got)
	}
	t.Logf("scope changes: to cluster %v, to namespace %v; subscriber moves %v",
		testutil.ToFloat64(m.metrics.scopeChanges.WithLabelValues("cluster")), testutil.ToFloat64(m.metrics.scopeChanges.WithLabelValues("namespace")), testutil.ToFloat64(m.metrics.moves))
}

// TestAutomaticScopeHoldsAndResumes (issue 30): a Hold of a namespace
// moves to the cluster-wide informer with the scope, and a request that
// resumes from before the cluster-wide informer's start is served by the
// namespace's informer, which still holds its resume point, without a
// RESET (it moves on later).
func TestAutomaticScopeHoldsAndResumes(t *testing.T) {
	c := newFakeCluster()
	c.set("n0", "a") // 2
	c.set("n1", "a") // 3
	m := newScopeTestManager(t, c, 2, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base, n0 := Key{GVR: testGVR}, Key{GVR: testGVR, Namespace: "n0"}
	held, err := m.Hold(ctx, Request{GVR: testGVR, Namespace: "n0", Holder: "status", Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if held.Key() != n0 {
		t.Fatalf("a Hold of n0 holds %s, want n0's informer", held.Key())
	}
	sub0, err := m.Subscribe(ctx, Request{GVR: testGVR, Namespace: "n0", Holder: "a", Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub0.Close()
	r0 := startReader(ctx, sub0)
	r0.until(t, ctx, "3")
	c.set("n0", "b") // 4
	r0.until(t, ctx, "4")

	sub1, err := m.Subscribe(ctx, Request{GVR: testGVR, Namespace: "n1", Holder: "b", Owner: "test"}) // the second namespace: cluster-wide, listed at 4
	if err != nil {
		t.Fatal(err)
	}
	defer sub1.Close()
	if held.Key() != base {
		t.Errorf("the Hold of n0 holds %s once the scope is cluster-wide, want %s", held.Key(), base)
	}
	resumed, err := m.Subscribe(ctx, Request{GVR: testGVR, Namespace: "n0", Resume: "3", Holder: "c", Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	if resumed.Key() != n0 || resumed.Resets() {
		t.Fatalf("a resume from 3 (before the cluster-wide informer's 4) is served by %s, RESET %v; want n0's informer, no RESET", resumed.Key(), resumed.Resets())
	}
	rr := startReader(ctx, resumed)
	c.set("n0", "c") // 5
	if got, want := rr.until(t, ctx, "5"), []string{"ADDED b@4", "ADDED c@5"}; !slices.Equal(got, want) {
		t.Errorf("resumed from 3: %q, want %q", got, want)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return resumed.Key() == base && sub0.Key() == base, nil
	}); err != nil {
		t.Fatalf("the n0 subscriptions read %s and %s, want the cluster-wide informer", resumed.Key(), sub0.Key())
	}
}
