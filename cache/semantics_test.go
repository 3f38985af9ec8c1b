package cache

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
)

// blockingSelector blocks in Matches until released, to show that no
// filter runs under a Source's lock.
type blockingSelector struct {
	labels.Selector
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (b *blockingSelector) Empty() bool { return false }

func (b *blockingSelector) Matches(labels.Labels) bool {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	return true
}

// TestSlowFilterDoesNotStallTheSource (defect 9.3): a subscriber whose
// selector is slow (a huge set-based selector) filters its snapshot, and
// the events it reads, outside the Source's lock: while it is stuck in its
// selector, the Source keeps publishing and a bystander keeps receiving.
func TestSlowFilterDoesNotStallTheSource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := newFakeUpstream()
	up.lists <- fakeList{objs: []*Object{obj("a", "1", nil), obj("b", "1", nil)}, rv: "1"}
	steps := make(chan fakeStep, 10)
	up.watches <- steps
	s := startTestSource(t, up, LogLimits{})
	bystander := subscribe(t, ctx, s, Filter{}, "")
	read(t, ctx, bystander, 3)

	sel := &blockingSelector{Selector: labels.Everything(), entered: make(chan struct{}), release: make(chan struct{})}
	slow := subscribe(t, ctx, s, Filter{Labels: sel}, "")
	done := make(chan error, 1)
	go func() {
		_, err := slow.Next(ctx, 100)
		done <- err
	}()
	select {
	case <-sel.entered:
	case <-ctx.Done():
		t.Fatal("the slow subscriber never filtered")
	}
	steps <- fakeStep{t: Added, obj: obj("c", "2", nil), rv: "2"}
	if got := read(t, ctx, bystander, 1); got[0] != "ADDED c@2" {
		t.Fatalf("bystander got %v", got)
	}
	if _, ok := bystander.Get("ns", "c"); !ok {
		t.Error("Get does not see the new object while a filter is stuck")
	}
	close(sel.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotIsReadIncrementally (defect 9.3): a snapshot is a frozen
// copy read at the subscriber's pace: changes made while it is read do
// not show in it (they follow, from the log), and a namespace's snapshot
// visits only that namespace.
func TestSnapshotIsReadIncrementally(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := newFakeUpstream()
	var objs []*Object
	for i := range 10 {
		o := obj("o"+itoa(i), "1", nil)
		objs = append(objs, o)
	}
	other := obj("x", "1", nil)
	other.Namespace = "other"
	up.lists <- fakeList{objs: append(objs, other), rv: "1"}
	steps := make(chan fakeStep, 10)
	up.watches <- steps
	s := startTestSource(t, up, LogLimits{})
	sub := subscribe(t, ctx, s, Filter{Namespace: "ns"}, "")
	first, err := sub.Next(ctx, 3)
	if err != nil || len(first) != 3 {
		t.Fatalf("first read: %v, %v", describe(first), err)
	}
	steps <- fakeStep{t: Modified, obj: obj("o9", "2", nil), rv: "2"}
	steps <- fakeStep{t: Deleted, obj: obj("o8", "3", nil), rv: "3"}
	var rest []*Event
	for len(rest) == 0 || rest[len(rest)-1].Type != Synced {
		evs, err := sub.Next(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, evs...)
	}
	got := describe(append(first, rest...))
	want := []string{"ADDED o0@1", "ADDED o1@1", "ADDED o2@1", "ADDED o3@1", "ADDED o4@1", "ADDED o5@1",
		"ADDED o6@1", "ADDED o7@1", "ADDED o8@1", "ADDED o9@1", "SYNCED @1"}
	if !slices.Equal(got, want) {
		t.Fatalf("snapshot = %v\nwant %v", got, want)
	}
	if got := read(t, ctx, sub, 2); !slices.Equal(got, []string{"MODIFIED o9@2", "DELETED o8@3"}) {
		t.Fatalf("after the snapshot: %v", got)
	}
}

// TestResumeFromTheFutureWaits (defect 9.6): a resume point newer than the
// informer has reached waits until it gets there, so the client never
// receives an older state; past freshnessWait it fails with ErrTooNew,
// never with a Reset to older data.
func TestResumeFromTheFutureWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		up := newFakeUpstream()
		up.lists <- fakeList{objs: []*Object{obj("a", "5", nil)}, rv: "5"}
		steps := make(chan fakeStep, 10)
		up.watches <- steps
		s := startTestSource(t, up, LogLimits{})
		started := make(chan *Subscription, 1)
		go func() {
			sub := newTestSubscription(s, Filter{})
			if err := sub.start(ctx, "7", ""); err != nil {
				t.Errorf("resume from 7: %v", err)
			}
			started <- sub
		}()
		synctest.Wait()
		select {
		case <-started:
			t.Fatal("a resume from 7 started while the informer was at 5")
		default:
		}
		steps <- fakeStep{t: Added, obj: obj("b", "6", nil), rv: "6"}
		steps <- fakeStep{t: Added, obj: obj("c", "7", nil), rv: "7"}
		steps <- fakeStep{t: Added, obj: obj("d", "8", nil), rv: "8"}
		sub := <-started
		defer sub.Close()
		if got := read(t, ctx, sub, 1); got[0] != "ADDED d@8" {
			t.Fatalf("after resuming from 7: %v, want ADDED d@8", got)
		}

		late := newTestSubscription(s, Filter{})
		err := late.start(ctx, "", "100")
		var tn *TooNewError
		if !errors.Is(err, ErrTooNew) || !errors.As(err, &tn) || tn.Want != 100 || tn.Current != 8 {
			t.Fatalf("a snapshot not older than 100 = %v, want ErrTooNew wanting 100 at 8", err)
		}
	})
}

