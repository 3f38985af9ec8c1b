package status

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	configMapGK  = schema.GroupKind{Kind: "ConfigMap"}
	deploymentGK = schema.GroupKind{Group: "apps", Kind: "Deployment"}
	widgetGK     = schema.GroupKind{Group: "example.com", Kind: "Widget"}
)

func id(gk schema.GroupKind, ns, name string) object.ObjMetadata {
	return object.ObjMetadata{GroupKind: gk, Namespace: ns, Name: name}
}

func obj(apiVersion, kind, ns, name string, fields map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
	for k, v := range fields {
		u.Object[k] = v
	}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID(ns + "/" + name))
	return u
}

func configMap(ns, name string, data string) *unstructured.Unstructured {
	return obj("v1", "ConfigMap", ns, name, map[string]any{"data": map[string]any{"k": data}})
}

func widget(ns, name string) *unstructured.Unstructured {
	return obj("example.com/v1", "Widget", ns, name, nil)
}

// pod is a Pod with labels; ready makes it Running and Ready, else it is
// Pending and unschedulable.
func pod(ns, name string, labels map[string]string, ready bool) *unstructured.Unstructured {
	st := map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
	if !ready {
		st = map[string]any{"phase": "Pending", "conditions": []any{map[string]any{
			"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
		}}}
	}
	u := obj("v1", "Pod", ns, name, map[string]any{"status": st})
	u.SetLabels(labels)
	u.SetCreationTimestamp(metav1.Now())
	return u
}

// deployment is a rolled-out Deployment of one replica selecting app=name,
// with a ReplicaSet of it and that ReplicaSet's Pods' labels.
func deployment(ns, name string) (d, rs *unstructured.Unstructured, podLabels map[string]string) {
	sel := map[string]any{"matchLabels": map[string]any{"app": name}}
	d = obj("apps/v1", "Deployment", ns, name, map[string]any{
		"spec": map[string]any{"replicas": int64(1), "selector": sel},
		"status": map[string]any{
			"observedGeneration": int64(1), "replicas": int64(1), "updatedReplicas": int64(1),
			"readyReplicas": int64(1), "availableReplicas": int64(1),
			"conditions": []any{map[string]any{"type": "Available", "status": "True"}},
		},
	})
	d.SetGeneration(1)
	podLabels = map[string]string{"app": name, "pod-template-hash": "h1"}
	rs = obj("apps/v1", "ReplicaSet", ns, name+"-h1", map[string]any{
		"spec": map[string]any{"replicas": int64(1), "selector": map[string]any{"matchLabels": map[string]any{
			"app": name, "pod-template-hash": "h1",
		}}},
		"status": map[string]any{
			"observedGeneration": int64(1), "replicas": int64(1), "readyReplicas": int64(1),
			"availableReplicas": int64(1), "fullyLabeledReplicas": int64(1),
		},
	})
	rs.SetGeneration(1)
	rs.SetLabels(podLabels)
	return d, rs, podLabels
}

// poll returns what w has now, without waiting: call it after
// synctest.Wait.
func poll(t *testing.T, w *Watch) Batch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b, err := w.Next(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Next: %v", err)
	}
	return b
}

// grant grants every Access in b and waits for the engine to settle.
func grant(t *testing.T, w *Watch, b Batch) {
	t.Helper()
	if err := w.Grant(context.Background(), b.Access); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
}

// summary describes statuses as "kind/name=Status" for comparison.
func summary(rss []*event.ResourceStatus) []string {
	var out []string
	for _, rs := range rss {
		out = append(out, fmt.Sprintf("%s/%s=%s", rs.Identifier.GroupKind.Kind, rs.Identifier.Name, rs.Status))
	}
	return out
}

func resourceStatuses(ss []Status) []*event.ResourceStatus {
	out := make([]*event.ResourceStatus, len(ss))
	for i, s := range ss {
		out[i] = s.ResourceStatus
	}
	return out
}

func expectStatuses(t *testing.T, b Batch, want ...string) {
	t.Helper()
	if got := summary(resourceStatuses(b.Statuses)); !slices.Equal(got, want) {
		t.Fatalf("statuses %q, want %q", got, want)
	}
}

