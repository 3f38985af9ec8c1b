package client

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// discoveryDaemon answers GetDiscovery with core ConfigMaps, plus Widgets
// once widgets is set; a request naming Widgets sets it (as the daemon
// answers once its discovery lists what the request names), one naming
// anything else unknown is NOT_FOUND.
type discoveryDaemon struct {
	informerdv1.UnimplementedInformerServiceServer
	mu      sync.Mutex
	widgets bool
	reqs    []string // the kind or resource each request named, "" for none
}

func (d *discoveryDaemon) GetDiscovery(_ context.Context, req *informerdv1.GetDiscoveryRequest) (*informerdv1.GetDiscoveryResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	need := req.GetKind() + req.GetResource().GetResource()
	d.reqs = append(d.reqs, need)
	switch need {
	case "", "ConfigMap", "configmaps":
	case "Widget", "widgets":
		d.widgets = true
	default:
		return nil, status.Errorf(codes.NotFound, "informerd: unknown resource: the API server does not serve %s", need)
	}
	resp := &informerdv1.GetDiscoveryResponse{Groups: []*informerdv1.APIGroup{{
		PreferredVersion: "v1",
		Versions: []*informerdv1.APIGroupVersion{{Version: "v1", Resources: []*informerdv1.APIResource{
			{Name: "configmaps", SingularName: "configmap", Kind: "ConfigMap", Namespaced: true, Verbs: []string{"list", "watch"}, ShortNames: []string{"cm"}},
		}}},
	}}}
	if d.widgets {
		resp.Groups = append(resp.Groups, &informerdv1.APIGroup{Name: "example.com", PreferredVersion: "v1", Versions: []*informerdv1.APIGroupVersion{{
			Version: "v1", Resources: []*informerdv1.APIResource{{Name: "widgets", SingularName: "widget", Kind: "Widget", Verbs: []string{"list", "watch"}}},
		}}})
	}
	return resp, nil
}

// TestRESTMapper: the mapper maps from the daemon's discovery, fetched
// once; a kind it does not know is asked of the daemon, which answers once
// it serves it; one the daemon says is not served is a NoMatch error, as
// from client-go's discovery mappers; Reset fetches again.
func TestRESTMapper(t *testing.T) {
	d := &discoveryDaemon{}
	m := NewRESTMapper(serveScripted(t, d))
	mapping, err := m.RESTMapping(schema.GroupKind{Kind: "ConfigMap"})
	if err != nil || mapping.Resource.Resource != "configmaps" || mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		t.Fatalf("ConfigMap: %+v, %v", mapping, err)
	}
	if gvk, err := m.KindFor(schema.GroupVersionResource{Resource: "configmaps"}); err != nil || gvk.Kind != "ConfigMap" {
		t.Fatalf("KindFor configmaps: %v, %v", gvk, err)
	}
	mapping, err = m.RESTMapping(schema.GroupKind{Group: "example.com", Kind: "Widget"}, "v1")
	if err != nil || mapping.Resource != (schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}) || mapping.Scope.Name() != meta.RESTScopeNameRoot {
		t.Fatalf("Widget, once the daemon serves it: %+v, %v", mapping, err)
	}
	if _, err := m.RESTMapping(schema.GroupKind{Group: "example.com", Kind: "Gadget"}); !meta.IsNoMatchError(err) {
		t.Fatalf("a kind the daemon does not serve: %v, want a NoMatch error", err)
	}
	m.Reset()
	if _, err := m.RESTMapping(schema.GroupKind{Kind: "ConfigMap"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"", "Widget", "Gadget", ""}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.reqs) != len(want) {
		t.Fatalf("GetDiscovery requests %q, want %q", d.reqs, want)
	}
	for i := range want {
		if d.reqs[i] != want[i] {
			t.Fatalf("GetDiscovery requests %q, want %q", d.reqs, want)
		}
	}
}
