package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var widgets = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

// apiServerFake stands for the API server's discovery: what it serves
// (serve changes it) is what the mapper knows after its next Reset.
type apiServerFake struct {
	mu      sync.Mutex
	served  []schema.GroupVersionKind
	current *meta.DefaultRESTMapper // as read at the last Reset
	resets  atomic.Int32
	// onReset, if set, runs after each Reset with its count.
	onReset func(n int32)
}

func newAPIServerFake(served ...schema.GroupVersionKind) *apiServerFake {
	f := &apiServerFake{served: served}
	f.read()
	return f
}

func (f *apiServerFake) serve(gvk schema.GroupVersionKind) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.served = append(f.served, gvk)
}

func (f *apiServerFake) read() {
	f.mu.Lock()
	defer f.mu.Unlock()
	var gvs []schema.GroupVersion
	for _, gvk := range f.served {
		gvs = append(gvs, gvk.GroupVersion())
	}
	rm := meta.NewDefaultRESTMapper(gvs)
	for _, gvk := range f.served {
		scope := meta.RESTScopeNamespace
		if gvk.Kind == "CustomResourceDefinition" {
			scope = meta.RESTScopeRoot
		}
		rm.Add(gvk, scope)
	}
	f.current = rm
}

func (f *apiServerFake) Reset() {
	f.read()
	if n := f.resets.Add(1); f.onReset != nil {
		f.onReset(n)
	}
}

func (f *apiServerFake) mapper() meta.RESTMapper {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current
}

func (f *apiServerFake) KindFor(r schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	return f.mapper().KindFor(r)
}

func (f *apiServerFake) KindsFor(r schema.GroupVersionResource) ([]schema.GroupVersionKind, error) {
	return f.mapper().KindsFor(r)
}

func (f *apiServerFake) ResourceFor(r schema.GroupVersionResource) (schema.GroupVersionResource, error) {
	return f.mapper().ResourceFor(r)
}

func (f *apiServerFake) ResourcesFor(r schema.GroupVersionResource) ([]schema.GroupVersionResource, error) {
	return f.mapper().ResourcesFor(r)
}

func (f *apiServerFake) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	return f.mapper().RESTMapping(gk, versions...)
}

func (f *apiServerFake) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	return f.mapper().RESTMappings(gk, versions...)
}

func (f *apiServerFake) ResourceSingularizer(r string) (string, error) {
	return f.mapper().ResourceSingularizer(r)
}

var (
	configMapKind = schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	crdKind       = schema.GroupVersionKind{Group: crdResource.Group, Version: "v1", Kind: "CustomResourceDefinition"}
	widgetKind    = schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}
)