func start(t *testing.T, src *fakeSource) *Engine {
	e := newEngine(Options{}, src)
	t.Cleanup(e.Close)
	return e
}

func watch(t *testing.T, e *Engine, s watcher.RESTScopeStrategy, ids ...object.ObjMetadata) *Watch {
	t.Helper()
	w, err := e.Watch(context.Background(), Request{IDs: ids, Strategy: s, Holder: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	synctest.Wait()
	return w
}

// TestSyncedAfterEveryInitialStatus: a Watch delivers every object's first
// status (NotFound for an absent object and for a kind the API server does
// not serve), then Synced; nothing read from a resource before its Access
// is granted, and no informer started before.
func TestSyncedAfterEveryInitialStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(configMapGK, "configmaps")
		src.put(t, configMap("ns", "present", "x"))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeAutomatic,
			id(configMapGK, "ns", "present"), id(configMapGK, "ns", "absent"), id(widgetGK, "ns", "w"))

		b := poll(t, w)
		want := []Access{{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: "ns"}}
		if !slices.Equal(b.Access, want) {
			t.Fatalf("Access %v, want %v", b.Access, want)
		}
		expectStatuses(t, b, "Widget/w=NotFound") // a kind that is not served needs no grant
		if b.Synced || src.subscriptions(configMapGK) != 0 {
			t.Fatalf("before the grant: synced %v, %d informers started", b.Synced, src.subscriptions(configMapGK))
		}
		grant(t, w, b)
		b = poll(t, w)
		expectStatuses(t, b, "ConfigMap/absent=NotFound", "ConfigMap/present=Current")
		if !b.Synced {
			t.Fatal("not Synced after every status")
		}
		if b.Statuses[1].Resource.GetUID() != "ns/present" || b.Statuses[0].Resource != nil {
			t.Fatalf("Resource: %v and %v", b.Statuses[1].Resource, b.Statuses[0].Resource)
		}
		src.put(t, configMap("ns", "absent", "y"))
		synctest.Wait()
		b = poll(t, w)
		expectStatuses(t, b, "ConfigMap/absent=Current")
		if b.Synced {
			t.Fatal("Synced twice")
		}
	})
}

// TestOnlyChangesAreDelivered: a change that leaves status, message,
// generation and UID alone is computed once and delivered to nobody;
// deletion is NotFound; recreation (a new UID) and a new generation are
// changes.
func TestOnlyChangesAreDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(configMapGK, "configmaps")
		src.put(t, configMap("ns", "cm", "1"))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(configMapGK, "ns", "cm"))
		grant(t, w, poll(t, w))
		expectStatuses(t, poll(t, w), "ConfigMap/cm=Current")

		before := testutil.ToFloat64(e.metrics.computations)
		src.put(t, configMap("ns", "cm", "2"))
		synctest.Wait()
		expectStatuses(t, poll(t, w))
		if n := testutil.ToFloat64(e.metrics.computations) - before; n != 1 {
			t.Fatalf("%v computations for one change, want 1", n)
		}

		next := configMap("ns", "cm", "3")
		next.SetGeneration(2)
		src.put(t, next)
		synctest.Wait()
		b := poll(t, w)
		expectStatuses(t, b, "ConfigMap/cm=Current")
		// The object comes with the status, as the cache holds it (the same
		// bytes, not a copy): the latest version, not the one computed
		// before the change that sent nothing.
		cm := id(configMapGK, "ns", "cm")
		if got, want := b.Statuses[0].Objects[cm], src.data(configMapGK, "ns", "cm"); len(got) == 0 || &got[0] != &want[0] {
			t.Fatalf("object %s, want the cache's bytes %s", got, want)
		}
		if b.Statuses[0].Resource.GetGeneration() != 2 {
			t.Fatalf("generation %d, want 2", b.Statuses[0].Resource.GetGeneration())
		}

		src.remove(configMapGK, "ns", "cm")
		synctest.Wait()
		expectStatuses(t, poll(t, w), "ConfigMap/cm=NotFound")
		again := configMap("ns", "cm", "3")
		again.SetUID("new")
		again.SetGeneration(2)
		src.put(t, again)
		synctest.Wait()
		expectStatuses(t, poll(t, w), "ConfigMap/cm=Current")
	})
}

