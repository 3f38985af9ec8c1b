package e2e

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/restmapper"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
)

// TestDynamicClientServesInformersAndStatusWatcher: the daemon-backed
// dynamic.Interface works, unmodified, under dynamicinformer and under
// cli-utils' DefaultStatusWatcher; reads come from the daemon, writes go to
// the writer or fail clearly.
func TestDynamicClientServesInformersAndStatusWatcher(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "dyn")
	createConfigMap(ctx, t, ns, "first", nil)
	d := startDaemon(t, cache.Options{})
	real := dynamic.NewForConfigOrDie(env.RESTConfig())
	dyn := client.NewDynamicClient(d.dial(t, reads(configMaps, ns)), "dynamic-e2e", real)

	// Get is served from the daemon's snapshot; writes go to the writer.
	got, err := dyn.Resource(configMaps).Namespace(ns).Get(ctx, "first", metav1.GetOptions{})
	if err != nil || got.GetName() != "first" {
		t.Fatalf("Get through informerd = %v, %v", got, err)
	}
	if _, err := dyn.Resource(configMaps).Namespace(ns).Get(ctx, "absent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of a missing object = %v, want NotFound", err)
	}
	readOnly := client.NewDynamicClient(d.dial(t, reads(configMaps, ns)), "read-only", nil)
	if err := readOnly.Resource(configMaps).Namespace(ns).Delete(ctx, "first", metav1.DeleteOptions{}); !apierrors.IsMethodNotSupported(err) {
		t.Fatalf("Delete without a writer = %v, want MethodNotAllowed", err)
	}

	// dynamicinformer over the daemon.
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	inf := factory.ForResource(configMaps).Informer()
	added := make(chan string, 10)
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
		added <- o.(*unstructured.Unstructured).GetName()
	}}); err != nil {
		t.Fatal(err)
	}
	ictx, stop := context.WithCancel(ctx)
	defer func() { stop(); factory.Shutdown() }()
	factory.Start(ictx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("dynamic informer over informerd never synced")
	}
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "second"},
	}}
	if _, err := dyn.Resource(configMaps).Namespace(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("Create through the writer: %v", err)
	}
	for name := ""; name != "second"; {
		select {
		case name = <-added:
		case <-ctx.Done():
			t.Fatal("the dynamic informer never saw the new ConfigMap")
		}
	}

	// cli-utils' DefaultStatusWatcher over the daemon.
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(env.RESTConfig())))
	sw := watcher.NewDefaultStatusWatcher(dyn, mapper)
	id := object.ObjMetadata{Namespace: ns, Name: "second", GroupKind: schema.GroupKind{Kind: "ConfigMap"}}
	events := sw.Watch(ictx, object.ObjMetadataSet{id}, watcher.Options{})
	var synced, current bool
	for !synced || !current {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("status watcher stopped")
			}
			switch ev.Type {
			case event.ErrorEvent:
				t.Fatalf("status watcher: %v", ev.Error)
			case event.SyncEvent:
				synced = true
			case event.ResourceUpdateEvent:
				current = ev.Resource.Status == status.CurrentStatus
			}
		case <-ctx.Done():
			t.Fatalf("status watcher: synced %v, current %v", synced, current)
		}
	}
	if err := real.Resource(configMaps).Namespace(ns).Delete(ctx, "second", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case ev := <-events:
			if ev.Type == event.ResourceUpdateEvent && ev.Resource.Status == status.NotFoundStatus {
				return
			}
		case <-ctx.Done():
			t.Fatal("status watcher never reported the deleted ConfigMap NotFound")
		}
	}
}
