package cache

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// TestManagerExistingInformerOnly: a request that asks for an existing
// informer only is served by one that runs or lingers for its Key, and
// otherwise fails with ErrNoInformer, starting nothing.
func TestManagerExistingInformerOnly(t *testing.T) {
	m, _, made := newTestManager(t, Options{LingerTTL: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := Request{GVR: testGVR, FieldSelector: "metadata.name=a", Holder: "h", Owner: "test", ExistingInformerOnly: true}
	if _, err := m.Subscribe(ctx, req); !errors.Is(err, ErrNoInformer) {
		t.Fatalf("with no informer: %v, want ErrNoInformer", err)
	}
	if made.Load() != 0 || len(m.Sources()) != 0 {
		t.Fatalf("with no informer: %d upstreams made, %d Sources, want none", made.Load(), len(m.Sources()))
	}
	// One started by a request that may start one (a watch), then left to linger.
	started := req
	started.ExistingInformerOnly = false
	s, err := m.Subscribe(ctx, started)
	if err != nil {
		t.Fatal(err)
	}
	if !s.StartedSource() {
		t.Error("the subscription that started the Source: StartedSource false")
	}
	s.Close()
	s, err = m.Subscribe(ctx, req)
	if err != nil {
		t.Fatalf("with a lingering informer: %v", err)
	}
	defer s.Close()
	if s.StartedSource() {
		t.Error("a subscription to a lingering Source: StartedSource true")
	}
	if made.Load() != 1 {
		t.Fatalf("%d upstreams made, want the one", made.Load())
	}
	// Another Key: none.
	other := req
	other.FieldSelector = "metadata.name=b"
	if _, err := m.Subscribe(ctx, other); !errors.Is(err, ErrNoInformer) || made.Load() != 1 {
		t.Fatalf("another key: %v with %d upstreams, want ErrNoInformer and no new one", err, made.Load())
	}
}

// TestOneObjectFromABroaderInformer (issue 28): a request whose field
// selector names one object (metadata.name=NAME, with its namespace or
// not) is served by a running informer of all the objects, filtered to
// that one, in snapshots, events, resumes, Get and List; with no such
// informer it is a Key of its own (ErrNoInformer for a one-off read).
func TestOneObjectFromABroaderInformer(t *testing.T) {
	opts, err := Options{Scope: ScopeCluster, LingerTTL: time.Hour, Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	steps := make(chan fakeStep)
	var made atomic.Int32
	m := newManager(opts, newStaticMapper(), func(Key) upstream {
		made.Add(1)
		up := newFakeUpstream()
		up.lists <- fakeList{objs: []*Object{obj("a", "2", nil), obj("b", "3", nil)}, rv: "3"}
		up.watches <- steps
		return up
	})
	t.Cleanup(m.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	oneOff := Request{GVR: testGVR, Namespace: "ns", FieldSelector: "metadata.name=a", Holder: "kubectl", Owner: "test", ExistingInformerOnly: true}
	if _, err := m.Subscribe(ctx, oneOff); !errors.Is(err, ErrNoInformer) || made.Load() != 0 {
		t.Fatalf("with no informer: %v, %d upstreams; want ErrNoInformer and none", err, made.Load())
	}
	all, err := m.Subscribe(ctx, Request{GVR: testGVR, Holder: "agent", Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	readUntil(t, ctx, all, Synced, "3")

	for _, fs := range []string{"metadata.name=a", "metadata.name==a,metadata.namespace=ns"} {
		req := oneOff
		req.FieldSelector = fs
		s, err := m.Subscribe(ctx, req)
		if err != nil {
			t.Fatalf("%s with an informer of all: %v", fs, err)
		}
		if s.Key() != all.Key() || made.Load() != 1 {
			t.Fatalf("%s served by %s (%d upstreams), want %s", fs, s.Key(), made.Load(), all.Key())
		}
		if got, want := describe(readUntil(t, ctx, s, Synced, "3")), []string{"ADDED a@2", "SYNCED @3"}; !slices.Equal(got, want) {
			t.Errorf("%s: snapshot %q, want %q", fs, got, want)
		}
		if _, ok := s.Get("ns", "b"); ok {
			t.Errorf("%s: Get of b found it", fs)
		}
		if o, ok := s.Get("ns", "a"); !ok || o.Name != "a" {
			t.Errorf("%s: Get of a: %v %v", fs, o, ok)
		}
		if l := s.List("", nil); len(l) != 1 || l[0].Name != "a" {
			t.Errorf("%s: List has %d objects, want a alone", fs, len(l))
		}
		s.Close()
	}
	// Events and a resume: only a's.
	resumed := oneOff
	resumed.Resume = "3"
	s, err := m.Subscribe(ctx, resumed)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	steps <- fakeStep{t: Modified, obj: obj("b", "4", nil), rv: "4"}
	steps <- fakeStep{t: Modified, obj: obj("a", "5", nil), rv: "5"}
	steps <- fakeStep{t: Bookmark, rv: "6"}
	if got, want := describe(readUntil(t, ctx, s, Bookmark, "6")), []string{"MODIFIED a@5", "BOOKMARK @6"}; !slices.Equal(got, want) {
		t.Errorf("resumed at 3: %q, want %q", got, want)
	}
	// Other selectors keep a Key of their own.
	for _, fs := range []string{"metadata.name!=a", "metadata.name=a,metadata.namespace=other", "metadata.name=a,spec.x=y", "metadata.namespace=ns"} {
		req := oneOff
		req.FieldSelector = fs
		if _, err := m.Subscribe(ctx, req); !errors.Is(err, ErrNoInformer) {
			t.Errorf("%s: %v, want ErrNoInformer", fs, err)
		}
	}
}