// TestComputedOnceForEveryWatch: two Watches of one object share one
// computation per change; objects nobody asks for are never computed; the
// informers are released with the last Watch.
func TestComputedOnceForEveryWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(configMapGK, "configmaps")
		src.put(t, configMap("ns", "cm", "1"))
		src.put(t, configMap("ns", "other", "1"))
		e := start(t, src)
		w1 := watch(t, e, watcher.RESTScopeNamespace, id(configMapGK, "ns", "cm"))
		grant(t, w1, poll(t, w1))
		w2 := watch(t, e, watcher.RESTScopeRoot, id(configMapGK, "ns", "cm"))
		grant(t, w2, poll(t, w2))
		expectStatuses(t, poll(t, w1), "ConfigMap/cm=Current")
		expectStatuses(t, poll(t, w2), "ConfigMap/cm=Current")
		if n := testutil.ToFloat64(e.metrics.computations); n != 1 {
			t.Fatalf("%v computations for one object watched twice, want 1", n)
		}
		src.put(t, configMap("ns", "other", "2"))
		next := configMap("ns", "cm", "2")
		next.SetGeneration(5)
		src.put(t, next)
		synctest.Wait()
		expectStatuses(t, poll(t, w1), "ConfigMap/cm=Current")
		expectStatuses(t, poll(t, w2), "ConfigMap/cm=Current")
		if n := testutil.ToFloat64(e.metrics.computations); n != 2 {
			t.Fatalf("%v computations after one change to a watched object and one to another, want 2", n)
		}
		if src.subscriptions(configMapGK) != 1 {
			t.Fatalf("%d subscriptions for one kind in one namespace, want 1", src.subscriptions(configMapGK))
		}
		w1.Close()
		w2.Close()
		synctest.Wait()
		if f := testutil.ToFloat64(e.metrics.feeds); f != 0 {
			t.Fatalf("%v feeds after the last Watch closed", f)
		}
		src.mu.Lock()
		defer src.mu.Unlock()
		if len(src.subs) != 0 {
			t.Fatalf("%d subscriptions still open", len(src.subs))
		}
	})
}

