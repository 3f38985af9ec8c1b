package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/cli-utils/pkg/apply"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"
	"sigs.k8s.io/cli-utils/pkg/object/validation"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/statuswatcher"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// strictStatusWatcher is the daemon's StatusWatcher for a test that
// expects no reconnect: any error fails the test.
func (d *testDaemon) strictStatusWatcher(t *testing.T, name string) watcher.StatusWatcher {
	t.Helper()
	return statuswatcher.New(d.dial(t, readsAll), statuswatcher.Options{
		ClientName: name, OnError: func(err error) { t.Errorf("status watcher %s retried after: %v", name, err) },
	})
}

// strictWaiter is the daemon's waiter with strictStatusWatcher.
func (d *testDaemon) strictWaiter(t *testing.T, name string) waiter {
	t.Helper()
	return waiter{sw: d.strictStatusWatcher(t, name), mapper: client.NewRESTMapper(d.dial(t, readsAll))}
}

// TestWatchStatusOf20000Objects: one Watch of 20,000 objects (over 1 MiB
// of references, 20 times what one 64 KiB request message holds) reports
// each: the few that exist Current, with the objects themselves as their
// Resource, the others NotFound; then SYNCED; with no retry.
func TestWatchStatusOf20000Objects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	ns := createNamespace(ctx, t, "many")
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	cmGK, deployGK := schema.GroupKind{Kind: "ConfigMap"}, schema.GroupKind{Group: "apps", Kind: "Deployment"}
	var ids object.ObjMetadataSet
	for i := range 20 {
		name := fmt.Sprintf("present-configmap-%02d", i)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"index": fmt.Sprint(i)}}
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, object.ObjMetadata{GroupKind: cmGK, Namespace: ns, Name: name})
	}
	for i := len(ids); i < 20000; i++ {
		gk := cmGK
		if i%2 == 0 {
			gk = deployGK // Deployments read ReplicaSets and Pods too
		}
		ids = append(ids, object.ObjMetadata{GroupKind: gk, Namespace: ns, Name: fmt.Sprintf("frontend-web-server-%06d", i)})
	}

	start := time.Now()
	events := d.strictStatusWatcher(t, "many").Watch(ctx, ids, watcher.Options{})
	got := map[object.ObjMetadata]*event.ResourceStatus{}
	for synced := false; !synced; {
		select {
		case ev, ok := <-events:
			switch {
			case !ok || ev.Type == event.ErrorEvent:
				t.Fatalf("the Watch ended after %d statuses: %v", len(got), ev.Error)
			case ev.Type == event.SyncEvent:
				synced = true
			default:
				got[ev.Resource.Identifier] = ev.Resource
			}
		case <-ctx.Done():
			t.Fatalf("no SYNCED: %d statuses", len(got))
		}
	}
	took := time.Since(start)
	if len(got) != len(ids) {
		t.Fatalf("%d statuses before SYNCED, want %d", len(got), len(ids))
	}
	for i, id := range ids {
		rs := got[id]
		if i >= 20 {
			if rs.Status != kstatus.NotFoundStatus {
				t.Fatalf("%s: %s, want NotFound", id, rs.Status)
			}
			continue
		}
		v, _, _ := unstructured.NestedString(rs.Resource.Object, "data", "index")
		if rs.Status != kstatus.CurrentStatus || v != fmt.Sprint(i) {
			t.Fatalf("%s: %s, data.index %q; want Current with the object's data", id, rs.Status, v)
		}
	}
	t.Logf("20,000 statuses and SYNCED in %v", took)
}

// TestApplierBeyondOneRequestMessage: a cli-utils Applier of 300
// Deployments with names of 205 bytes, whose references take more than
// one 64 KiB request message (the daemon's default -max-request-bytes),
// with informerd's StatusWatcher ends with every Deployment Current, with
// no error and no retry. (1,200 Deployments of short names, the same
// bytes, took 4m50s on the 2-core test machine; `make bench-status
// BENCH_STATUS_FLAGS="-deployments 5000 -appliers 1 -modes informerd"`
// runs 5,000.)
func TestApplierBeyondOneRequestMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	invNS := createNamespace(ctx, t, "inventory")
	ns := createNamespace(ctx, t, "many-deployments")
	var objs []*unstructured.Unstructured
	req := &informerdv1.WatchStatusRequest{}
	for i := range 300 {
		// A label value holds at most 63 bytes: the selector uses the
		// index. The inventory's key, namespace_name_group_kind, at most 253.
		name := fmt.Sprintf("frontend-web-server-%s-%06d", strings.Repeat("x", 178), i)
		o := deploymentObj(ns, fmt.Sprintf("web-%06d", i), 1, nil)
		o.SetName(name)
		objs = append(objs, o)
		req.Objects = append(req.Objects, &informerdv1.ObjectReference{Group: "apps", Kind: "Deployment", Namespace: ns, Name: name})
	}
	if n := proto.Size(req); n <= 64<<10 {
		t.Fatalf("the references take %d bytes, which one 64 KiB message holds", n)
	}
	ids := object.UnstructuredSetToObjMetadataSet(objs)
	start := time.Now()
	r := startApply(ctx, newApplier(t, d.strictWaiter(t, "applier")), invNS, "many-"+rand.String(5), objs, 8*time.Minute).wait(ctx, t)
	r.expectReconciled(t, "apply", ids, kstatus.CurrentStatus)
	t.Logf("300 Deployments (%d bytes of references) applied and Current in %v", proto.Size(req), time.Since(start))
}

