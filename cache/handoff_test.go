package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/informerd/informerd/internal/handoff"
)

// recordingUpstream is a fakeUpstream that counts its lists and tells
// where each watch starts.
type recordingUpstream struct {
	*fakeUpstream
	lists atomic.Int32
	froms chan string
}

func newRecordingUpstream() *recordingUpstream {
	return &recordingUpstream{fakeUpstream: newFakeUpstream(), froms: make(chan string, 8)}
}

func (r *recordingUpstream) list(ctx context.Context) ([]*Object, string, error) {
	r.lists.Add(1)
	return r.fakeUpstream.list(ctx)
}

func (r *recordingUpstream) watch(ctx context.Context, from string) (watchStream, error) {
	r.froms <- from
	return r.fakeUpstream.watch(ctx, from)
}

// handoffManager returns a Manager (cluster scope) whose one upstream is up.
func handoffManager(t *testing.T, up upstream) *Manager {
	t.Helper()
	opts, err := Options{Scope: ScopeCluster, Logger: slog.New(slog.DiscardHandler), Log: LogLimits{MinAge: -1}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(opts, newStaticMapper(), func(Key) upstream { return up })
	t.Cleanup(m.Close)
	return m
}

// handOver writes frozen as the old daemon does and reads it back as the
// new one does.
func handOver(t *testing.T, frozen []Frozen) []handoff.Handed {
	t.Helper()
	var buf bytes.Buffer
	w := handoff.NewWriter(&buf)
	for _, f := range frozen {
		k := f.Key
		if err := w.WriteSource(handoff.Source{Group: k.GVR.Group, Version: k.GVR.Version, Resource: k.GVR.Resource,
			Namespace: k.Namespace, FieldSelector: k.FieldSelector, Protobuf: k.Protobuf,
			APIVersion: f.APIVersion, Kind: f.Kind, ResourceVersion: f.ResourceVersion, Count: f.Len}); err != nil {
			t.Fatal(err)
		}
		for o := range f.Objects() {
			if err := w.Object(o.Buffers()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := handoff.Read(&buf, handoff.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Sources
}

// TestHandoffResumesWithoutAListOrReset: a subscriber of a frozen Source
// gets a Bookmark at its position; the Manager the state is restored into
// watches the API server from that position without listing, and the
// subscriber resumes there from its log, with no Reset, then sees what the
// new watch brings. A new subscriber gets the handed-off objects.
func TestHandoffResumesWithoutAListOrReset(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	old := newRecordingUpstream()
	old.fakeUpstream.lists <- fakeList{objs: []*Object{uidObj("a", "3", "a1"), uidObj("b", "5", "b1")}, rv: "5"}
	w1 := make(chan fakeStep, 4)
	old.watches <- w1
	m1 := handoffManager(t, old)
	client, err := m1.Subscribe(ctx, Request{GVR: testGVR, Holder: "client", Owner: "client"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	held := state{}
	applyTo(t, held, readUntil(t, ctx, client, Synced, "5"))
	w1 <- fakeStep{t: Modified, obj: uidObj("a", "6", "a1"), rv: "6"}
	applyTo(t, held, readUntil(t, ctx, client, Modified, "6"))
	<-old.froms

	frozen, thaw := m1.Freeze()
	defer thaw()
	if len(frozen) != 1 || frozen[0].ResourceVersion != "6" || frozen[0].Len != 2 {
		t.Fatalf("frozen %+v, want one Source of 2 objects at 6", frozen)
	}
	positions, _ := applyTo(t, held, readUntil(t, ctx, client, Bookmark, "6"))
	if p := positions[len(positions)-1]; p != "6" {
		t.Fatalf("the subscriber's last position %q, want the handoff's Bookmark at 6", p)
	}
	client.Close()

	up := newRecordingUpstream()
	w2 := make(chan fakeStep, 4)
	up.watches <- w2
	m2 := handoffManager(t, up)
	if n, err := m2.Restore(handOver(t, frozen)); err != nil || n != 1 {
		t.Fatalf("Restore: %d, %v; want 1 Source", n, err)
	}
	if from := <-up.froms; from != "6" {
		t.Fatalf("the restored Source watches from %q, want the handoff's position 6", from)
	}
	resumed, err := m2.Subscribe(ctx, Request{GVR: testGVR, Resume: "6", Holder: "client", Owner: "client"})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	w2 <- fakeStep{t: Added, obj: uidObj("c", "7", "c1"), rv: "7"}
	evs := readUntil(t, ctx, resumed, Added, "7")
	for _, e := range evs {
		if e.Type == Reset || e.Type == Synced {
			t.Fatalf("the resumed subscriber got %v: it should resume from the log", describe(evs))
		}
	}
	applyTo(t, held, evs)
	want := state{"a": "a1@6", "b": "b1@5", "c": "c1@7"}
	if !maps.Equal(held, want) {
		t.Fatalf("the subscriber holds %v, want %v", held, want)
	}

	fresh, err := m2.Subscribe(ctx, Request{GVR: testGVR, Holder: "other", Owner: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	got := state{}
	applyTo(t, got, readUntil(t, ctx, fresh, Synced, "7"))
	if !maps.Equal(got, want) {
		t.Fatalf("a new subscriber holds %v, want %v", got, want)
	}
	if n := up.lists.Load(); n != 0 {
		t.Fatalf("the restored Manager listed %d times, want 0", n)
	}
}

// TestHandoffRelistsOnGone: a restored Source whose position the API
// server no longer serves lists, once, and its subscribers get the
// difference.
func TestHandoffRelistsOnGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := newRecordingUpstream()
	gone := make(chan fakeStep, 1)
	gone <- fakeStep{err: &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusGone, Reason: metav1.StatusReasonExpired}}}
	up.watches <- gone
	up.fakeUpstream.lists <- fakeList{objs: []*Object{uidObj("b", "9", "b1")}, rv: "9"}
	up.watches <- make(chan fakeStep)
	m := handoffManager(t, up)
	states := []handoff.Handed{{
		Source:  handoff.Source{Version: "v1", Resource: "configmaps", APIVersion: "v1", Kind: "ConfigMap", ResourceVersion: "6", Count: 1},
		Objects: [][]byte{uidObj("a", "6", "a1").Data},
	}}
	if _, err := m.Restore(states); err != nil {
		t.Fatal(err)
	}
	sub, err := m.Subscribe(ctx, Request{GVR: testGVR, Resume: "6", Holder: "client", Owner: "client"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	held := state{"a": "a1@6"}
	applyTo(t, held, readUntil(t, ctx, sub, Bookmark, "9"))
	if want := (state{"b": "b1@9"}); !maps.Equal(held, want) {
		t.Fatalf("after the relist the subscriber holds %v, want %v", held, want)
	}
	if n := up.lists.Load(); n != 1 {
		t.Fatalf("%d lists, want 1", n)
	}
}

// TestThawResumesTheWatch: a handoff that failed thaws the old Manager's
// Sources, which watch again from where they stopped.
func TestThawResumesTheWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up := newRecordingUpstream()
	up.fakeUpstream.lists <- fakeList{objs: []*Object{uidObj("a", "3", "a1")}, rv: "3"}
	w1 := make(chan fakeStep, 4)
	up.watches <- w1
	m := handoffManager(t, up)
	sub, err := m.Subscribe(ctx, Request{GVR: testGVR, Holder: "client", Owner: "client"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	readUntil(t, ctx, sub, Synced, "3")
	<-up.froms
	w1 <- fakeStep{t: Modified, obj: uidObj("a", "4", "a1"), rv: "4"}
	readUntil(t, ctx, sub, Modified, "4")
	frozen, thaw := m.Freeze()
	if len(frozen) != 1 || frozen[0].ResourceVersion != "4" {
		t.Fatalf("frozen %+v, want one Source at 4", frozen)
	}
	if again, _ := m.Freeze(); len(again) != 0 {
		t.Fatalf("a second Freeze froze %d Sources: a frozen Source is not frozen twice", len(again))
	}
	w2 := make(chan fakeStep, 4)
	up.watches <- w2
	thaw()
	if from := <-up.froms; from != "4" {
		t.Fatalf("thawed, the Source watches from %q, want 4", from)
	}
	w2 <- fakeStep{t: Modified, obj: uidObj("a", "5", "a1"), rv: "5"}
	readUntil(t, ctx, sub, Modified, "5")
	if n := up.lists.Load(); n != 1 {
		t.Fatalf("%d lists, want the first only", n)
	}
}

// TestRestoreRefusesABadState: an object that does not decode, or is not
// in its Key's format, fails the whole Restore, which starts nothing.
func TestRestoreRefusesABadState(t *testing.T) {
	for name, obj := range map[string][]byte{
		"not an object":               []byte(`{"metadata":`),
		"protobuf in a JSON informer": append([]byte("k8s\x00"), 0x0a),
	} {
		t.Run(name, func(t *testing.T) {
			m := handoffManager(t, newRecordingUpstream())
			states := []handoff.Handed{
				{Source: handoff.Source{Version: "v1", Resource: "configmaps", Namespace: "good", APIVersion: "v1", Kind: "ConfigMap", ResourceVersion: "6"}},
				{Source: handoff.Source{Version: "v1", Resource: "configmaps", APIVersion: "v1", Kind: "ConfigMap", ResourceVersion: "6", Count: 1}, Objects: [][]byte{obj}},
			}
			if n, err := m.Restore(states); err == nil || n != 0 {
				t.Fatalf("Restore: %d, %v; want an error and nothing started", n, err)
			}
			if got := m.Sources(); len(got) != 0 {
				t.Fatalf("%d Sources running after a failed Restore", len(got))
			}
		})
	}
}

// aggregatedAPI answers aggregated discovery (core v1: pods, configmaps
// "cm"), counting the calls, or fails each while down.
type aggregatedAPI struct {
	*discovery.DiscoveryClient // nil: anything else panics
	calls                      atomic.Int32
	down                       bool
}

func (a *aggregatedAPI) GroupsAndMaybeResources() (*metav1.APIGroupList, map[schema.GroupVersion]*metav1.APIResourceList, map[schema.GroupVersion]error, error) {
	return a.GroupsAndMaybeResourcesWithContext(context.Background())
}

func (a *aggregatedAPI) GroupsAndMaybeResourcesWithContext(context.Context) (*metav1.APIGroupList, map[schema.GroupVersion]*metav1.APIResourceList, map[schema.GroupVersion]error, error) {
	a.calls.Add(1)
	if a.down {
		return nil, nil, nil, errors.New("connection refused")
	}
	v1 := metav1.GroupVersionForDiscovery{GroupVersion: "v1", Version: "v1"}
	groups := &metav1.APIGroupList{Groups: []metav1.APIGroup{{Versions: []metav1.GroupVersionForDiscovery{v1}, PreferredVersion: v1}}}
	res := map[schema.GroupVersion]*metav1.APIResourceList{{Version: "v1"}: {GroupVersion: "v1", APIResources: []metav1.APIResource{
		{Name: "pods", Namespaced: true, Kind: "Pod", Verbs: []string{"list", "watch"}},
		{Name: "configmaps", Namespaced: true, Kind: "ConfigMap", Verbs: []string{"list", "watch"}, ShortNames: []string{"cm"}},
	}}}
	return groups, res, nil, nil
}

// A Manager hands off the discovery it read, and only once it read it; a
// Manager given it maps resources and short names from it without asking
// the API server, which is down.
func TestDiscoveryHandedOff(t *testing.T) {
	up := &aggregatedAPI{}
	old := &Manager{}
	old.disc.Store(newDiscoveryState(up))
	if _, ok := old.HandedDiscovery(); ok {
		t.Fatal("a discovery never read was handed off")
	}
	if _, err := old.mapping(Request{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}}); err != nil {
		t.Fatal(err)
	}
	d, ok := old.HandedDiscovery()
	if !ok {
		t.Fatal("the discovery read was not handed off")
	}
	if up.calls.Load() != 1 {
		t.Fatalf("the API server was asked %d times, want once (HandedDiscovery asks nothing)", up.calls.Load())
	}
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var handed HandedDiscovery
	if err := json.Unmarshal(data, &handed); err != nil {
		t.Fatal(err)
	}

	down := &aggregatedAPI{down: true}
	nu := &Manager{}
	nu.disc.Store(newDiscoveryState(handed.over(down)))
	for _, r := range []string{"pods", "configmaps", "cm"} {
		mp, err := nu.mapping(Request{GVR: schema.GroupVersionResource{Resource: r}})
		if err != nil {
			t.Fatalf("%s on the new daemon: %v", r, err)
		}
		if mp.Resource.Resource == "" || mp.Scope.Name() != "namespace" {
			t.Errorf("%s mapped to %+v", r, mp)
		}
	}
	if _, err := nu.mapping(Request{GVR: schema.GroupVersionResource{Resource: "widgets"}}); err == nil {
		t.Error("a resource the handed-off discovery does not list was mapped")
	}
	if down.calls.Load() != 0 {
		t.Fatalf("the new daemon asked the API server %d times, want none", down.calls.Load())
	}
	if again, ok := nu.HandedDiscovery(); !ok || len(again.Resources) != 1 {
		t.Errorf("the new daemon hands on %+v (%v), want the same discovery", again, ok)
	}
}