// TestGeneratedResources: a Deployment's status carries its ReplicaSets
// and their Pods; a change to one of them is a change of the Deployment's,
// including a Pod that stops matching; an unrelated Pod recomputes nothing.
func TestGeneratedResources(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(deploymentGK, "deployments")
		src.serve(replicaSetGK, "replicasets")
		src.serve(podGK, "pods")
		d, rs, labels := deployment("ns", "web")
		src.put(t, d)
		src.put(t, rs)
		src.put(t, pod("ns", "web-1", labels, true))
		src.put(t, pod("ns", "unrelated", map[string]string{"app": "other"}, true))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(deploymentGK, "ns", "web"))
		b := poll(t, w)
		if len(b.Access) != 3 {
			t.Fatalf("Access %v, want deployments, replicasets and pods", b.Access)
		}
		grant(t, w, b)
		b = poll(t, w)
		expectStatuses(t, b, "Deployment/web=Current")
		gen := b.Statuses[0].GeneratedResources
		if got := summary(gen); !slices.Equal(got, []string{"ReplicaSet/web-h1=Current"}) {
			t.Fatalf("generated %q", got)
		}
		if got := summary(gen[0].GeneratedResources); !slices.Equal(got, []string{"Pod/web-1=Current"}) {
			t.Fatalf("generated of the ReplicaSet %q", got)
		}
		if gen[0].Resource != nil {
			t.Fatal("a generated resource carries its object")
		}
		for _, o := range []object.ObjMetadata{id(deploymentGK, "ns", "web"), id(replicaSetGK, "ns", "web-h1"), id(podGK, "ns", "web-1")} {
			if got, want := b.Statuses[0].Objects[o], src.data(o.GroupKind, o.Namespace, o.Name); len(got) == 0 || &got[0] != &want[0] {
				t.Fatalf("objects %v: %s is not the cache's", b.Statuses[0].Objects, o)
			}
		}
		if len(b.Statuses[0].Objects) != 3 {
			t.Fatalf("objects of %d objects, want the Deployment, its ReplicaSet and its Pod", len(b.Statuses[0].Objects))
		}

		before := testutil.ToFloat64(e.metrics.computations)
		src.put(t, pod("ns", "unrelated", map[string]string{"app": "other", "x": "y"}, true))
		synctest.Wait()
		if n := testutil.ToFloat64(e.metrics.computations) - before; n != 0 {
			t.Fatalf("an unrelated Pod caused %v computations", n)
		}

		notReady := pod("ns", "web-1", labels, true)
		if err := unstructured.SetNestedSlice(notReady.Object, []any{map[string]any{"type": "Ready", "status": "False"}}, "status", "conditions"); err != nil {
			t.Fatal(err)
		}
		src.put(t, notReady)
		synctest.Wait()
		b = poll(t, w)
		expectStatuses(t, b, "Deployment/web=Current")
		if got := summary(b.Statuses[0].GeneratedResources[0].GeneratedResources); !slices.Equal(got, []string{"Pod/web-1=InProgress"}) {
			t.Fatalf("after the Pod became unready: %q", got)
		}

		src.put(t, pod("ns", "web-1", map[string]string{"app": "moved"}, true))
		synctest.Wait()
		b = poll(t, w)
		expectStatuses(t, b, "Deployment/web=Current")
		if got := b.Statuses[0].GeneratedResources[0].GeneratedResources; len(got) != 0 {
			t.Fatalf("a Pod that stopped matching is still generated: %q", summary(got))
		}
	})
}

// TestUnschedulablePodFailsAfterTheWindow: an unschedulable Pod is
// InProgress, and Failed once 15 s passed since its last change: not
// before, and every change restarts the 15 s.
func TestUnschedulablePodFailsAfterTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(podGK, "pods")
		p := pod("ns", "p", nil, false)
		src.put(t, p)
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(podGK, "ns", "p"))
		grant(t, w, poll(t, w))
		expectStatuses(t, poll(t, w), "Pod/p=InProgress")

		time.Sleep(kstatus.ScheduleWindow - time.Millisecond)
		synctest.Wait()
		expectStatuses(t, poll(t, w))
		time.Sleep(time.Millisecond)
		synctest.Wait()
		expectStatuses(t, poll(t, w), "Pod/p=Failed")

		q := pod("ns", "q", nil, false)
		src.put(t, q)
		w2 := watch(t, e, watcher.RESTScopeNamespace, id(podGK, "ns", "q"))
		grant(t, w2, poll(t, w2))
		expectStatuses(t, poll(t, w2), "Pod/q=InProgress")
		time.Sleep(10 * time.Second)
		q.SetLabels(map[string]string{"touched": "yes"})
		src.put(t, q) // restarts the window
		synctest.Wait()
		expectStatuses(t, poll(t, w2))
		time.Sleep(kstatus.ScheduleWindow - time.Millisecond)
		synctest.Wait()
		expectStatuses(t, poll(t, w2))
		time.Sleep(time.Millisecond)
		synctest.Wait()
		expectStatuses(t, poll(t, w2), "Pod/q=Failed")
	})
}

