package cache

import (
	"context"
	"errors"

	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var testGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// staticMapper knows configmaps and counts discovery refreshes.
type staticMapper struct {
	meta.RESTMapper
	resets atomic.Int32
}

func (m *staticMapper) Reset() { m.resets.Add(1) }

func newStaticMapper() *staticMapper {
	rm := meta.NewDefaultRESTMapper(nil)
	rm.Add(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, meta.RESTScopeNamespace)
	return &staticMapper{RESTMapper: rm}
}

// newTestManager returns a Manager whose Sources list nothing and then
// watch quietly, with a count of the upstreams it made.
func newTestManager(t *testing.T, opts Options) (*Manager, *staticMapper, *atomic.Int32) {
	t.Helper()
	opts.Scope = ScopeCluster
	opts.Logger = slog.New(slog.DiscardHandler)
	opts, err := opts.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	mapper := newStaticMapper()
	var made atomic.Int32
	m := newManager(opts, mapper, func(Key) upstream {
		made.Add(1)
		up := newFakeUpstream()
		up.lists <- fakeList{rv: "1"}
		return up
	})
	t.Cleanup(m.Close)
	return m, mapper, &made
}

func (m *Manager) entryFor(t *testing.T, key Key) *entry {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sources[key]
}

func sub(t *testing.T, m *Manager, ns, holder, owner string) (*Subscription, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.Subscribe(ctx, Request{GVR: testGVR, Namespace: ns, FieldSelector: ns, Holder: holder, Owner: owner})
}

func mustSub(t *testing.T, m *Manager, ns, holder, owner string) *Subscription {
	t.Helper()
	s, err := sub(t, m, ns, holder, owner)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestManagerRefCounts: subscriptions of one Key share one Source, counted
// per holder; the last one to close leaves it lingering, and a new
// subscription takes it back without a new upstream.
func TestManagerRefCounts(t *testing.T) {
	m, _, made := newTestManager(t, Options{LingerTTL: time.Hour})
	a := mustSub(t, m, "", "a", "test")
	b := mustSub(t, m, "", "b", "test")
	c := mustSub(t, m, "", "b", "test")
	if a.source() != b.source() || b.source() != c.source() || made.Load() != 1 {
		t.Fatalf("3 subscriptions of one key made %d upstreams", made.Load())
	}
	infos := m.Sources()
	if len(infos) != 1 || infos[0].RefCount != 3 || !slices.Equal(infos[0].Holders, []string{"a", "b"}) {
		t.Fatalf("Sources() = %+v, want one with 3 refs held by a and b", infos)
	}
	a.Close()
	a.Close() // idempotent
	b.Close()
	c.Close()
	if infos := m.Sources(); len(infos) != 1 || infos[0].RefCount != 0 || len(infos[0].Holders) != 0 {
		t.Fatalf("after closing: %+v, want one lingering Source", infos)
	}
	d := mustSub(t, m, "", "d", "test")
	defer d.Close()
	if d.source() != a.source() || made.Load() != 1 || d.source().stopped() {
		t.Fatal("re-subscribing within the linger TTL did not reuse the lingering Source")
	}
}

// TestManagerEvictionInterleavings: an eviction that races with a new
// subscription, or with the Source lingering again, leaves it running; an
// eviction of an unused Source stops it.
func TestManagerEvictionInterleavings(t *testing.T) {
	m, _, made := newTestManager(t, Options{LingerTTL: time.Hour})
	key := Key{GVR: testGVR}
	s1 := mustSub(t, m, "", "x", "test")
	e := m.entryFor(t, key)

	// Re-acquired: the LRU evicts it just after a subscriber took it back.
	m.onEvict(key, e)
	m.wg.Wait()
	if e.src.stopped() || m.entryFor(t, key) != e {
		t.Fatal("an eviction stopped a Source that is in use")
	}

	// Lingering again before the eviction's goroutine ran.
	s1.Close()
	m.onEvict(key, e)
	m.wg.Wait()
	if e.src.stopped() {
		t.Fatal("an eviction stopped a Source that lingers again")
	}

	// A real eviction: gone from the LRU and unused.
	m.lru.Remove(key)
	m.wg.Wait()
	if !e.src.stopped() || m.entryFor(t, key) != nil {
		t.Fatal("an evicted unused Source still runs")
	}
	s2 := mustSub(t, m, "", "x", "test")
	defer s2.Close()
	if s2.source() == e.src || made.Load() != 2 {
		t.Fatal("a subscription after eviction did not start a new Source")
	}
}

// TestManagerLingerTTLExpires: an unused Source stops after the linger
// TTL (the LRU's own expiry, in real time).
func TestManagerLingerTTLExpires(t *testing.T) {
	m, _, _ := newTestManager(t, Options{LingerTTL: 50 * time.Millisecond})
	s := mustSub(t, m, "", "x", "test")
	src := s.source()
	s.Close()
	select {
	case <-src.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the lingering Source never stopped")
	}
	m.wg.Wait()
	if len(m.Sources()) != 0 {
		t.Fatalf("after expiry: %+v", m.Sources())
	}
}

// TestManagerReplacesAStoppedSource: a Source that ended (its resource
// was removed) is not lingered, and a new subscription gets a new one even
// while old subscribers still drain the stopped one.
func TestManagerReplacesAStoppedSource(t *testing.T) {
	m, _, made := newTestManager(t, Options{LingerTTL: time.Hour})
	old := mustSub(t, m, "", "x", "test")
	old.source().stop()
	fresh := mustSub(t, m, "", "y", "test")
	defer fresh.Close()
	if fresh.source() == old.source() || made.Load() != 2 {
		t.Fatal("a new subscription was given the stopped Source")
	}
	old.Close() // releasing the replaced entry must not touch the new one
	if e := m.entryFor(t, Key{GVR: testGVR}); e == nil || e.src != fresh.source() || e.refs != 1 {
		t.Fatalf("after the old holder left, the key maps to %+v", e)
	}
}

// TestManagerMaxSources: at the limit, a new Source replaces the least
// recently used lingering one; when none lingers the request fails with
// ErrLimit and the running ones are untouched.
func TestManagerMaxSources(t *testing.T) {
	m, _, _ := newTestManager(t, Options{LingerTTL: time.Hour, MaxSources: 2})
	a := mustSub(t, m, "a", "x", "test")
	b := mustSub(t, m, "b", "x", "test")
	a.Close() // lingers
	c := mustSub(t, m, "c", "x", "test")
	defer c.Close()
	defer b.Close()
	m.wg.Wait()
	if !a.source().stopped() || b.source().stopped() {
		t.Fatal("the lingering Source was not the one stopped for a new one")
	}
	if _, err := sub(t, m, "d", "x", "test"); !errors.Is(err, ErrLimit) {
		t.Fatalf("a 3rd Source with 2 in use: %v, want ErrLimit", err)
	}
	if b.source().stopped() || c.source().stopped() {
		t.Fatal("a refused request stopped a Source in use")
	}
}

// TestManagerMaxSourcesPerOwner: one owner holds at most N distinct
// Sources; sharing one it holds already is free, other owners are not
// affected, and closing frees a slot.
func TestManagerMaxSourcesPerOwner(t *testing.T) {
	m, _, _ := newTestManager(t, Options{LingerTTL: time.Hour, MaxSourcesPerOwner: 2})
	a := mustSub(t, m, "a", "x", "mallory")
	b := mustSub(t, m, "b", "x", "mallory")
	again := mustSub(t, m, "a", "x", "mallory") // a Source it holds already
	defer again.Close()
	defer b.Close()
	if _, err := sub(t, m, "c", "x", "mallory"); !errors.Is(err, ErrLimit) {
		t.Fatalf("a 3rd distinct Source for one owner: %v, want ErrLimit", err)
	}
	other := mustSub(t, m, "c", "x", "alice")
	defer other.Close()
	a.Close()
	if _, err := sub(t, m, "c", "x", "mallory"); !errors.Is(err, ErrLimit) {
		t.Fatal("closing one of two holds of a Source freed a slot")
	}
	again.Close()
	d := mustSub(t, m, "c", "x", "mallory")
	d.Close()
}

// TestManagerHoldCountsForItsOwner: what a component reads on a caller's
// behalf is held under the caller's Owner first (Hold), so it counts
// against the caller's limit; the component's own subscriptions
// (OwnerInternal) are not limited; and nothing subscribes without an
// Owner.
func TestManagerHoldCountsForItsOwner(t *testing.T) {
	m, _, _ := newTestManager(t, Options{LingerTTL: time.Hour, MaxSourcesPerOwner: 1})
	ctx := t.Context()
	held, err := m.Hold(ctx, Request{GVR: testGVR, Namespace: "a", FieldSelector: "a", Owner: "mallory", Holder: "status"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if e := m.entryFor(t, held.Key()); e == nil || e.owners["mallory"] != 1 {
		t.Fatalf("Hold did not acquire %v for its owner", held.Key())
	}
	if _, err := m.Hold(ctx, Request{GVR: testGVR, Namespace: "b", FieldSelector: "b", Owner: "mallory"}); !errors.Is(err, ErrLimit) {
		t.Fatalf("a 2nd held Source for one owner: %v, want ErrLimit", err)
	}
	for _, ns := range []string{"a", "b"} {
		s := mustSub(t, m, ns, "status", OwnerInternal)
		defer s.Close()
	}
	if _, err := m.Subscribe(ctx, Request{GVR: testGVR}); err == nil || !strings.Contains(err.Error(), "Owner is required") {
		t.Fatalf("Subscribe without an Owner: %v", err)
	}
}

// TestManagerCloseStopsSubscribers: Close stops every Source and its
// subscribers read ErrStopped.
func TestManagerCloseStopsSubscribers(t *testing.T) {
	m, _, _ := newTestManager(t, Options{})
	s := mustSub(t, m, "", "x", "test")
	defer s.Close()
	read(t, t.Context(), s, 1) // SYNCED
	m.Close()
	if _, err := s.Next(t.Context(), 10); !errors.Is(err, ErrStopped) {
		t.Fatalf("Next after Close = %v, want ErrStopped", err)
	}
	if _, err := sub(t, m, "", "y", "test"); !errors.Is(err, ErrStopped) {
		t.Fatalf("Subscribe after Close = %v, want ErrStopped", err)
	}
}

// TestKeyStringQuotesALongFieldSelectorShort: a Key names itself in
// errors and logs; the field selector, a client's input of up to 4 KiB,
// appears in at most quote.Max bytes of it.
func TestKeyStringQuotesALongFieldSelectorShort(t *testing.T) {
	long := "metadata.name=" + strings.Repeat("x", 2000)
	s := Key{GVR: testGVR, FieldSelector: long}.String()
	if strings.Contains(s, strings.Repeat("x", 65)) || !strings.Contains(s, "(2014 bytes)") {
		t.Fatalf("Key.String() = %q, want the selector cut to 64 bytes and its length", s)
	}
	if s := (Key{GVR: testGVR, FieldSelector: "a=b"}).String(); !strings.HasSuffix(s, " fields a=b") {
		t.Fatalf("Key.String() = %q, want a short selector as it is", s)
	}
}

// TestRemovedResourceRereadsDiscovery: a Subscribe whose resource the API
// server no longer serves (its list answers 404: the CRD was deleted, or
// re-created serving another version, while discovery was cached) rereads
// discovery, so that the next lookup maps the kind as it is now instead of
// to the removed version again, forever.
func TestRemovedResourceRereadsDiscovery(t *testing.T) {
	opts, err := Options{Scope: ScopeCluster, Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	mapper := newStaticMapper()
	m := newManager(opts, mapper, func(Key) upstream {
		up := newFakeUpstream()
		up.lists <- fakeList{err: apierrors.NewNotFound(testGVR.GroupResource(), "")}
		return up
	})
	t.Cleanup(m.Close)
	_, err = m.Subscribe(t.Context(), Request{GVR: testGVR, Owner: "test"})
	if !errors.Is(err, ErrResourceRemoved) {
		t.Fatalf("Subscribe of a resource whose list is 404: %v, want ErrResourceRemoved", err)
	}
	if n := mapper.resets.Load(); n != 1 {
		t.Fatalf("discovery reread %d times after the resource was found removed, want 1", n)
	}
}
