package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/cli-utils/pkg/apply"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/statuswatcher"
	"github.com/informerd/informerd/test/controlplane"
)

// statusWatcher returns a StatusWatcher of the daemon for one applier.
func (d *testDaemon) statusWatcher(t *testing.T, name string) watcher.StatusWatcher {
	t.Helper()
	return statuswatcher.New(d.dial(t, readsAll), statuswatcher.Options{
		ClientName: name, Backoff: client.Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond},
		OnError: func(err error) { t.Logf("status watcher %s reconnects after: %v", name, err) },
	})
}

// fullInventory is the inventory of TestApplierAndDestroyer: a Namespace
// and, in it, a ConfigMap, a Deployment of 2 replicas, a Service, a CRD and
// an object of it. Every name carries suffix.
func fullInventory(suffix string) []*unstructured.Unstructured {
	ns, group := "apply-"+suffix, suffix+".informerd.dev"
	return []*unstructured.Unstructured{
		u("v1", "Namespace", "", ns, nil),
		u("v1", "ConfigMap", ns, "config", map[string]any{"data": map[string]any{"k": "v"}}),
		deploymentObj(ns, "web", 2, nil),
		serviceObj(ns, "web"),
		crdObj(group, "Widget"),
		u(group+"/v1", "Widget", ns, "w", nil),
	}
}

// byShape keys statuses by kind and name with suffix removed, so that two
// runs of one inventory shape compare.
func byShape(m map[object.ObjMetadata]kstatus.Status, suffix string) map[string]kstatus.Status {
	out := map[string]kstatus.Status{}
	for id, s := range m {
		out[id.GroupKind.Kind+"/"+strings.ReplaceAll(id.Namespace+"/"+id.Name, suffix, "*")] = s
	}
	return out
}

// TestApplierAndDestroyer: a real cli-utils Applier with informerd's
// StatusWatcher applies an inventory with a reconcile wait and every object
// ends Current; a Destroyer with it deletes them all and sees each
// NotFound. The same inventory with cli-utils' DefaultStatusWatcher (which
// watches the API server itself) ends with the same statuses.
//
// The Destroyer deletes with foreground propagation (issue 21, item 9):
// the Deployment is NotFound only once kube-controller-manager's garbage
// collector has deleted its ReplicaSet and Pods and removed the
// foregroundDeletion finalizer.
func TestApplierAndDestroyer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	invNS := createNamespace(ctx, t, "inventory")
	run := func(mode string, w func() waiter) (applied, destroyed map[string]kstatus.Status) {
		suffix := mode + "-" + rand.String(5)
		objs := fullInventory(suffix)
		ids := object.UnstructuredSetToObjMetadataSet(objs)
		r := startApply(ctx, newApplier(t, w()), invNS, suffix, objs, 3*time.Minute).wait(ctx, t)
		r.expectReconciled(t, mode+" apply", ids, kstatus.CurrentStatus)
		r2 := watchRun(newDestroyer(t, w()).Run(ctx, inventoryInfo(invNS, suffix), apply.DestroyerOptions{
			DeleteTimeout: 3 * time.Minute, EmitStatusEvents: true, DeletePropagationPolicy: metav1.DeletePropagationForeground,
		})).wait(ctx, t)
		r2.expectReconciled(t, mode+" destroy", ids, kstatus.NotFoundStatus)
		return byShape(r.final(), suffix), byShape(r2.final(), suffix)
	}
	ourApplied, ourDestroyed := run("informerd", func() waiter { return d.waiter(t, "applier") })
	directApplied, directDestroyed := run("direct", func() waiter { return waiter{} })
	if !maps.Equal(ourApplied, directApplied) || !maps.Equal(ourDestroyed, directDestroyed) {
		t.Fatalf("final statuses differ:\ninformerd apply %v\ndirect    apply %v\ninformerd destroy %v\ndirect    destroy %v",
			ourApplied, directApplied, ourDestroyed, directDestroyed)
	}
	t.Logf("final statuses, identical through informerd and direct: apply %v, destroy %v", ourApplied, ourDestroyed)
}

