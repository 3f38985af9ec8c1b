package status

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/cache"
)

// randomLabels draws a label set from a small alphabet, so that selectors
// match some objects and miss others.
func randomLabels(r *rand.Rand) labels.Set {
	ls := labels.Set{}
	for _, k := range []string{"app", "tier", "hash"} {
		if r.IntN(4) > 0 {
			ls[k] = fmt.Sprint(r.IntN(3))
		}
	}
	return ls
}

// randomSelector draws a selector of every kind the readers can pass:
// equality requirements, set-based ones only, both, Everything and
// Nothing.
func randomSelector(t *testing.T, r *rand.Rand) labels.Selector {
	switch r.IntN(8) {
	case 0:
		return labels.Everything()
	case 1:
		return labels.Nothing()
	}
	ops := []selection.Operator{selection.Equals, selection.DoubleEquals, selection.In, selection.NotEquals,
		selection.NotIn, selection.Exists, selection.DoesNotExist}
	sel := labels.NewSelector()
	for range 1 + r.IntN(3) {
		op := ops[r.IntN(len(ops))]
		var vals []string
		switch op {
		case selection.Equals, selection.DoubleEquals, selection.NotEquals:
			vals = []string{fmt.Sprint(r.IntN(3))}
		case selection.In, selection.NotIn:
			for range 1 + r.IntN(2) {
				vals = append(vals, fmt.Sprint(r.IntN(3)))
			}
		}
		req, err := labels.NewRequirement([]string{"app", "tier", "hash"}[r.IntN(3)], op, vals)
		if err != nil {
			t.Fatal(err)
		}
		sel = sel.Add(*req)
	}
	return sel
}

// scan is what cache.Subscription.List returns: every object in namespace
// ("" for all) that sel matches, in storage-key order.
func scan(objs map[objKey]*cache.Object, namespace string, sel labels.Selector) []*cache.Object {
	var out []*cache.Object
	for _, o := range objs {
		if (namespace == "" || o.Namespace == namespace) && sel.Matches(o.Labels) {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *cache.Object) int {
		return cache.CompareKeys(a.Namespace, a.Name, b.Namespace, b.Name)
	})
	return out
}

// TestObjectIndexListsAsAScan: whatever the events (additions,
// relabellings, deletions, resets) and whenever the first list comes, a
// list by any selector returns exactly the objects, in the order, that a
// scan of the objects does.
func TestObjectIndexListsAsAScan(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		var x objectIndex
		want := map[objKey]*cache.Object{}
		firstList := r.IntN(50)
		for step := range 400 {
			k := objKey{[]string{"a", "b"}[r.IntN(2)], fmt.Sprintf("o%d", r.IntN(30))}
			switch n := r.IntN(20); {
			case n == 0:
				x.reset()
				clear(want)
			case n < 6:
				x.remove(&cache.Object{Namespace: k.namespace, Name: k.name})
				delete(want, k)
			default:
				o := &cache.Object{Namespace: k.namespace, Name: k.name, Labels: randomLabels(r), ResourceVersion: fmt.Sprint(step)}
				x.put(o)
				want[k] = o
			}
			if step < firstList {
				continue
			}
			for range 3 {
				sel := randomSelector(t, r)
				by, indexed := x.rarest(sel)
				for _, ns := range []string{"a", ""} {
					if got, want := x.list(ns, sel, by, indexed), scan(want, ns, sel); !slices.Equal(got, want) {
						t.Fatalf("seed %d step %d: list(%q, %q) = %v, a scan gives %v", seed, step, ns, sel, got, want)
					}
				}
				if indexed && !slices.Contains(equalities(sel), by) {
					t.Fatalf("seed %d: %q indexed by %v, not one of its equality requirements", seed, sel, by)
				}
			}
		}
	}
}