// TestResourceServedDuringTheWatch: objects of a kind served only after
// the Watch started are watched once it is (after its Access is granted);
// when it stops being served they are NotFound, and the Watch goes on for
// the other kinds.
func TestResourceServedDuringTheWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(configMapGK, "configmaps")
		src.put(t, configMap("ns", "cm", "1"))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(widgetGK, "ns", "w"), id(configMapGK, "ns", "cm"))
		b := poll(t, w)
		expectStatuses(t, b, "Widget/w=NotFound")
		grant(t, w, b)
		b = poll(t, w)
		expectStatuses(t, b, "ConfigMap/cm=Current")
		if !b.Synced {
			t.Fatal("not Synced")
		}

		src.serve(widgetGK, "widgets")
		src.put(t, widget("ns", "w"))
		synctest.Wait()
		b = poll(t, w)
		want := []Access{{GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}, Namespace: "ns"}}
		if !slices.Equal(b.Access, want) || len(b.Statuses) != 0 {
			t.Fatalf("once served: Access %v, statuses %q; want only the Access %v", b.Access, summary(resourceStatuses(b.Statuses)), want)
		}
		grant(t, w, b)
		expectStatuses(t, poll(t, w), "Widget/w=Current")

		src.unserve(widgetGK)
		synctest.Wait()
		expectStatuses(t, poll(t, w), "Widget/w=NotFound")
		next := configMap("ns", "cm", "2")
		next.SetGeneration(3)
		src.put(t, next)
		synctest.Wait()
		expectStatuses(t, poll(t, w), "ConfigMap/cm=Current")

		src.serve(widgetGK, "widgets")
		src.put(t, widget("ns", "w"))
		synctest.Wait()
		expectStatuses(t, poll(t, w), "Widget/w=Current") // granted already
	})
}

// TestForbiddenEndsTheWatch: when the daemon may not read a resource a
// Watch needs, the Watch ends with ErrForbidden wrapping the API server's
// answer.
func TestForbiddenEndsTheWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(configMapGK, "configmaps")
		src.deny(configMapGK, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "", errors.New("no")))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(configMapGK, "ns", "cm"))
		grant(t, w, poll(t, w))
		_, err := w.Next(context.Background())
		if !errors.Is(err, ErrForbidden) || !apierrors.IsForbidden(err) {
			t.Fatalf("Next = %v, want ErrForbidden wrapping a 403", err)
		}
	})
}

// TestScopeStrategy: the Access namespaces follow cli-utils' REST scope
// strategies, for the objects' kinds and their generated kinds.
func TestScopeStrategy(t *testing.T) {
	cm := func(ns string) object.ObjMetadata { return id(configMapGK, ns, "x") }
	for _, tc := range []struct {
		name     string
		strategy watcher.RESTScopeStrategy
		ids      []object.ObjMetadata
		want     []string
	}{
		{"automatic, one namespace", watcher.RESTScopeAutomatic, []object.ObjMetadata{cm("a")}, []string{"configmaps in a"}},
		{"automatic, two namespaces", watcher.RESTScopeAutomatic, []object.ObjMetadata{cm("a"), cm("b")}, []string{"configmaps in "}},
		{"automatic, a cluster-scoped object", watcher.RESTScopeAutomatic, []object.ObjMetadata{cm("a"), id(widgetGK, "", "w")}, []string{"configmaps in ", "widgets in "}},
		{"root", watcher.RESTScopeRoot, []object.ObjMetadata{cm("a")}, []string{"configmaps in "}},
		{"namespace", watcher.RESTScopeNamespace, []object.ObjMetadata{cm("a"), cm("b")}, []string{"configmaps in a", "configmaps in b"}},
		{"generated", watcher.RESTScopeNamespace, []object.ObjMetadata{id(deploymentGK, "a", "d")}, []string{"deployments in a", "pods in a", "replicasets in a"}},
		// cli-utils lists generated resources in the object's namespace
		// whatever the strategy: an applier allowed Deployments
		// cluster-wide and Pods in its namespaces works with it.
		{"generated, root", watcher.RESTScopeRoot, []object.ObjMetadata{id(deploymentGK, "a", "d")}, []string{"deployments in ", "pods in a", "replicasets in a"}},
		{"a Pod asked about and generated, root", watcher.RESTScopeRoot, []object.ObjMetadata{id(deploymentGK, "a", "d"), id(podGK, "a", "p")},
			[]string{"deployments in ", "pods in ", "pods in a", "replicasets in a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := newFakeSource()
				for gk, r := range map[schema.GroupKind]string{configMapGK: "configmaps", widgetGK: "widgets", deploymentGK: "deployments", replicaSetGK: "replicasets", podGK: "pods"} {
					src.serve(gk, r)
				}
				e := start(t, src)
				w := watch(t, e, tc.strategy, tc.ids...)
				var got []string
				for _, a := range poll(t, w).Access {
					got = append(got, a.GVR.Resource+" in "+a.Namespace)
				}
				slices.Sort(got)
				got = slices.Compact(got)
				if !slices.Equal(got, tc.want) {
					t.Fatalf("Access %q, want %q", got, tc.want)
				}
			})
		})
	}
}