// TestUnschedulablePodFailsAfter15s: a Pod that cannot be scheduled is
// InProgress, then Failed 15 s after it was last changed, not before.
func TestUnschedulablePodFailsAfter15s(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	ns := createNamespace(ctx, t, "unschedulable")
	if err := controlplane.WaitForDefaultServiceAccount(ctx, admin, ns); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cache.Options{})
	id := object.ObjMetadata{GroupKind: schema.GroupKind{Kind: "Pod"}, Namespace: ns, Name: "stuck"}
	events := d.statusWatcher(t, "unschedulable").Watch(ctx, object.ObjMetadataSet{id}, watcher.Options{})
	next := func() event.Event {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok || ev.Type == event.ErrorEvent {
				t.Fatalf("status watcher ended: %v", ev.Error)
			}
			return ev
		case <-ctx.Done():
			t.Fatal("no status event")
			return event.Event{}
		}
	}
	if ev := next(); ev.Type != event.ResourceUpdateEvent || ev.Resource.Status != kstatus.NotFoundStatus {
		t.Fatalf("first event %v, want the absent Pod NotFound", ev)
	}
	if ev := next(); ev.Type != event.SyncEvent {
		t.Fatalf("second event %v, want SyncEvent", ev)
	}
	created := time.Now()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stuck"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"informerd.dev/no-such-node": "true"},
			Containers:   []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}},
		},
	}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for {
		ev := next()
		rs := ev.Resource
		seen = append(seen, fmt.Sprintf("%s %q after %s", rs.Status, rs.Message, time.Since(created).Round(100*time.Millisecond)))
		if rs.Status == kstatus.FailedStatus {
			break
		}
		if rs.Status != kstatus.InProgressStatus {
			t.Fatalf("statuses %q: want InProgress until Failed", seen)
		}
	}
	elapsed := time.Since(created)
	t.Logf("statuses: %q", seen)
	if elapsed < kstatus.ScheduleWindow || elapsed > kstatus.ScheduleWindow+10*time.Second {
		t.Fatalf("Failed %s after the unschedulable Pod was created, want 15 s (up to 10 s late)", elapsed)
	}
	if !strings.Contains(seen[0], "InProgress") || len(seen) < 2 {
		t.Fatalf("statuses %q: want InProgress before Failed", seen)
	}
}

// createGateCRD creates a Gate CRD, in a group of the test's own (a CRD
// deleted by the previous test may still be going), and returns the group.
func createGateCRD(ctx context.Context, t *testing.T) string {
	t.Helper()
	group := rand.String(6) + ".gates.e2e.informerd.dev"
	createCRD(ctx, t, dynamic.NewForConfigOrDie(env.RESTConfig()), schema.GroupVersionResource{Group: group, Version: "v1", Resource: "gates"}, "Gate")
	return group
}

// gatedInventory is an applier's inventory in namespace ns: a ConfigMap,
// a Deployment of one replica, a Service and a Gate that holds the
// reconcile wait open until openGate.
func gatedInventory(gateGroup, ns string) []*unstructured.Unstructured {
	return []*unstructured.Unstructured{
		u("v1", "ConfigMap", ns, "config", map[string]any{"data": map[string]any{"k": "v"}}),
		deploymentObj(ns, "web", 1, nil),
		serviceObj(ns, "web"),
		gateObj(gateGroup, ns, "gate"),
	}
}

// statusResources are the resources whose upstream watches the appliers
// of gatedInventory cost: the inventory's, then the generated ones.
func statusResources(gateGroup string) []schema.GroupVersionResource {
	return []schema.GroupVersionResource{
		{Version: "v1", Resource: "configmaps"},
		{Group: "apps", Version: "v1", Resource: "deployments"},
		{Version: "v1", Resource: "services"},
		{Group: gateGroup, Version: "v1", Resource: "gates"},
		{Group: "apps", Version: "v1", Resource: "replicasets"},
		{Version: "v1", Resource: "pods"},
	}
}