// TestDepIndexFindsEveryLister: whatever lists the targets' statuses came
// from, and however they change, the targets an object's change is
// matched against are exactly those that listed it or whose selector
// matches it (target.lists, what every dependent was matched with
// before); a target whose deps are gone leaves nothing in the index.
func TestDepIndexFindsEveryLister(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 2))
		f := &feed{}
		var objs objectIndex
		for i := range 30 {
			objs.put(&cache.Object{Namespace: "ns", Name: fmt.Sprintf("o%d", i), Labels: randomLabels(r)})
		}
		targets := make([]*target, 10)
		for i := range targets {
			targets[i] = &target{}
		}
		for step := range 200 {
			tg := targets[r.IntN(len(targets))]
			var deps []dep
			for range r.IntN(3) {
				d := dep{feed: f, sel: randomSelector(t, r), names: map[string]struct{}{}}
				d.by, d.indexed = objs.rarest(d.sel)
				for range r.IntN(3) {
					d.names[fmt.Sprintf("o%d", r.IntN(40))] = struct{}{}
				}
				deps = append(deps, d)
			}
			setDeps(tg, deps)
			for range 5 {
				o := &cache.Object{Namespace: "ns", Name: fmt.Sprintf("o%d", r.IntN(40)), Labels: randomLabels(r)}
				got := map[*target]bool{}
				f.listers.listers(f, o, func(t *target) { got[t] = true })
				want := map[*target]bool{}
				for _, tg := range targets {
					if tg.lists(f, o) {
						want[tg] = true
					}
				}
				if !maps.Equal(got, want) {
					t.Fatalf("seed %d step %d: %s %v found %d targets, %d list it", seed, step, o.Name, o.Labels, len(got), len(want))
				}
			}
		}
		for _, tg := range targets {
			setDeps(tg, nil)
		}
		if x := f.listers; len(x.byLabel)+len(x.byName)+len(x.scan) != 0 {
			t.Fatalf("seed %d: entries left without deps: %+v", seed, x)
		}
	}
}

// indexed reports whether f's depIndex refers to t.
func indexed(f *feed, t *target) bool {
	x := f.listers
	if _, ok := x.scan[t]; ok {
		return true
	}
	for p := range x.byLabel {
		if x.byLabel.has(p, t) {
			return true
		}
	}
	for n := range x.byName {
		if x.byName.has(n, t) {
			return true
		}
	}
	return false
}

// TestRelabelledPodRecomputesBothDeployments: among Deployments sharing a
// namespace, a Pod whose labels move it from one Deployment's selector to
// another's recomputes both (the one it left because its status listed
// the Pod), and no other.
func TestRelabelledPodRecomputesBothDeployments(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(deploymentGK, "deployments")
		src.serve(replicaSetGK, "replicasets")
		src.serve(podGK, "pods")
		var ids []object.ObjMetadata
		for _, name := range []string{"web", "api", "db"} {
			d, rs, labels := deployment("ns", name)
			src.put(t, d)
			src.put(t, rs)
			src.put(t, pod("ns", name+"-1", labels, true))
			ids = append(ids, id(deploymentGK, "ns", name))
		}
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, ids...)
		grant(t, w, poll(t, w))
		expectStatuses(t, poll(t, w), "Deployment/api=Current", "Deployment/db=Current", "Deployment/web=Current")

		before := testutil.ToFloat64(e.metrics.computations)
		_, _, apiLabels := deployment("ns", "api")
		src.put(t, pod("ns", "web-1", apiLabels, false))
		synctest.Wait()
		if n := testutil.ToFloat64(e.metrics.computations) - before; n != 2 {
			t.Fatalf("%v computations for a Pod moved from web to api, want 2", n)
		}
		b := poll(t, w)
		expectStatuses(t, b, "Deployment/api=Current", "Deployment/web=Current")
		pods := func(s Status) []string { return summary(s.GeneratedResources[0].GeneratedResources) }
		if got := pods(b.Statuses[0]); !slices.Equal(got, []string{"Pod/api-1=Current", "Pod/web-1=InProgress"}) {
			t.Fatalf("api's Pods %q", got)
		}
		if got := pods(b.Statuses[1]); len(got) != 0 {
			t.Fatalf("web's Pods %q, want none", got)
		}
	})
}

