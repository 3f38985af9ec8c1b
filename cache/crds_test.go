package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
)

var widgetGR = widgets.GroupResource()

func crdMeta(name string, deleting bool) *metav1.PartialObjectMetadata {
	o := &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: "u-" + types.UID(name), Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...a whole CRD...}"}},
	}
	if deleting {
		now := metav1.Now()
		o.DeletionTimestamp = &now
		o.Finalizers = []string{"customresourcecleanup.apiextensions.k8s.io"}
	}
	return o
}

// TestCRDWatchRemembersDeletedCRDsBounded: a CRD seen deleted makes its
// resource ErrResourceRemoved (and ErrUnknownResource) until it is created
// again or removedTTL passes, at most maxRemoved of them at once (the
// oldest forgotten first); deletions missed while the watch was down
// count; resources no CRD can serve are never affected.
func TestCRDWatchRemembersDeletedCRDsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	var told []schema.GroupResource
	w := newCRDWatch(metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme()), func(gr schema.GroupResource) { told = append(told, gr) })
	w.now = func() time.Time { return now }

	w.present(crdMeta("widgets.example.com", false))
	if err := w.removedErr(widgetGR); err != nil {
		t.Fatalf("a CRD present: %v", err)
	}
	w.gone(crdMeta("widgets.example.com", true))
	err := w.removedErr(widgetGR)
	if !errors.Is(err, ErrResourceRemoved) || !errors.Is(err, ErrUnknownResource) {
		t.Fatalf("a CRD deleted: %v, want ErrResourceRemoved and ErrUnknownResource", err)
	}
	if len(told) != 1 || told[0] != widgetGR {
		t.Fatalf("told %v, want [%v]", told, widgetGR)
	}
	for _, gr := range []schema.GroupResource{{Group: "example.com", Resource: "gadgets"}, {Group: "apps", Resource: "deployments"}, {Resource: "widgets"}} {
		if err := w.removedErr(gr); err != nil {
			t.Errorf("%v, whose CRD was not deleted: %v", gr, err)
		}
	}

	w.present(crdMeta("widgets.example.com", false)) // created again
	if err := w.removedErr(widgetGR); err != nil {
		t.Fatalf("a CRD created again: %v", err)
	}

	w.gone(toolscache.DeletedFinalStateUnknown{Key: "widgets.example.com"}) // missed while the watch was down
	if err := w.removedErr(widgetGR); !errors.Is(err, ErrResourceRemoved) {
		t.Fatalf("a deletion found by a relist: %v", err)
	}
	now = now.Add(removedTTL)
	if err := w.removedErr(widgetGR); err != nil {
		t.Fatalf("removedTTL after the deletion: %v, want it forgotten", err)
	}

	for i := range maxRemoved + 10 {
		now = now.Add(time.Millisecond)
		w.gone(crdMeta(fmt.Sprintf("r%d.example.com", i), true))
	}
	w.mu.Lock()
	n := len(w.removed)
	w.mu.Unlock()
	if n > maxRemoved {
		t.Fatalf("%d deleted CRDs remembered, want at most %d", n, maxRemoved)
	}
	if err := w.removedErr(schema.GroupResource{Group: "example.com", Resource: fmt.Sprintf("r%d", maxRemoved+9)}); err == nil {
		t.Errorf("the newest deletion was forgotten")
	}
	if err := w.removedErr(schema.GroupResource{Group: "example.com", Resource: "r0"}); err != nil {
		t.Errorf("the oldest deletion is still remembered past the bound: %v", err)
	}
}

// TestSlimCRDKeepsOnlyWhatIsRead: the store of CRDs keeps their name, uid,
// resourceVersion and deletionTimestamp, not their annotations (a whole
// CRD in kubectl's last-applied-configuration) or finalizers.
func TestSlimCRDKeepsOnlyWhatIsRead(t *testing.T) {
	in := crdMeta("widgets.example.com", true)
	in.ResourceVersion = "7"
	got, err := slimCRD(in)
	if err != nil {
		t.Fatal(err)
	}
	o := got.(*metav1.PartialObjectMetadata)
	if o.Name != in.Name || o.UID != in.UID || o.ResourceVersion != "7" || o.DeletionTimestamp == nil ||
		o.Annotations != nil || o.Finalizers != nil {
		t.Fatalf("slimmed to %+v", o)
	}
}

// crdFixture is a Manager that maps configmaps and widgets.example.com,
// whose Sources list nothing and then watch quietly, and whose watch of
// CRDs reads a fake API server's widgets.example.com CRD.
type crdFixture struct {
	m      *Manager
	mapper *staticMapper
	crds   *metadatafake.FakeMetadataClient
}