// watchCounts is upstreamWatches of each resource, in order.
func watchCounts(t *testing.T, resources []schema.GroupVersionResource) []int {
	out := make([]int, len(resources))
	for i, gvr := range resources {
		out[i] = upstreamWatches(t, gvr)
	}
	return out
}

func sub(a, b []int) []int {
	out := make([]int, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

// appliersWatches runs n appliers at once, each applying gatedInventory in
// a namespace of its own waiting as w gives, and returns the
// upstream watches per statusResources that they add while all of them
// wait (compared with before), then lets them finish.
func appliersWatches(ctx context.Context, t *testing.T, n int, invNS, gateGroup string, w func(i int) waiter) []int {
	t.Helper()
	settled := func() []int {
		// The API server counts a watch shortly after it opens or closes:
		// take the count once it stopped moving.
		var last []int
		eventually(ctx, t, "watch counts settle", func() bool {
			c := watchCounts(t, statusResources(gateGroup))
			ok := slices.Equal(c, last)
			last = c
			hold(ctx, 500*time.Millisecond)
			return ok
		})
		return last
	}
	before := settled()
	namespaces := make([]string, n)
	runs := make([]*runResult, n)
	for i := range n {
		namespaces[i] = createNamespace(ctx, t, "applier")
	}
	for i, ns := range namespaces {
		runs[i] = startApply(ctx, newApplier(t, w(i)), invNS, "gated-"+ns, gatedInventory(gateGroup, ns), 3*time.Minute)
	}
	gate := object.ObjMetadata{GroupKind: schema.GroupKind{Group: gateGroup, Kind: "Gate"}, Name: "gate"}
	eventually(ctx, t, "every applier waits for its Gate", func() bool {
		for i, r := range runs {
			gate.Namespace = namespaces[i]
			if r.last(gate) != kstatus.InProgressStatus {
				return false
			}
		}
		return true
	})
	during := settled()
	for i, r := range runs {
		openGate(ctx, t, gateGroup, namespaces[i], "gate")
		objs := gatedInventory(gateGroup, namespaces[i])
		r.wait(ctx, t).expectReconciled(t, "applier in "+namespaces[i], object.UnstructuredSetToObjMetadataSet(objs), kstatus.CurrentStatus)
	}
	return sub(during, before)
}

// TestAppliersShareUpstreamWatches: appliers that wait through informerd
// cost the API server one watch per resource and namespace they wait in:
// with the default scope, five appliers in five namespaces (fewer than
// -scope-cluster-at) cost five namespaced watches of each resource, each
// receiving its namespace's events once; with -scope=cluster they cost
// one watch per resource, as much as one applier. With cli-utils'
// DefaultStatusWatcher each applier costs one watch per resource of its
// inventory (and LISTs of ReplicaSets and Pods instead of watches). The
// API server's own metrics count them.
func TestAppliersShareUpstreamWatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	gateGroup := createGateCRD(ctx, t)
	invNS := createNamespace(ctx, t, "inventory")
	throughDaemon := func(n int, scope cache.ScopeStrategy) []int {
		d := startDaemon(t, cache.Options{Scope: scope})
		defer d.stop() // its informers stop with it: the next phase starts from nothing
		return appliersWatches(ctx, t, n, invNS, gateGroup, func(i int) waiter { return d.waiter(t, fmt.Sprintf("applier-%d", i)) })
	}
	direct := func(n int) []int {
		return appliersWatches(ctx, t, n, invNS, gateGroup, func(int) waiter { return waiter{} })
	}
	oneDaemon, fiveDaemon, fiveCluster := throughDaemon(1, cache.ScopeAutomatic), throughDaemon(5, cache.ScopeAutomatic), throughDaemon(5, cache.ScopeCluster)
	oneDirect, fiveDirect := direct(1), direct(5)
	var b strings.Builder
	fmt.Fprintf(&b, "upstream watches added while the appliers wait (%s):\n", resourceNames(statusResources(gateGroup)))
	for _, row := range []struct {
		name string
		n    []int
	}{
		{"1 applier, informerd", oneDaemon}, {"5 appliers, informerd", fiveDaemon}, {"5 appliers, -scope=cluster", fiveCluster},
		{"1 applier, direct", oneDirect}, {"5 appliers, direct", fiveDirect},
	} {
		fmt.Fprintf(&b, "  %-27s %v\n", row.name, row.n)
	}
	t.Log(b.String())

	if want := []int{1, 1, 1, 1, 1, 1}; !slices.Equal(oneDaemon, want) || !slices.Equal(fiveCluster, want) {
		t.Fatalf("through informerd: 1 applier %v, 5 appliers with -scope=cluster %v; want %v each (one watch per resource)", oneDaemon, fiveCluster, want)
	}
	if want := []int{5, 5, 5, 5, 5, 5}; !slices.Equal(fiveDaemon, want) {
		t.Fatalf("through informerd, 5 appliers in 5 namespaces: %v, want %v (one watch per resource and namespace)", fiveDaemon, want)
	}
	if want := []int{1, 1, 1, 1, 0, 0}; !slices.Equal(oneDirect, want) {
		t.Fatalf("1 direct applier %v, want %v", oneDirect, want)
	}
	if want := []int{5, 5, 5, 5, 0, 0}; !slices.Equal(fiveDirect, want) {
		t.Fatalf("5 direct appliers %v, want %v", fiveDirect, want)
	}
}

func resourceNames(resources []schema.GroupVersionResource) string {
	var names []string
	for _, gvr := range resources {
		names = append(names, gvr.Resource)
	}
	return strings.Join(names, ", ")
}

// TestConcurrentCRDsAndObjects (issue 21, item 1): appliers each create
// a CRD and an object of it in one apply, 5 at once, 10 times over, in
// three ways side by side in the same trials:
//   - "informerd": informerd's StatusWatcher, and its RESTMapper as the
//     Applier's: every wait ends Current. The daemon never answers "not
//     served" from a discovery read before the request, and waits for
//     discovery to list a resource whose CRD its informer shows
//     Established.
//   - "dynamic": cli-utils' DefaultStatusWatcher over informerd's dynamic
//     client, with the Applier's default RESTMapper (the kubectl
//     factory's), and
//   - "direct": the same watcher and mapper over the API server. These two
//     share the reference's own race (its RESTMapper may map the kind
//     before the API server's discovery lists it, and nothing retries), so
//     informerd may add no timeout of its own: "dynamic" times out no more
//     than "direct".
func TestConcurrentCRDsAndObjects(t *testing.T) {
	const appliers, trials = 5, 10
	modes := []string{"informerd", "dynamic", "direct"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	invNS := createNamespace(ctx, t, "inventory")
	namespaces := map[string]string{}
	for _, mode := range modes {
		namespaces[mode] = createNamespace(ctx, t, "crd-race-"+mode)
	}
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	c := d.dial(t, readsAll)
	timeouts := map[string][]string{}
	for trial := range trials {
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, mode := range modes {
			for i := range appliers {
				group := fmt.Sprintf("t%d-a%d-%s.race.informerd.dev", trial, i, mode)
				objs := []*unstructured.Unstructured{crdObj(group, "Racer"), u(group+"/v1", "Racer", namespaces[mode], fmt.Sprintf("r%d", i), nil)}
				t.Cleanup(func() {
					_ = dyn.Resource(crdGVR).Delete(context.Background(), "racers."+group, metav1.DeleteOptions{})
				})
				f, inv := inventoryClient(t)
				b := apply.NewApplierBuilder().WithFactory(f).WithInventoryClient(inv)
				switch mode {
				case "informerd":
					b = b.WithRestMapper(client.NewRESTMapper(c)).WithStatusWatcher(d.statusWatcher(t, fmt.Sprintf("racer-%d", i)))
				case "dynamic":
					mapper, err := f.ToRESTMapper()
					if err != nil {
						t.Fatal(err)
					}
					b = b.WithStatusWatcher(watcher.NewDefaultStatusWatcher(client.NewDynamicClient(c, fmt.Sprintf("racer-%d", i), nil), mapper))
				}
				a, err := b.Build()
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					r := startApply(ctx, a, invNS, fmt.Sprintf("race-%s-%d-%d", mode, trial, i), objs, 20*time.Second).wait(ctx, t)
					if ok, why := r.reconciled(object.UnstructuredSetToObjMetadataSet(objs), kstatus.CurrentStatus); !ok {
						mu.Lock()
						defer mu.Unlock()
						timeouts[mode] = append(timeouts[mode], fmt.Sprintf("trial %d, applier %d: %s", trial, i, why))
					}
				})
			}
		}
		wg.Wait()
		t.Logf("trial %d: %d appliers in each of %d ways in %s", trial, appliers, len(modes), time.Since(start).Round(10*time.Millisecond))
	}
	for _, mode := range modes {
		t.Logf("%s: %d of %d applies did not end Current: %v", mode, len(timeouts[mode]), appliers*trials, timeouts[mode])
	}
	if n := len(timeouts["informerd"]); n > 0 {
		t.Errorf("with informerd's StatusWatcher and RESTMapper, %d applies did not end Current, want 0: %v", n, timeouts["informerd"])
	}
	if n, direct := len(timeouts["dynamic"]), len(timeouts["direct"]); n > direct {
		t.Errorf("through informerd's dynamic client, %d applies did not end Current, more than directly (%d)", n, direct)
	}
}

