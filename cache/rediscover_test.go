package cache

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// discoveryServer serves the API server's discovery of configmaps, and of
// widgets.example.com once withWidgets is set; with failing set, every
// request fails with 500.
type discoveryServer struct {
	*httptest.Server
	withWidgets, failing atomic.Bool
}

func newDiscoveryServer(t *testing.T) *discoveryServer {
	d := &discoveryServer{}
	reply := func(body func() string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if d.failing.Load() {
				http.Error(w, "etcd is on fire", http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body())
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/api", reply(func() string { return `{"kind":"APIVersions","versions":["v1"]}` }))
	mux.HandleFunc("/api/v1", reply(func() string {
		return `{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["list","watch"]}]}`
	}))
	mux.HandleFunc("/apis", reply(func() string {
		if !d.withWidgets.Load() {
			return `{"kind":"APIGroupList","apiVersion":"v1","groups":[]}`
		}
		return `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"example.com","versions":[{"groupVersion":"example.com/v1","version":"v1"}],"preferredVersion":{"groupVersion":"example.com/v1","version":"v1"}}]}`
	}))
	mux.HandleFunc("/apis/example.com/v1", reply(func() string {
		return `{"kind":"APIResourceList","groupVersion":"example.com/v1","resources":[{"name":"widgets","singularName":"widget","namespaced":true,"kind":"Widget","verbs":["list","watch"]}]}`
	}))
	d.Server = httptest.NewServer(mux)
	t.Cleanup(d.Close)
	return d
}

// TestRereadReplacesDiscoveryWhole: a request for an unknown resource
// rereads discovery; a reread that fails leaves everyone the discovery
// read before (and its generation), one that succeeds replaces it and
// counts a generation.
func TestRereadReplacesDiscoveryWhole(t *testing.T) {
	api := newDiscoveryServer(t)
	m, err := NewManager(Options{Config: &rest.Config{Host: api.URL, QPS: -1}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	configMaps := Request{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}
	if _, _, err := m.ResolveResource(t.Context(), configMaps); err != nil {
		t.Fatal(err)
	}
	gen := m.DiscoveryGeneration()

	api.failing.Store(true)
	if _, _, err := m.ResolveResource(t.Context(), Request{GVR: widgets}); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("an unknown resource while discovery fails: %v, want ErrNotSynced", err)
	}
	if _, _, err := m.ResolveResource(t.Context(), configMaps); err != nil {
		t.Fatalf("configmaps after a failed reread: %v", err)
	}
	groups, err := m.Discovery(t.Context(), nil)
	if err != nil || len(groups) == 0 {
		t.Fatalf("discovery after a failed reread: %v, %d groups", err, len(groups))
	}
	if got := m.DiscoveryGeneration(); got != gen {
		t.Fatalf("a failed reread made generation %d of %d", got, gen)
	}

	api.failing.Store(false)
	api.withWidgets.Store(true)
	if _, _, err := m.ResolveResource(t.Context(), Request{GVR: widgets}); err != nil {
		t.Fatalf("widgets once served: %v", err)
	}
	if got := m.DiscoveryGeneration(); got != gen+1 {
		t.Fatalf("generation %d after one reread of %d, want %d", got, gen, gen+1)
	}
}