// TestSelectorsWithoutEqualitySeeChanges: a DaemonSet selecting every Pod
// (an empty selector) and a Job whose selector has only set-based
// requirements are recomputed when a Pod they match appears, changes and
// stops matching.
func TestSelectorsWithoutEqualitySeeChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(daemonSetGK, "daemonsets")
		src.serve(jobGK, "jobs")
		src.serve(podGK, "pods")
		src.put(t, obj("apps/v1", "DaemonSet", "ns", "all", map[string]any{"spec": map[string]any{"selector": map[string]any{}}}))
		src.put(t, obj("batch/v1", "Job", "ns", "batch", map[string]any{"spec": map[string]any{"selector": map[string]any{
			"matchExpressions": []any{map[string]any{"key": "job", "operator": "In", "values": []any{"a", "b"}}},
		}}}))
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(daemonSetGK, "ns", "all"), id(jobGK, "ns", "batch"))
		grant(t, w, poll(t, w))
		generated := func() map[string][]string {
			t.Helper()
			synctest.Wait()
			out := map[string][]string{}
			for _, s := range poll(t, w).Statuses {
				out[s.Identifier.Name] = summary(s.GeneratedResources)
			}
			return out
		}
		generated()

		for _, step := range []struct {
			pod  *unstructured.Unstructured
			want map[string][]string
		}{
			{pod("ns", "p", map[string]string{"job": "a"}, true), map[string][]string{"all": {"Pod/p=Current"}, "batch": {"Pod/p=Current"}}},
			{pod("ns", "p", map[string]string{"job": "a"}, false), map[string][]string{"all": {"Pod/p=InProgress"}, "batch": {"Pod/p=InProgress"}}},
			{pod("ns", "p", map[string]string{"job": "c"}, false), map[string][]string{"batch": nil}},
		} {
			src.put(t, step.pod)
			if got := generated(); !maps.EqualFunc(got, step.want, slices.Equal) {
				t.Fatalf("after %s %v: generated %q, want %q", step.pod.GetName(), step.pod.GetLabels(), got, step.want)
			}
		}
	})
}

// TestReleasedTargetLeavesTheIndex: a Deployment nobody watches any more
// leaves the index of the Pods' feed it shared with another, and its Pods'
// changes compute nothing.
func TestReleasedTargetLeavesTheIndex(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newFakeSource()
		src.serve(deploymentGK, "deployments")
		src.serve(replicaSetGK, "replicasets")
		src.serve(podGK, "pods")
		var webLabels map[string]string
		for _, name := range []string{"web", "api"} {
			d, rs, labels := deployment("ns", name)
			src.put(t, d)
			src.put(t, rs)
			src.put(t, pod("ns", name+"-1", labels, true))
			if name == "web" {
				webLabels = labels
			}
		}
		e := start(t, src)
		w1 := watch(t, e, watcher.RESTScopeNamespace, id(deploymentGK, "ns", "web"))
		grant(t, w1, poll(t, w1))
		w2 := watch(t, e, watcher.RESTScopeNamespace, id(deploymentGK, "ns", "api"))
		grant(t, w2, poll(t, w2))
		web := e.targets[id(deploymentGK, "ns", "web")]
		pods, rss := e.feeds[feedKey{podGK, "ns"}], e.feeds[feedKey{replicaSetGK, "ns"}]
		if !indexed(pods, web) || !indexed(rss, web) {
			t.Fatal("web is not in the index while watched")
		}

		w1.Close()
		synctest.Wait()
		if e.feeds[feedKey{podGK, "ns"}] != pods {
			t.Fatal("the Pods' feed was released while api needs it")
		}
		if indexed(pods, web) || indexed(rss, web) {
			t.Fatal("web is still in the index after its last Watch closed")
		}
		before := testutil.ToFloat64(e.metrics.computations)
		src.put(t, pod("ns", "web-1", webLabels, false))
		synctest.Wait()
		if n := testutil.ToFloat64(e.metrics.computations) - before; n != 0 {
			t.Fatalf("%v computations for a Pod of a Deployment nobody watches", n)
		}
	})
}

// TestResetForgetsObjectsMissedMeanwhile: after a Reset, the lists come
// from the snapshot that follows only: a Pod deleted while the
// subscription's position was lost is no longer generated.
func TestResetForgetsObjectsMissedMeanwhile(t *testing.T) {
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
		e := start(t, src)
		w := watch(t, e, watcher.RESTScopeNamespace, id(deploymentGK, "ns", "web"))
		grant(t, w, poll(t, w))
		b := poll(t, w)
		if got := summary(b.Statuses[0].GeneratedResources[0].GeneratedResources); len(got) != 2 {
			t.Fatalf("Pods %q, want web-1 and web-2", got)
		}

		src.resetWithout(podGK, "ns", "web-2")
		synctest.Wait()
		b = poll(t, w)
		expectStatuses(t, b, "Deployment/web=Current")
		if got := summary(b.Statuses[0].GeneratedResources[0].GeneratedResources); !slices.Equal(got, []string{"Pod/web-1=Current"}) {
			t.Fatalf("after the Reset: Pods %q, want only web-1", got)
		}
	})
}