// TestDaemonRestartDuringReconcileWait: the daemon restarts while an
// applier waits; the wait completes once the objects are Current, and no
// object's status ever goes backwards.
func TestDaemonRestartDuringReconcileWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gateGroup := createGateCRD(ctx, t)
	invNS := createNamespace(ctx, t, "inventory")
	ns := createNamespace(ctx, t, "restart")
	socket := filepath.Join(t.TempDir(), "informerd.sock")
	d := startDaemonAt(t, socket, cache.Options{})
	objs := gatedInventory(gateGroup, ns)
	ids := object.UnstructuredSetToObjMetadataSet(objs)
	r := startApply(ctx, newApplier(t, d.waiter(t, "restart")), invNS, "restart", objs, 3*time.Minute)
	deployment := object.ObjMetadata{GroupKind: schema.GroupKind{Group: "apps", Kind: "Deployment"}, Namespace: ns, Name: "web"}
	gate := object.ObjMetadata{GroupKind: schema.GroupKind{Group: gateGroup, Kind: "Gate"}, Namespace: ns, Name: "gate"}
	eventually(ctx, t, "the Deployment is Current and the Gate holds the wait", func() bool {
		return r.last(deployment) == kstatus.CurrentStatus && r.last(gate) == kstatus.InProgressStatus
	})

	d.stop()
	d2 := startDaemonAt(t, socket, cache.Options{})
	eventually(ctx, t, "the applier's watcher is back on the new daemon", func() bool {
		for _, s := range d2.mgr.Sources() {
			if s.Key.GVR.Resource == "gates" && slices.Contains(s.Holders, "informerd-status") {
				return true
			}
		}
		return false
	})
	openGate(ctx, t, gateGroup, ns, "gate")
	r.wait(ctx, t).expectReconciled(t, "apply across a daemon restart", ids, kstatus.CurrentStatus)
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, ss := range r.statuses {
		if i := slices.Index(ss, kstatus.CurrentStatus); i >= 0 && slices.ContainsFunc(ss[i:], func(s kstatus.Status) bool { return s != kstatus.CurrentStatus }) {
			t.Fatalf("%s went back from Current: %v", id, ss)
		}
		for i := 1; i < len(ss); i++ {
			if ss[i] == ss[i-1] && id != deployment {
				t.Fatalf("%s reported %s twice in a row: %v", id, ss[i], ss)
			}
		}
	}
}