// TestApplyTimeMutation: cli-utils' apply-time mutation with informerd's
// StatusWatcher, as in cli-utils' own mutation scenario: a ConfigMap's
// field is filled at apply time from $.status.podIP of a Pod applied
// before it, which the Applier reads from its resource cache, that is
// from the status event's Resource, once the Pod is Current.
func TestApplyTimeMutation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	invNS := createNamespace(ctx, t, "inventory")
	ns := createNamespace(ctx, t, "mutation")
	pod := u("v1", "Pod", ns, "pod-b", map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "c", "image": "registry.invalid/none:1"}},
	}})
	cm := u("v1", "ConfigMap", ns, "cm-a", map[string]any{"data": map[string]any{"host": "${pod-b-ip}:80"}})
	cm.SetAnnotations(map[string]string{"config.kubernetes.io/apply-time-mutation": fmt.Sprintf(`- sourceRef:
    kind: Pod
    name: pod-b
    namespace: %s
  sourcePath: $.status.podIP
  targetPath: $.data.host
  token: ${pod-b-ip}
`, ns)})
	objs := []*unstructured.Unstructured{cm, pod}
	r := startApply(ctx, newApplier(t, d.strictWaiter(t, "mutation")), invNS, "mutation-"+rand.String(5), objs, 2*time.Minute).wait(ctx, t)
	r.expectReconciled(t, "apply", object.UnstructuredSetToObjMetadataSet(objs), kstatus.CurrentStatus)
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	p, err := admin.CoreV1().Pods(ns).Get(ctx, "pod-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, "cm-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := p.Status.PodIP + ":80"; p.Status.PodIP == "" || got.Data["host"] != want {
		t.Fatalf("cm-a data.host %q, want %q (the Pod's IP)", got.Data["host"], want)
	}
}

// TestApplierSkipsInvalidObjects: with ValidationPolicy SkipInvalid, as
// in cli-utils' own scenario, an object with no name is reported invalid
// and skipped, and the others are applied and reconciled: the
// StatusWatcher that the Applier hands every identifier, the invalid one
// included, watches the rest.
func TestApplierSkipsInvalidObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	invNS := createNamespace(ctx, t, "inventory")
	ns := createNamespace(ctx, t, "invalid")
	valid := []*unstructured.Unstructured{
		u("v1", "ConfigMap", ns, "cm-ok", map[string]any{"data": map[string]any{"k": "v"}}),
		deploymentObj(ns, "web", 1, nil),
	}
	invalid := u("v1", "Pod", ns, "", map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "c", "image": "registry.invalid/none:1"}},
	}})
	a := newApplier(t, d.strictWaiter(t, "skip-invalid"))
	r := watchRun(a.Run(ctx, inventoryInfo(invNS, "invalid-"+rand.String(5)), append(valid, invalid), apply.ApplierOptions{
		ReconcileTimeout: 2 * time.Minute, EmitStatusEvents: true, ValidationPolicy: validation.SkipInvalid,
	})).wait(ctx, t)
	r.mu.Lock()
	errs := r.errors
	r.errors = nil
	r.mu.Unlock()
	if len(errs) != 1 || !strings.Contains(errs[0], "name is required") {
		t.Fatalf("errors %q, want only the invalid object's validation error", errs)
	}
	r.expectReconciled(t, "apply", object.UnstructuredSetToObjMetadataSet(valid), kstatus.CurrentStatus)
	if w, ok := r.waits[object.UnstructuredToObjMetadata(invalid)]; ok {
		t.Fatalf("the invalid object was waited for: %s", w)
	}
}
