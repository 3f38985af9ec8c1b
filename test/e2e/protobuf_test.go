package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestProtobufEncoding: a client that asks for protobuf gets built-in types
// in the API server's own protobuf encoding (so the daemon watched in
// protobuf: it never converts), managedFields included, filtered and
// projected like JSON; a typed informer runs on it and matches the API
// server; custom resources still come as JSON; JSON and protobuf clients
// of one resource are served by two informers.
func TestProtobufEncoding(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "protobuf")
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	for i := range 3 {
		cm := createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), map[string]string{"v": "0"})
		if i < 2 {
			cm.Labels = map[string]string{"pick": "me"}
			if _, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	widgets := schema.GroupVersionResource{Group: "pb.informerd.io", Version: "v1", Resource: "widgets"}
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ns), reads(widgets, ns), introspects)
	decoder := scheme.Codecs.UniversalDeserializer()

	// snapshot returns the objects of a stream's snapshot from c.
	snapshot := func(c *client.Client, opts client.WatchOptions) [][]byte {
		t.Helper()
		s, err := c.Stream(ctx, opts, "")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var objs [][]byte
		for {
			evs, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				switch ev.GetType() {
				case informerdv1.EventType_EVENT_TYPE_ADDED:
					objs = append(objs, ev.GetObject())
				case informerdv1.EventType_EVENT_TYPE_SYNCED:
					return objs
				}
			}
		}
	}
	objs := snapshot(c, client.WatchOptions{Resource: configMaps, Namespace: ns, LabelSelector: "pick=me", Protobuf: true, ClientName: "pb"})
	if len(objs) != 2 {
		t.Fatalf("protobuf snapshot with a selector has %d objects, want 2", len(objs))
	}
	for _, b := range objs {
		if !bytes.HasPrefix(b, []byte("k8s\x00")) {
			t.Fatalf("object is not in the API server's protobuf encoding: %q", b)
		}
		obj, _, err := decoder.Decode(b, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		cm := obj.(*corev1.ConfigMap)
		if cm.Labels["pick"] != "me" || cm.Data["v"] != "0" || len(cm.ManagedFields) == 0 {
			t.Fatalf("protobuf ConfigMap: %+v; want the selected one, its data, its managedFields", cm)
		}
	}
	meta := snapshot(c, client.WatchOptions{Resource: configMaps, Namespace: ns, Protobuf: true, MetadataOnly: true, ClientName: "pb-meta"})
	for _, b := range meta {
		obj, _, err := decoder.Decode(b, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cm := obj.(*corev1.ConfigMap); cm.Name == "" || cm.ResourceVersion == "" || cm.Data != nil {
			t.Fatalf("protobuf metadata view: %+v; want metadata only", cm)
		}
	}

	// A typed informer, as a controller runs it.
	lw := client.NewListerWatcher(c, client.WatchOptions{Resource: configMaps, Namespace: ns, Protobuf: true, ClientName: "typed"})
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, toolscache.Indexers{})
	ictx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); inf.RunWithContext(ictx) }()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("typed informer never synced")
	}
	cm := createConfigMap(ctx, t, ns, "late", map[string]string{"v": "1"})
	if err := admin.CoreV1().ConfigMaps(ns).Delete(ctx, "cm0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := listState(ctx, t, configMaps, ns)
	eventually(ctx, t, "the typed informer matches LIST", func() bool {
		got := map[string]string{}
		for _, o := range inf.GetStore().List() {
			cm := o.(*corev1.ConfigMap)
			got[cm.Namespace+"/"+cm.Name] = cm.ResourceVersion
		}
		return maps.Equal(got, want)
	})
	if _, ok, _ := inf.GetStore().GetByKey(ns + "/late"); !ok {
		t.Fatalf("typed informer lacks %s", cm.Name)
	}
	// The Watcher hands protobuf objects to its handler as Unstructured.
	rec := newRecorder()
	wt := client.NewWatcher(c, client.WatchOptions{Resource: configMaps, Namespace: ns, Protobuf: true, ClientName: "pb-watcher"}, rec, client.WatcherOptions{})
	wg.Add(1)
	go func() { defer wg.Done(); _ = wt.Run(ictx) }()
	rec.waitFor(ctx, t, "the protobuf Watcher matches LIST", func(got map[string]string) bool { return maps.Equal(got, want) })
	rec.checkUnmutated(t)

	// JSON clients of the same resource get JSON, from their own informer.
	for _, b := range snapshot(c, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "json"}) {
		if b[0] != '{' {
			t.Fatalf("JSON client got %q", b)
		}
	}
	resp, err := c.API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	encodings := map[informerdv1.Encoding]int{}
	for _, in := range resp.GetInformers() {
		if in.GetResource().GetResource() == "configmaps" {
			encodings[in.GetEncoding()]++
		}
	}
	if len(encodings) != 2 || encodings[informerdv1.Encoding_ENCODING_JSON] != 1 || encodings[informerdv1.Encoding_ENCODING_PROTOBUF] != 1 {
		t.Fatalf("configmaps informers by encoding: %v; want one JSON and one protobuf", encodings)
	}

	// Without WatchList the daemon LISTs: in protobuf too.
	plain := startDaemon(t, cache.Options{DisableWatchList: true})
	listed := snapshot(plain.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, Protobuf: true, ClientName: "pb-list"})
	if len(listed) != len(want) {
		t.Fatalf("protobuf LIST gave %d objects, want %d", len(listed), len(want))
	}
	for _, b := range listed {
		if obj, _, err := decoder.Decode(b, nil, nil); err != nil || !bytes.HasPrefix(b, []byte("k8s\x00")) || obj.(*corev1.ConfigMap).Namespace != ns {
			t.Fatalf("a listed object is not a protobuf ConfigMap of %s (%v): %q", ns, err, b)
		}
	}

	// A custom resource has no protobuf encoding: it comes as JSON, and a
	// typed ListerWatcher hands it out as Unstructured.
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	createCRD(ctx, t, dyn, widgets, "Widget")
	w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "pb.informerd.io/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w"}, "spec": map[string]any{"size": int64(3)}}}
	if _, err := dyn.Resource(widgets).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crs := snapshot(c, client.WatchOptions{Resource: widgets, Namespace: ns, Protobuf: true, ClientName: "pb-cr"})
	if len(crs) != 1 || crs[0][0] != '{' {
		t.Fatalf("custom resources for a protobuf client: %q; want one JSON object", crs)
	}
	list, err := client.NewListerWatcher(c, client.WatchOptions{Resource: widgets, Namespace: ns, Protobuf: true, ClientName: "pb-cr-lw"}).
		ListWithContext(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	items := list.(*metav1.List).Items
	if len(items) != 1 {
		t.Fatalf("typed ListerWatcher listed %d widgets, want 1", len(items))
	}
	if _, ok := items[0].Object.(runtime.Unstructured); !ok {
		t.Fatalf("a custom resource came as %T, want Unstructured", items[0].Object)
	}
}