// TestInformerctlStatus: `informerctl status -f DIR` prints each object's
// status as it changes, exits 0 once all are Current, and exits 1 after
// -timeout naming the ones that are not.
func TestInformerctlStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gateGroup := createGateCRD(ctx, t)
	ns := createNamespace(ctx, t, "ctl")
	d := startDaemon(t, cache.Options{})
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gate := gateObj(gateGroup, ns, "gate")
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: gateGroup, Version: "v1", Resource: "gates"}).Namespace(ns).Create(ctx, gate, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createConfigMap(ctx, t, ns, "config", nil)
	dir := t.TempDir()
	manifest := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config}\n---\napiVersion: %s/v1\nkind: Gate\nmetadata: {name: gate, namespace: %s}\n", gateGroup, ns)
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	token := tokenFile(t, readsAll)
	run := func() (stdout, stderr string, code int) {
		return ctl(ctx, t, d.socket, token, "status", "-f", dir, "-namespace", ns, "-timeout", "5s")
	}
	stdout, stderr, code := run()
	if code != 1 || !strings.Contains(stderr, "timed out with 1 of 2 objects not Current: Gate."+gateGroup+" "+ns+"/gate (InProgress: held open by the test)") {
		t.Fatalf("with the Gate InProgress: exit %d, stderr %q; want 1 naming the Gate", code, stderr)
	}
	if !strings.Contains(stdout, "Current\tConfigMap "+ns+"/config\t") || !strings.Contains(stdout, "SYNCED\n") {
		t.Fatalf("stdout %q: want the ConfigMap's line and SYNCED", stdout)
	}
	openGate(ctx, t, gateGroup, ns, "gate")
	stdout, stderr, code = run()
	if code != 0 || !strings.Contains(stdout, "Current\tGate."+gateGroup+" "+ns+"/gate\t") {
		t.Fatalf("with every object Current: exit %d, stdout %q, stderr %q; want 0", code, stdout, stderr)
	}
}

