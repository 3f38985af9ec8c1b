package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// golang-lru/v2's expirable LRU never stops its expiry goroutine.
		goleak.IgnoreAnyFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"))
}

// fakeUpstream serves lists from a queue and watches from a channel of
// steps, so that a test decides every upstream answer.
type fakeUpstream struct {
	lists   chan fakeList
	watches chan chan fakeStep // each watch takes the next channel of steps
	onWatch func()             // if set, called as each watch opens
}

type fakeList struct {
	objs []*Object
	rv   string
	err  error
}

type fakeStep struct {
	t   EventType
	obj *Object
	rv  string
	err error // ends the watch
}

func newFakeUpstream() *fakeUpstream {
	return &fakeUpstream{lists: make(chan fakeList, 4), watches: make(chan chan fakeStep, 8)}
}

func (f *fakeUpstream) list(ctx context.Context) ([]*Object, string, error) {
	select {
	case l := <-f.lists:
		return l.objs, l.rv, l.err
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
}

func (f *fakeUpstream) watch(ctx context.Context, _ string) (watchStream, error) {
	select {
	case steps := <-f.watches:
		if f.onWatch != nil {
			f.onWatch()
		}
		return &fakeStream{ctx: ctx, steps: steps}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type fakeStream struct {
	ctx   context.Context
	steps chan fakeStep
}

func (s *fakeStream) next() (EventType, *Object, string, error) {
	select {
	case st, ok := <-s.steps:
		if !ok {
			return 0, nil, "", io.EOF
		}
		return st.t, st.obj, st.rv, st.err
	case <-s.ctx.Done():
		return 0, nil, "", s.ctx.Err()
	}
}

func (s *fakeStream) close() {}

func testSourceConfig(limits LogLimits, idle time.Duration) sourceConfig {
	return sourceConfig{limits: limits, idleTimeout: idle, log: slog.New(slog.DiscardHandler), metrics: newMetrics(nil)}
}

func startTestSource(t *testing.T, up upstream, limits LogLimits) *Source {
	t.Helper()
	if limits.MinAge == 0 {
		limits.MinAge = -1
	}
	s := newSource(Key{}, up, testSourceConfig(limits, time.Hour))
	s.start(context.Background())
	t.Cleanup(s.stop)
	return s
}

func subscribe(t *testing.T, ctx context.Context, s *Source, f Filter, resume string) *Subscription {
	t.Helper()
	sub := newTestSubscription(s, f)
	if err := sub.start(ctx, resume, ""); err != nil {
		t.Fatalf("subscribing: %v", err)
	}
	t.Cleanup(sub.Close)
	return sub
}

// read reads until n events arrived.
func read(t *testing.T, ctx context.Context, sub *Subscription, n int) []string {
	t.Helper()
	var got []*Event
	for len(got) < n {
		evs, err := sub.Next(ctx, 100)
		if err != nil {
			t.Fatalf("after %v: %v", describe(got), err)
		}
		got = append(got, evs...)
	}
	return describe(got)
}

// TestRelistDifferenceIsWhatAWatchWouldSay (defect 9.5, issue 28): a
// relist publishes only the difference, as a watch would have: deletions
// first, each carrying the last position before the relist in the object
// itself (a reflector takes its position from it, and must replay the rest
// of the difference from there), an object deleted and created again under
// its name during the gap as a deletion then an addition, and the changes
// in the order of their resourceVersions.
func TestRelistDifferenceIsWhatAWatchWouldSay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	withUID := func(o *Object, uid string) *Object {
		o.Data = fmt.Appendf(nil, `{"metadata":{"name":%q,"namespace":"ns","uid":%q,"resourceVersion":%q}}`, o.Name, uid, o.ResourceVersion)
		return o
	}
	up := newFakeUpstream()
	up.lists <- fakeList{objs: []*Object{obj("a", "1", nil), obj("b", "2", nil), obj("c", "3", nil), withUID(obj("e", "4", nil), "uid-1")}, rv: "4"}
	w1 := make(chan fakeStep, 4)
	up.watches <- w1
	s := startTestSource(t, up, LogLimits{})
	sub := subscribe(t, ctx, s, Filter{}, "")

	got := read(t, ctx, sub, 5)
	if want := []string{"ADDED a@1", "ADDED b@2", "ADDED c@3", "ADDED e@4", "SYNCED @4"}; !slices.Equal(got, want) {
		t.Fatalf("snapshot = %v, want %v", got, want)
	}

	// The watch expires; the relist shows b changed, c gone, d new, a the
	// same, and e deleted and created again.
	w1 <- fakeStep{err: &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusGone, Reason: metav1.StatusReasonExpired}}}
	up.lists <- fakeList{objs: []*Object{obj("a", "1", nil), obj("b", "7", nil), obj("d", "8", nil), withUID(obj("e", "6", nil), "uid-2")}, rv: "9"}
	up.watches <- make(chan fakeStep)
	var evs []*Event
	for len(evs) < 6 {
		next, err := sub.Next(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, next...)
	}
	want := []string{"DELETED c@4", "DELETED e@4", "ADDED e@6", "MODIFIED b@7", "ADDED d@8", "BOOKMARK @9"}
	if got := describe(evs); !slices.Equal(got, want) {
		t.Fatalf("after relist = %v, want %v", got, want)
	}
	for _, e := range evs {
		if e.Type != Deleted {
			continue
		}
		o, _, err := decodeObject(e.Object.Data, false)
		if err != nil {
			t.Fatal(err)
		}
		if o.ResourceVersion != "4" {
			t.Errorf("the deletion of %s carries resourceVersion %q in its object, want 4, the position before the relist", o.Name, o.ResourceVersion)
		}
	}
}