// newDiscoveryManager returns a Manager over api whose Sources list
// nothing, except the CRD informer, which lists crds.
func newDiscoveryManager(t *testing.T, api *apiServerFake, crds ...*Object) *Manager {
	t.Helper()
	opts, err := Options{Scope: ScopeCluster, Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(opts, api, func(key Key) upstream {
		up := newFakeUpstream()
		if key.GVR.GroupResource() == crdResource {
			up.lists <- fakeList{objs: crds, rv: "1"}
		} else {
			up.lists <- fakeList{rv: "1"}
		}
		return up
	})
	t.Cleanup(m.Close)
	return m
}

func subscribeTo(ctx context.Context, m *Manager, gvr schema.GroupVersionResource) error {
	s, err := m.Subscribe(ctx, Request{GVR: gvr, Owner: "test"})
	if err == nil {
		s.Close()
	}
	return err
}

// TestUnknownResourceIsAskedAfresh: a resource the API server started
// serving after the daemon's last reread of discovery is served, however
// recent that reread: the daemon never answers "not served" from a
// discovery read before the request came.
func TestUnknownResourceIsAskedAfresh(t *testing.T) {
	api := newAPIServerFake(configMapKind)
	m := newDiscoveryManager(t, api)
	if err := subscribeTo(t.Context(), m, widgets); !errors.Is(err, ErrUnknownResource) {
		t.Fatalf("widgets before they are served: %v, want ErrUnknownResource", err)
	}
	api.serve(widgetKind) // discovery was reread just now; the next one is a second away
	if err := subscribeTo(t.Context(), m, widgets); err != nil {
		t.Fatalf("widgets once served: %v", err)
	}
	if n := api.resets.Load(); n != 2 {
		t.Fatalf("discovery reread %d times, want 2 (once per request)", n)
	}
}

// TestDiscoveryRereadsAreRateLimitedAndShared: requests for resources that
// do not exist cost at most one reread of discovery a second; concurrent
// ones share one.
func TestDiscoveryRereadsAreRateLimitedAndShared(t *testing.T) {
	api := newAPIServerFake(configMapKind)
	m := newDiscoveryManager(t, api)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			gvr := schema.GroupVersionResource{Version: "v1", Resource: fmt.Sprintf("nothing%d", i)}
			if err := subscribeTo(t.Context(), m, gvr); !errors.Is(err, ErrUnknownResource) {
				t.Errorf("%s: %v, want ErrUnknownResource", gvr.Resource, err)
			}
		})
	}
	wg.Wait()
	if n := api.resets.Load(); n > 2 {
		t.Fatalf("50 concurrent requests for unknown resources reread discovery %d times, want at most 2", n)
	}

	start, before := time.Now(), api.resets.Load()
	for i := range 3 {
		if err := subscribeTo(t.Context(), m, schema.GroupVersionResource{Version: "v1", Resource: fmt.Sprintf("again%d", i)}); !errors.Is(err, ErrUnknownResource) {
			t.Fatalf("again%d: %v, want ErrUnknownResource", i, err)
		}
	}
	rereads, took := api.resets.Load()-before, time.Since(start)
	if rereads != 3 || took < 2*discoveryRetry {
		t.Fatalf("3 requests one after another reread discovery %d times in %s, want 3, a second apart", rereads, took)
	}
}

// crd returns a CustomResourceDefinition of widgets as the API server
// sends it, Established or not.
func crd(established bool) *Object {
	status := "False"
	if established {
		status = "True"
	}
	return &Object{Name: "widgets.example.com", ResourceVersion: "1", Data: []byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",` +
		`"metadata":{"name":"widgets.example.com"},` +
		`"spec":{"group":"example.com","names":{"plural":"widgets","kind":"Widget"},"scope":"Namespaced","versions":[{"name":"v1","served":true,"storage":true}]},` +
		`"status":{"conditions":[{"type":"NamesAccepted","status":"True"},{"type":"Established","status":"` + status + `"}]}}`)}
}

// TestEstablishedCRDWaitsForDiscovery: while the daemon's CRD informer
// shows a resource's CRD Established, a request for it waits for
// discovery to list it instead of answering "not served"; with the CRD not
// Established, or for another version, it does not wait.
func TestEstablishedCRDWaitsForDiscovery(t *testing.T) {
	crds := schema.GroupVersionResource{Group: crdResource.Group, Version: "v1", Resource: crdResource.Resource}
	for _, tc := range []struct {
		name        string
		established bool
		req         Request
		wantErr     error
	}{
		{"established", true, Request{GVR: widgets}, nil},
		{"by kind", true, Request{GVR: schema.GroupVersionResource{Group: "example.com"}, Kind: "Widget"}, nil},
		{"not established", false, Request{GVR: widgets}, ErrUnknownResource},
		{"another version", true, Request{GVR: schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "widgets"}}, ErrUnknownResource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newAPIServerFake(configMapKind, crdKind)
			m := newDiscoveryManager(t, api, crd(tc.established))
			crdSub, err := m.Subscribe(t.Context(), Request{GVR: crds, Owner: "applier"})
			if err != nil {
				t.Fatal(err)
			}
			defer crdSub.Close()
			// Discovery lists widgets only at its 3rd reread from now.
			base := api.resets.Load()
			api.onReset = func(n int32) {
				if n == base+2 {
					api.serve(widgetKind)
				}
			}
			tc.req.Owner = "test"
			s, err := m.Subscribe(t.Context(), tc.req)
			if !errors.Is(err, tc.wantErr) || err != nil && tc.wantErr == nil {
				t.Fatalf("Subscribe: %v, want %v", err, tc.wantErr)
			}
			if err == nil {
				s.Close()
			}
		})
	}
}