// TestStatusForbiddenIsTerminal: when the daemon may not read a resource a
// status stream needs, the applier's watcher gets a terminal Forbidden
// ErrorEvent and its channel closes, as with cli-utils' own watcher.
func TestStatusForbiddenIsTerminal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	nsA, nsB := createNamespace(ctx, t, "allowed"), createNamespace(ctx, t, "denied")
	read := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}
	if err := controlplane.Grant(ctx, admin, nsA, "daemon", nsA, read); err != nil {
		t.Fatal(err)
	}
	token, err := controlplane.ServiceAccountToken(ctx, admin, nsA, "daemon")
	if err != nil {
		t.Fatal(err)
	}
	daemonIdentity := kubernetes.NewForConfigOrDie(env.TokenConfig(token))
	eventually(ctx, t, "the daemon's ServiceAccount may list configmaps in "+nsA, func() bool {
		_, err := daemonIdentity.CoreV1().ConfigMaps(nsA).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	d := startDaemon(t, cache.Options{Config: env.TokenConfig(token)})
	id := object.ObjMetadata{GroupKind: schema.GroupKind{Kind: "ConfigMap"}, Namespace: nsB, Name: "x"}
	var got []event.Event
	for ev := range d.statusWatcher(t, "forbidden").Watch(ctx, object.ObjMetadataSet{id}, watcher.Options{}) {
		got = append(got, ev)
	}
	if len(got) != 1 || got[0].Type != event.ErrorEvent || !apierrors.IsForbidden(got[0].Error) {
		t.Fatalf("events %v, want one Forbidden ErrorEvent, then the channel closed", got)
	}
	t.Logf("error event: %v", got[0].Error)
}