// TestRelistAcrossNamespacesInStorageOrder: a relist that changes nothing
// publishes nothing, with namespaces whose storage-key order ("ns-two/a"
// before "ns/a") is not their (namespace, name) order: the difference
// walks the store and the list in the same order.
func TestRelistAcrossNamespacesInStorageOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in := func(ns, name, rv string) *Object {
		o := obj(name, rv, nil)
		o.Namespace = ns
		o.Data = fmt.Appendf(nil, `{"metadata":{"name":%q,"namespace":%q,"uid":%q,"resourceVersion":%q}}`, name, ns, ns+"/"+name, rv)
		return o
	}
	list := func() []*Object {
		return []*Object{in("ns-two", "a", "2"), in("ns", "a", "1"), in("ns", "b", "3"), in("ns0", "a", "4")}
	}
	up := newFakeUpstream()
	up.lists <- fakeList{objs: list(), rv: "4"}
	w1 := make(chan fakeStep, 1)
	up.watches <- w1
	s := startTestSource(t, up, LogLimits{})
	sub := subscribe(t, ctx, s, Filter{}, "")
	read(t, ctx, sub, 5)

	w1 <- fakeStep{err: &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusGone, Reason: metav1.StatusReasonExpired}}}
	up.lists <- fakeList{objs: list(), rv: "9"}
	up.watches <- make(chan fakeStep)
	if got, want := read(t, ctx, sub, 1), []string{"BOOKMARK @9"}; !slices.Equal(got, want) {
		t.Fatalf("after a relist that changed nothing = %v, want %v", got, want)
	}
}

func TestSubscriptionFallsOutOfTheLogAndCatchesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := newFakeUpstream()
	up.lists <- fakeList{objs: []*Object{obj("a", "1", nil), obj("b", "1", nil)}, rv: "1"}
	steps := make(chan fakeStep, 100)
	up.watches <- steps
	s := startTestSource(t, up, LogLimits{MaxEvents: 3})
	fast := subscribe(t, ctx, s, Filter{}, "")
	slow := subscribe(t, ctx, s, Filter{}, "")
	read(t, ctx, fast, 3)
	read(t, ctx, slow, 3)

	// 20 updates of a, then b deleted; the fast reader reads each one as
	// it comes, the slow one falls out of the 3-event log.
	for i := 2; i <= 21; i++ {
		rv := itoa(i)
		steps <- fakeStep{t: Modified, obj: obj("a", rv, nil), rv: rv}
		if got := read(t, ctx, fast, 1); got[0] != "MODIFIED a@"+rv {
			t.Fatalf("fast reader got %s, want MODIFIED a@%s", got[0], rv)
		}
	}
	steps <- fakeStep{t: Deleted, obj: obj("b", "22", nil), rv: "22"}
	if got := read(t, ctx, fast, 1); got[0] != "DELETED b@22" {
		t.Fatalf("fast reader's last event = %s, want DELETED b@22", got[0])
	}
	got := read(t, ctx, slow, 3)
	want := []string{"MODIFIED a@21", "DELETED b@22", "BOOKMARK @22"}
	if !slices.Equal(got, want) {
		t.Fatalf("slow reader's catch-up = %v, want %v", got, want)
	}
}

func TestSubscriptionResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := newFakeUpstream()
	up.lists <- fakeList{objs: []*Object{obj("a", "1", nil)}, rv: "1"}
	steps := make(chan fakeStep, 100)
	up.watches <- steps
	s := startTestSource(t, up, LogLimits{MaxEvents: 2, MaxTombstones: 1})
	for i := 2; i <= 5; i++ {
		steps <- fakeStep{t: Added, obj: obj("o"+itoa(i), itoa(i), nil), rv: itoa(i)}
	}
	first := subscribe(t, ctx, s, Filter{}, "")
	read(t, ctx, first, 6)

	tests := []struct {
		resume string
		want   []string
	}{
		{"5", nil},                    // at the head: nothing to send
		{"4", []string{"ADDED o5@5"}}, // inside the log
		{"2", []string{"ADDED o3@3", "ADDED o4@4", "ADDED o5@5", "BOOKMARK @5"}}, // compacted
	}
	for _, tt := range tests {
		sub := subscribe(t, ctx, s, Filter{}, tt.resume)
		if sub.Resets() {
			t.Errorf("resume from %s: Resets, want a resume", tt.resume)
		}
		if tt.want == nil {
			continue
		}
		if got := read(t, ctx, sub, len(tt.want)); !slices.Equal(got, tt.want) {
			t.Errorf("resume from %s = %v, want %v", tt.resume, got, tt.want)
		}
	}
	// A deletion pushes the horizon past 2: resuming from 1 needs a Reset.
	steps <- fakeStep{t: Deleted, obj: obj("o2", "6", nil), rv: "6"}
	steps <- fakeStep{t: Deleted, obj: obj("o3", "7", nil), rv: "7"}
	read(t, ctx, first, 2)
	sub := subscribe(t, ctx, s, Filter{}, "1")
	if !sub.Resets() {
		t.Error("resume past the horizon: not Resets, want it said before the first event")
	}
	got := read(t, ctx, sub, 1)
	if got[0] != "RESET @" {
		t.Fatalf("resume past the horizon starts with %s, want RESET", got[0])
	}
}