func newCRDFixture(t *testing.T) *crdFixture {
	t.Helper()
	opts, err := Options{Scope: ScopeCluster, Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	mapper := newStaticMapper()
	mapper.RESTMapper.(*meta.DefaultRESTMapper).Add(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, meta.RESTScopeNamespace)
	m := newManager(opts, mapper, func(Key) upstream {
		up := newFakeUpstream()
		up.lists <- fakeList{rv: "1"}
		return up
	})
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	f := &crdFixture{m: m, mapper: mapper, crds: metadatafake.NewSimpleMetadataClient(scheme, crdMeta("widgets.example.com", false))}
	m.crds = newCRDWatch(f.crds, m.crdDeleted)
	t.Cleanup(m.Close)
	return f
}

func (f *crdFixture) crdClient() metadatafake.MetadataClient {
	return f.crds.Resource(crdGVR).(metadatafake.MetadataClient)
}

// until polls cond, which the fixture's informer of CRDs makes true.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestManagerAnswersForADeletedCRDAtOnce: the first request for a custom
// resource starts the watch of CRDs. While its CRD terminates, callers'
// new subscriptions fail with ErrCRDTerminating (the daemon's own, and
// subscriptions already open, read on); once it is deleted, open
// subscriptions end with ErrResourceRemoved after what they had, new ones
// fail with it at once, without an upstream request, discovery is reread
// in the background (and none is waited for once it no longer lists the
// resource), and a request that waits for the resource gets it once the
// CRD is created again.
func TestManagerAnswersForADeletedCRDAtOnce(t *testing.T) {
	f := newCRDFixture(t)
	m := f.m
	ctx := t.Context()
	req := Request{GVR: widgets, Owner: "caller", Holder: "test"}
	open, err := m.Subscribe(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if !m.crds.started.Load() {
		t.Fatal("a subscription to a custom resource did not start the watch of CRDs")
	}
	until(t, "the watch of CRDs synced and watching", func() bool {
		// The fake API server tells a watch only what happens after it.
		return m.crds.synced() && slices.ContainsFunc(f.crds.Actions(), func(a clienttesting.Action) bool { return a.GetVerb() == "watch" })
	})
	if evs, err := open.Next(ctx, 10); err != nil || len(evs) != 1 || evs[0].Type != Synced {
		t.Fatalf("snapshot: %v %v, want SYNCED", evs, err)
	}

	if _, err := f.crdClient().UpdateFake(crdMeta("widgets.example.com", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, "the CRD seen terminating", func() bool { return m.terminatingErr(widgetGR) != nil })
	if _, err := m.Subscribe(ctx, req); !errors.Is(err, ErrCRDTerminating) {
		t.Fatalf("a caller's subscription while the CRD terminates: %v, want ErrCRDTerminating", err)
	}
	internal := req
	internal.Owner = OwnerInternal
	own, err := m.Subscribe(ctx, internal)
	if err != nil {
		t.Fatalf("the daemon's own subscription while the CRD terminates: %v", err)
	}
	defer own.Close()

	resets := f.mapper.resets.Load()
	if err := f.crds.Resource(crdGVR).Delete(ctx, "widgets.example.com", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, sub := range map[string]*Subscription{"a caller's": open, "the daemon's": own} {
		var err error
		for err == nil {
			_, err = sub.Next(ctx, 10)
		}
		if !errors.Is(err, ErrResourceRemoved) {
			t.Errorf("%s open subscription ended with %v, want ErrResourceRemoved", name, err)
		}
	}
	_, err = m.Subscribe(ctx, req)
	if !errors.Is(err, ErrResourceRemoved) || !errors.Is(err, ErrUnknownResource) {
		t.Fatalf("a subscription after the delete: %v, want ErrResourceRemoved", err)
	}
	if _, err := m.Get(ctx, req, "w"); !errors.Is(err, ErrResourceRemoved) {
		t.Fatalf("a Get after the delete: %v, want ErrResourceRemoved", err)
	}
	if _, _, err := m.ResolveResource(ctx, req); !errors.Is(err, ErrUnknownResource) {
		t.Fatalf("ResolveResource after the delete: %v, want ErrUnknownResource", err)
	}
	until(t, "discovery reread", func() bool { return f.mapper.resets.Load() > resets })

	// Discovery no longer lists it: still at once, without a reread.
	reread := newStaticMapper()
	m.disc.Store(&discoveryState{mapper: reread, generation: m.DiscoveryGeneration() + 1})
	if _, err := m.Subscribe(ctx, req); !errors.Is(err, ErrResourceRemoved) {
		t.Fatalf("a subscription once discovery dropped the resource: %v, want ErrResourceRemoved", err)
	}
	if n := reread.resets.Load(); n != 0 {
		t.Fatalf("discovery reread %d times for a resource whose CRD was seen deleted, want none", n)
	}
	m.disc.Store(&discoveryState{mapper: f.mapper, generation: m.DiscoveryGeneration() + 1})

	waiting := req
	waiting.WaitForResource = true
	got := make(chan error, 1)
	go func() {
		sub, err := m.Subscribe(ctx, waiting)
		if err == nil {
			sub.Close()
		}
		got <- err
	}()
	if _, err := f.crdClient().CreateFake(crdMeta("widgets.example.com", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a subscription waiting for the resource, after the CRD was created again: %v", err)
	}
	if _, err := m.Subscribe(ctx, req); err != nil {
		t.Fatalf("a subscription after the CRD was created again: %v", err)
	}
}

// TestManagerDeletedCRDEndsOnlyItsSources: a CRD's deletion ends the
// Sources of its resource, every version and namespace, and no other.
func TestManagerDeletedCRDEndsOnlyItsSources(t *testing.T) {
	f := newCRDFixture(t)
	m := f.m
	ctx := t.Context()
	var subs []*Subscription
	for _, req := range []Request{
		{GVR: widgets, Namespace: "a"}, {GVR: widgets, FieldSelector: "metadata.name=x"}, {GVR: testGVR},
	} {
		req.Owner, req.Holder = "caller", "test"
		sub, err := m.Subscribe(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		subs = append(subs, sub)
	}
	m.crdDeleted(widgetGR)
	for i, sub := range subs {
		sub.source().mu.Lock()
		terminal := sub.source().terminal
		sub.source().mu.Unlock()
		if i < 2 {
			<-sub.source().done
			sub.source().mu.Lock()
			terminal = sub.source().terminal
			sub.source().mu.Unlock()
			if !errors.Is(terminal, ErrResourceRemoved) {
				t.Errorf("%s: ended with %v, want ErrResourceRemoved", sub.Key(), terminal)
			}
		} else if terminal != nil || sub.source().stopped() {
			t.Errorf("%s, another resource: ended with %v", sub.Key(), terminal)
		}
	}
}