// TestOpaqueResourceVersions (defect 9.7): resourceVersions that are not
// numbers are positions only: resuming from one is a snapshot (which a
// client diffs), never a skip, and markers carry the API server's string.
func TestOpaqueResourceVersions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := newFakeUpstream()
	up.lists <- fakeList{objs: []*Object{obj("a", "x1", nil)}, rv: "x1"}
	steps := make(chan fakeStep, 10)
	up.watches <- steps
	s := startTestSource(t, up, LogLimits{})
	first := subscribe(t, ctx, s, Filter{}, "")
	if got := read(t, ctx, first, 2); !slices.Equal(got, []string{"ADDED a@x1", "SYNCED @x1"}) {
		t.Fatalf("snapshot = %v", got)
	}
	steps <- fakeStep{t: Added, obj: obj("b", "x2", nil), rv: "x2"}
	read(t, ctx, first, 1)
	for _, resume := range []string{"x1", "0", "1"} {
		sub := subscribe(t, ctx, s, Filter{}, resume)
		got := read(t, ctx, sub, 4)
		slices.Sort(got[1:3])
		if want := []string{"RESET @", "ADDED a@x1", "ADDED b@x2", "SYNCED @x2"}; !slices.Equal(got, want) {
			t.Errorf("resume from %q = %v, want %v", resume, got, want)
		}
	}
}

// TestBackoffResetsAfterAHealthyWatch (defect 9.2): after an outage grew
// the backoff, a watch that delivered something starts it over, so the
// next transient error costs a short wait, not the grown one.
func TestBackoffResetsAfterAHealthyWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream()
		up.lists <- fakeList{objs: nil, rv: "1"}
		watchOpened := make(chan time.Time, 8)
		up.onWatch = func() { watchOpened <- time.Now() }
		fail := func() chan fakeStep {
			ch := make(chan fakeStep, 2)
			ch <- fakeStep{err: apierrors.NewServiceUnavailable("down")}
			return ch
		}
		startTestSource(t, up, LogLimits{})
		for range 5 { // an outage: the backoff grows to 12.8s
			up.watches <- fail()
		}
		healthy := make(chan fakeStep, 2)
		healthy <- fakeStep{t: Bookmark, rv: "2"}
		healthy <- fakeStep{err: apierrors.NewServiceUnavailable("blip")}
		up.watches <- healthy
		up.watches <- make(chan fakeStep) // the watch after the blip
		var opened []time.Time
		for range 7 {
			opened = append(opened, <-watchOpened) // fake time runs the backoff
		}
		if grown := opened[5].Sub(opened[4]); grown < 6400*time.Millisecond {
			t.Fatalf("the outage's last wait was %s: the test needs a grown backoff", grown)
		}
		if after := opened[6].Sub(opened[5]); after > 800*time.Millisecond {
			t.Errorf("after a healthy watch the next retry waited %s, want at most the initial 800ms", after)
		}
	})
}

// TestRejectedRequestIsTerminal (defect 9.4): a request the API server
// rejects as invalid (a field selector it does not support) ends the
// Source at once with ErrRejected carrying the API server's message, and
// is not retried.
func TestRejectedRequestIsTerminal(t *testing.T) {
	up := newFakeUpstream()
	up.lists <- fakeList{err: apierrors.NewBadRequest(`field label not supported: spec.foo`)}
	s := startTestSource(t, up, LogLimits{})
	sub := newTestSubscription(s, Filter{})
	err := sub.start(t.Context(), "", "")
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "field label not supported: spec.foo") {
		t.Fatalf("start = %v, want ErrRejected with the API server's message", err)
	}
	<-s.done // ended, not retrying
}

// TestOversizedObjectsAreRefused (defect 9.8): an object larger than the
// limit is not served, visibly, and a stored object that grows past it is
// served as deleted rather than stale.
func TestOversizedObjectsAreRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	big := func(name, rv string) *Object {
		o := obj(name, rv, nil)
		o.Data = append(o.Data[:len(o.Data)-1], []byte(`,"pad":"`+strings.Repeat("x", 200)+`"}`)...)
		return o
	}
	up := newFakeUpstream()
	up.lists <- fakeList{objs: []*Object{obj("a", "1", nil), big("huge", "1")}, rv: "1"}
	steps := make(chan fakeStep, 10)
	up.watches <- steps
	cfg := testSourceConfig(LogLimits{MinAge: -1}, time.Hour)
	cfg.maxObjectBytes = 150
	s := newSource(Key{}, up, cfg)
	s.start(context.Background())
	t.Cleanup(s.stop)
	sub := subscribe(t, ctx, s, Filter{}, "")
	if got := read(t, ctx, sub, 2); !slices.Equal(got, []string{"ADDED a@1", "SYNCED @1"}) {
		t.Fatalf("snapshot = %v", got)
	}
	if msg := s.status().Message; !strings.Contains(msg, "ns/huge") || !strings.Contains(msg, "-max-object-bytes") {
		t.Errorf("status message %q does not name the refused object and the limit", msg)
	}
	steps <- fakeStep{t: Modified, obj: big("a", "2"), rv: "2"}
	ev, err := sub.Next(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(ev); !slices.Equal(got, []string{"DELETED a@2"}) {
		t.Fatalf("after a grew too large: %v, want DELETED a@2", got)
	}
}