func TestSubscribeFailsWhileTheFirstListFails(t *testing.T) {
	up := newFakeUpstream()
	up.lists <- fakeList{err: apierrors.NewServiceUnavailable("etcd is down")}
	s := startTestSource(t, up, LogLimits{})
	sub := newTestSubscription(s, Filter{})
	err := sub.start(context.Background(), "", "")
	if !errors.Is(err, ErrNotSynced) || !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("start = %v, want ErrNotSynced wrapping the cause", err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestSourceAbandonsIdleWatch: a watch that brings nothing for the idle
// timeout (a hung connection) is abandoned and re-opened, and the Source
// is stale meanwhile.
func TestSourceAbandonsIdleWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := &fakeUpstream{lists: make(chan fakeList, 1), watches: make(chan chan fakeStep)}
	up.lists <- fakeList{objs: []*Object{obj("a", "1", nil)}, rv: "1"}
	s := newSource(Key{}, up, testSourceConfig(LogLimits{}, 50*time.Millisecond))
	s.start(context.Background())
	defer s.stop()
	up.watches <- make(chan fakeStep) // a watch that brings nothing

	// Step on the Source's own notifications until it reports stale.
	for {
		s.mu.Lock()
		st, ch := s.state, s.notify
		msg := ""
		if s.lastErr != nil {
			msg = s.lastErr.Error()
		}
		s.mu.Unlock()
		if st == StateStale {
			if !strings.Contains(msg, errUpstreamIdle.Error()) {
				t.Fatalf("stale because of %q, want the idle timeout", msg)
			}
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatal("the hung watch was never abandoned")
		}
	}
	second := make(chan fakeStep, 1)
	second <- fakeStep{t: Bookmark, rv: "2"}
	select {
	case up.watches <- second: // the Source re-opens its watch
	case <-ctx.Done():
		t.Fatal("no new watch after the idle one")
	}
	sub := subscribe(t, ctx, s, Filter{}, "1")
	if got := read(t, ctx, sub, 1); got[0] != "BOOKMARK @2" {
		t.Fatalf("after the new watch: %v", got)
	}
}

func TestSubscriptionGetAndList(t *testing.T) {
	ctx := t.Context()
	up := newFakeUpstream()
	s := startTestSource(t, up, LogLimits{})
	a1 := obj("a1", "1", map[string]string{"app": "x"})
	a1.Namespace = "a"
	a2 := obj("a2", "2", map[string]string{"app": "y"})
	a2.Namespace = "a"
	b1 := obj("b1", "3", map[string]string{"app": "x"})
	b1.Namespace = "b"
	up.lists <- fakeList{objs: []*Object{b1, a2, a1}, rv: "3"}
	sel, err := labels.Parse("app=x")
	if err != nil {
		t.Fatal(err)
	}
	all := subscribe(t, ctx, s, Filter{}, "")
	inA := subscribe(t, ctx, s, Filter{Namespace: "a"}, "")
	onlyX := subscribe(t, ctx, s, Filter{Labels: sel}, "")
	names := func(objs []*Object) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.Namespace+"/"+o.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		sub  *Subscription
		ns   string
		sel  labels.Selector
		want []string
	}{
		{"everything", all, "", nil, []string{"a/a1", "a/a2", "b/b1"}},
		{"one namespace", all, "b", nil, []string{"b/b1"}},
		{"selector", all, "", sel, []string{"a/a1", "b/b1"}},
		{"filter's namespace", inA, "", nil, []string{"a/a1", "a/a2"}},
		{"outside the filter's namespace", inA, "b", nil, nil},
		{"filter's selector", onlyX, "a", nil, []string{"a/a1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(tc.sub.List(tc.ns, tc.sel)); !slices.Equal(got, tc.want) {
				t.Errorf("List(%q, %v) = %v, want %v", tc.ns, tc.sel, got, tc.want)
			}
		})
	}
	if o, ok := all.Get("a", "a2"); !ok || o != a2 {
		t.Errorf("Get(a, a2) = %v, %v; want the stored object", o, ok)
	}
	if _, ok := inA.Get("b", "b1"); ok {
		t.Error("Get outside the filter's namespace found an object")
	}
	if _, ok := onlyX.Get("a", "a2"); ok {
		t.Error("Get of an object the filter's selector rejects found it")
	}
	if _, ok := all.Get("a", "missing"); ok {
		t.Error("Get of a missing object found it")
	}
}

func TestWithStatusKeepsTheAPIServersMessage(t *testing.T) {
	generic := apierrors.NewGenericServerResponse(http.StatusBadRequest, "GET", schema.GroupResource{}, "", "", 0, true)
	body := []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"field label not supported: spec.x","reason":"BadRequest","code":400}`)
	err := withStatus(generic, body)
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "field label not supported: spec.x") {
		t.Fatalf("withStatus = %v, want the API server's BadRequest", err)
	}
	if got := withStatus(generic, []byte("not json")); !errors.Is(got, generic) || got.Error() != generic.Error() {
		t.Fatalf("withStatus of a body that is no Status = %v, want the error unchanged", got)
	}
}

// newTestSubscription returns a subscription of s through f that holds
// nothing, for start.
func newTestSubscription(s *Source, f Filter) *Subscription {
	sub := &Subscription{filter: f, release: func() {}}
	sub.src.Store(s)
	return sub
}
