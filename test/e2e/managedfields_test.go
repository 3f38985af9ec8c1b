package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/wrapconfig"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestManagedFieldsServedWhole (issue 28): by default, objects served
// through the daemon carry exactly the managedFields the API server
// returns for the same object, as the whole object: a built-in kind in
// JSON and protobuf and a custom resource, each written by three managers
// (apply, update, apply of a subresource-free field), in a Watch snapshot
// and its events, by Get, in the metadata view (as the API server's
// PartialObjectMetadata), and through WrapConfig's list and watch.
func TestManagedFieldsServedWhole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "mf")
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	raw := kubernetes.NewForConfigOrDie(env.RESTConfig()).Discovery().RESTClient()
	widgets := schema.GroupVersionResource{Group: "mf.informerd.io", Version: "v1", Resource: "widgets"}
	createCRD(ctx, t, dyn, widgets, "Widget")
	kinds := []struct {
		gvr        schema.GroupVersionResource
		apiVersion string
		kind       string
		path       string
	}{
		{configMaps, "v1", "ConfigMap", "/api/v1/namespaces/" + ns + "/configmaps/"},
		{widgets, "mf.informerd.io/v1", "Widget", "/apis/mf.informerd.io/v1/namespaces/" + ns + "/widgets/"},
	}
	// write has manager set field of object name of kind k by server-side
	// apply; update changes another with a plain update.
	write := func(k int, name, manager, field, value string) {
		t.Helper()
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": kinds[k].apiVersion, "kind": kinds[k].kind,
			"metadata": map[string]any{"name": name, "namespace": ns},
			"data":     map[string]any{field: value},
		}}
		if _, err := dyn.Resource(kinds[k].gvr).Namespace(ns).Apply(ctx, name, obj, metav1.ApplyOptions{FieldManager: manager}); err != nil {
			t.Fatal(err)
		}
	}
	update := func(k int, name, manager string) {
		t.Helper()
		patch := []byte(`{"metadata":{"labels":{"updated-by":"` + manager + `"}}}`)
		if _, err := dyn.Resource(kinds[k].gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: manager}); err != nil {
			t.Fatal(err)
		}
	}
	for k := range kinds {
		for _, name := range []string{"a", "b"} {
			write(k, name, "first", "one", "1")
			update(k, name, "second")
		}
	}
	// apiServer returns the API server's object now, decoded.
	apiServer := func(k int, name, accept string) map[string]any {
		t.Helper()
		req := raw.Get().AbsPath(kinds[k].path + name)
		if accept != "" {
			req = req.SetHeader("Accept", accept)
		}
		b, err := req.DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return decodeJSON(t, b)
	}
	// same fails unless the served object is the API server's, whole.
	same := func(what string, k int, served map[string]any) {
		t.Helper()
		name, _, _ := unstructured.NestedString(served, "metadata", "name")
		want := apiServer(k, name, "")
		if _, ok, _ := unstructured.NestedSlice(want, "metadata", "managedFields"); !ok {
			t.Fatalf("%s: the API server's %s has no managedFields", what, name)
		}
		if !reflect.DeepEqual(served, want) {
			t.Errorf("%s: served\n%s\nthe API server has\n%s", what, mustMarshal(t, served), mustMarshal(t, want))
		}
	}

	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ns), reads(widgets, ns))
	for k, kind := range kinds {
		t.Run(kind.kind+"/watch", func(t *testing.T) {
			s, err := c.Stream(ctx, client.WatchOptions{Resource: kind.gvr, Namespace: ns, ClientName: "mf"}, "")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			n := 0
			for synced := false; !synced; {
				evs, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range evs {
					switch ev.GetType() {
					case informerdv1.EventType_EVENT_TYPE_ADDED:
						obj := decodeJSON(t, ev.GetObject())
						same("snapshot", k, obj) // kube-root-ca.crt too
						if name, _, _ := unstructured.NestedString(obj, "metadata", "name"); name == "a" || name == "b" {
							n++
						}
					case informerdv1.EventType_EVENT_TYPE_SYNCED:
						synced = true
					}
				}
			}
			if n != 2 {
				t.Fatalf("snapshot with %d of a and b, want 2", n)
			}
			write(k, "a", "third", "three", "3")
			for {
				evs, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range evs {
					if ev.GetType() == informerdv1.EventType_EVENT_TYPE_MODIFIED {
						same("event", k, decodeJSON(t, ev.GetObject()))
						return
					}
				}
			}
		})
	}
	for k, kind := range kinds {
		t.Run(kind.kind+"/get", func(t *testing.T) {
			res := &informerdv1.GroupVersionResource{Group: kind.gvr.Group, Version: kind.gvr.Version, Resource: kind.gvr.Resource}
			got, err := c.API().Get(ctx, &informerdv1.GetRequest{Resource: res, Namespace: ns, Name: "a", NotOlderThanResourceVersion: resourceVersionOf(t, apiServer(k, "a", ""))})
			if err != nil {
				t.Fatal(err)
			}
			same("Get", k, decodeJSON(t, got.GetObject()))
			// The metadata view is PartialObjectMetadata, as the API server sends it.
			got, err = c.API().Get(ctx, &informerdv1.GetRequest{Resource: res, Namespace: ns, Name: "b", View: informerdv1.View_VIEW_METADATA})
			if err != nil {
				t.Fatal(err)
			}
			want := apiServer(k, "b", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")
			if served := decodeJSON(t, got.GetObject()); !reflect.DeepEqual(served["metadata"], want["metadata"]) {
				t.Errorf("metadata view: served\n%s\nthe API server's PartialObjectMetadata has\n%s", mustMarshal(t, served), mustMarshal(t, want))
			}
		})
	}
	t.Run("ConfigMap/protobuf", func(t *testing.T) {
		admin := kubeClient(t)
		got, err := c.API().Get(ctx, &informerdv1.GetRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Namespace: ns, Name: "b", Encoding: informerdv1.Encoding_ENCODING_PROTOBUF})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(got.GetObject(), []byte("k8s\x00")) {
			t.Fatalf("not protobuf: %q", got.GetObject())
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(got.GetObject(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, "b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		served := obj.(*corev1.ConfigMap)
		served.TypeMeta = want.TypeMeta // client-go's decoding drops it
		if len(want.ManagedFields) < 2 || !bytes.Equal(mustMarshal(t, served), mustMarshal(t, want)) {
			t.Errorf("protobuf: served\n%s\nthe API server has\n%s", mustMarshal(t, served), mustMarshal(t, want))
		}
	})
	t.Run("WrapConfig", func(t *testing.T) {
		cfg, wc := wrapIdentity(ctx, t, d.socket, reads(configMaps, ns), reads(widgets, ns))
		var log requestLog
		log.wrap(cfg)
		wrapped := dynamic.NewForConfigOrDie(wrapconfig.Wrap(cfg, wc, wrapconfig.Options{ClientName: "mf-wrap"}))
		for k, kind := range kinds {
			list, err := wrapped.Resource(kind.gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, it := range list.Items {
				same("WrapConfig list", k, roundTripJSON(t, it.Object))
				if it.GetName() == "a" || it.GetName() == "b" {
					n++
				}
			}
			if n != 2 {
				t.Fatalf("%s: WrapConfig listed %d of a and b, want 2", kind.kind, n)
			}
			w, err := wrapped.Resource(kind.gvr).Namespace(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
			if err != nil {
				t.Fatal(err)
			}
			update(k, "b", "fourth")
			seen := false
			for ev := range w.ResultChan() {
				if ev.Type == watch.Modified {
					same("WrapConfig watch", k, roundTripJSON(t, ev.Object.(*unstructured.Unstructured).Object))
					seen = true
					break
				}
			}
			w.Stop()
			if !seen {
				t.Fatalf("%s: the WrapConfig watch ended without the change", kind.kind)
			}
		}
		if log.any("GET /api/v1/namespaces/"+ns+"/configmaps") || log.any("GET /apis/mf.informerd.io/v1/namespaces/"+ns+"/widgets") {
			t.Errorf("WrapConfig passed a list or watch through: %v", log.urls)
		}
	})
}

func decodeJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return m
}

// roundTripJSON returns an unstructured object as encoding/json decodes
// it, to compare with decodeJSON's.
func roundTripJSON(t *testing.T, o map[string]any) map[string]any {
	t.Helper()
	return decodeJSON(t, mustMarshal(t, o))
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func resourceVersionOf(t *testing.T, o map[string]any) string {
	t.Helper()
	rv, _, _ := unstructured.NestedString(o, "metadata", "resourceVersion")
	return rv
}