// TestClusterScopedKindInANamespaceIsNotFound: an object of a
// cluster-scoped kind named in a namespace does not exist (the API server
// answers 404 for its path): it is NotFound, and nothing is authorized or
// read for it, so a Role of that namespace cannot start a cluster-wide
// informer through it. The same kind named without a namespace is read
// cluster-wide.
func TestClusterScopedKindInANamespaceIsNotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		nodeGK := schema.GroupKind{Kind: "Node"}
		src.serve(nodeGK, "nodes")
		src.cluster = map[schema.GroupKind]bool{nodeGK: true}
		src.put(t, obj("v1", "Node", "", "n1", nil))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(nodeGK, "mine", "n1"))
		b := poll(t, w)
		if len(b.Access) != 0 || src.subscriptions(nodeGK) != 0 {
			t.Fatalf("Access %v and %d informers for a Node named in a namespace", b.Access, src.subscriptions(nodeGK))
		}
		expectStatuses(t, b, "Node/n1=NotFound")
		if !b.Synced {
			t.Fatal("not Synced")
		}

		w = watch(t, e, watcher.RESTScopeNamespace, id(nodeGK, "", "n1"))
		b = poll(t, w)
		if want := []Access{{GVR: schema.GroupVersionResource{Version: "v1", Resource: "nodes"}}}; !slices.Equal(b.Access, want) {
			t.Fatalf("Access %v, want %v", b.Access, want)
		}
		grant(t, w, b)
		expectStatuses(t, poll(t, w), "Node/n1=Current")
	})
}

// TestCloseEndsWatches: closing the Engine ends every Watch with
// ErrStopped and stops every feed.
func TestCloseEndsWatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(configMapGK, "configmaps")
		e := newEngine(Options{}, src)
		w, err := e.Watch(context.Background(), Request{IDs: []object.ObjMetadata{id(configMapGK, "ns", "cm")}})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		grant(t, w, poll(t, w))
		poll(t, w)
		e.Close()
		if _, err := w.Next(context.Background()); !errors.Is(err, ErrStopped) {
			t.Fatalf("Next after Close = %v, want ErrStopped", err)
		}
		w.Close()
		if _, err := e.Watch(context.Background(), Request{}); !errors.Is(err, ErrStopped) {
			t.Fatalf("Watch after Close = %v, want ErrStopped", err)
		}
	})
}

// TestNewVersionNeedsANewGrant: when a CRD is deleted and created again
// serving another version, its feed reports the new resource's Access and
// subscribes to it only once a Watch has granted that Access: the grant of
// the old version does not start the new one's informer.
func TestNewVersionNeedsANewGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(widgetGK, "widgets")
		src.put(t, widget("ns", "w"))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(widgetGK, "ns", "w"))
		grant(t, w, poll(t, w))
		expectStatuses(t, poll(t, w), "Widget/w=Current")

		src.unserve(widgetGK)
		synctest.Wait()
		expectStatuses(t, poll(t, w), "Widget/w=NotFound")
		src.serveVersion(widgetGK, "v2", "widgets")
		src.put(t, obj("example.com/v2", "Widget", "ns", "w", nil))
		synctest.Wait()
		b := poll(t, w)
		want := []Access{{GVR: schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "widgets"}, Namespace: "ns"}}
		if !slices.Equal(b.Access, want) || len(b.Statuses) != 0 {
			t.Fatalf("served as v2: Access %v, statuses %q; want only the Access %v", b.Access, summary(resourceStatuses(b.Statuses)), want)
		}
		if n := src.subscriptions(widgetGK); n != 1 {
			t.Fatalf("%d subscriptions before v2 was granted, want 1 (v1's)", n)
		}
		grant(t, w, b)
		expectStatuses(t, poll(t, w), "Widget/w=Current")
		if n := src.subscriptions(widgetGK); n != 2 {
			t.Fatalf("%d subscriptions after v2 was granted, want 2", n)
		}
	})
}

// TestChangesWithinTheHoldAreComputedOnce: a change to an object computed
// less than its hold ago (coalesce: a multiple of what computing it
// costs) is computed once the hold ends, together with every other change
// meanwhile; a change after a quiet hold is computed at once. A generated
// Pod's status is computed once per resourceVersion, and forgotten with
// the Pod.
func TestChangesWithinTheHoldAreComputedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(deploymentGK, "deployments")
		src.serve(replicaSetGK, "replicasets")
		src.serve(podGK, "pods")
		d, rs, labels := deployment("ns", "web")
		src.put(t, d)
		src.put(t, rs)
		src.put(t, pod("ns", "web-1", labels, true))
		src.put(t, pod("ns", "web-2", labels, true))
		e := newEngine(Options{}, src)
		t.Cleanup(e.Close)
		const hold = 100 * time.Millisecond
		e.holdFor = func(time.Duration) time.Duration { return hold } // before the loop reads it (Watch syncs with it)
		w := watch(t, e, watcher.RESTScopeNamespace, id(deploymentGK, "ns", "web"))
		grant(t, w, poll(t, w))
		expectStatuses(t, poll(t, w), "Deployment/web=Current")

		before := testutil.ToFloat64(e.metrics.computations)
		unready := func(name string) {
			p := pod("ns", name, labels, true)
			if err := unstructured.SetNestedSlice(p.Object, []any{map[string]any{"type": "Ready", "status": "False"}}, "status", "conditions"); err != nil {
				t.Fatal(err)
			}
			src.put(t, p)
		}
		unready("web-1")
		synctest.Wait()
		time.Sleep(hold / 2)
		unready("web-2")
		synctest.Wait()
		if b := poll(t, w); len(b.Statuses) != 0 || testutil.ToFloat64(e.metrics.computations) != before {
			t.Fatalf("within the hold: statuses %q, %v computations", summary(resourceStatuses(b.Statuses)), testutil.ToFloat64(e.metrics.computations)-before)
		}
		time.Sleep(hold / 2)
		synctest.Wait()
		b := poll(t, w)
		expectStatuses(t, b, "Deployment/web=Current")
		if got := summary(b.Statuses[0].GeneratedResources[0].GeneratedResources); !slices.Equal(got, []string{"Pod/web-1=InProgress", "Pod/web-2=InProgress"}) {
			t.Fatalf("after the hold: %q", got)
		}
		if n := testutil.ToFloat64(e.metrics.computations) - before; n != 1 {
			t.Fatalf("%v computations for two changes within the hold, want 1", n)
		}

		f := e.feeds[feedKey{podGK, "ns"}]
		kept := f.podStatuses["web-2"]
		time.Sleep(hold)
		src.put(t, pod("ns", "web-1", labels, true))
		synctest.Wait()
		b = poll(t, w)
		if got := summary(b.Statuses[0].GeneratedResources[0].GeneratedResources); !slices.Equal(got, []string{"Pod/web-1=Current", "Pod/web-2=InProgress"}) {
			t.Fatalf("a change after a quiet hold: %q", got)
		}
		if c := f.podStatuses["web-2"]; c == nil || c != kept || b.Statuses[0].GeneratedResources[0].GeneratedResources[1] != c.rs {
			t.Fatalf("web-2, unchanged, was computed again: %+v, was %+v", c, kept)
		}
		time.Sleep(hold)
		src.remove(podGK, "ns", "web-2")
		synctest.Wait()
		expectStatuses(t, poll(t, w), "Deployment/web=Current")
		if _, ok := f.podStatuses["web-2"]; ok {
			t.Fatal("a deleted Pod's status is still kept")
		}
	})
}
