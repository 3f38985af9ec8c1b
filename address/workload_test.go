package address

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/informerd/informerd/cache"
)

var (
	rsGVR  = ownerResources[0]
	jobGVR = ownerResources[1]
)

// ref is a controller reference.
func ref(apiVersion, kind, name, uid string) *metav1.OwnerReference {
	yes := true
	return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: &yes}
}

// ownerObject encodes a ReplicaSet or Job as the cache holds it; owner is
// its controller, if any.
func ownerObject(t testing.TB, kind, ns, name, uid string, owner *metav1.OwnerReference) *cache.Object {
	t.Helper()
	meta := metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}
	if owner != nil {
		meta.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	b, err := json.Marshal(map[string]any{"kind": kind, "metadata": meta, "spec": map[string]any{"replicas": 3}})
	if err != nil {
		t.Fatal(err)
	}
	return &cache.Object{Namespace: ns, Name: name, Data: b}
}

// TestWorkload: the workload is the controller's controller through a
// ReplicaSet or a Job of the pod's namespace with the UID the pod names,
// else the controller itself.
func TestWorkload(t *testing.T) {
	deploy := ref("apps/v1", "Deployment", "web", "d-uid")
	tests := []struct {
		name   string
		owner  *metav1.OwnerReference
		owners map[int][]*cache.Object // by slot
		want   string
	}{
		{"deployment through its ReplicaSet", ref("apps/v1", "ReplicaSet", "web-7c9", "rs-uid"),
			map[int][]*cache.Object{0: {ownerObject(t, "ReplicaSet", "ns", "web-7c9", "rs-uid", deploy)}}, "Deployment/web"},
		{"cronjob through its Job", ref("batch/v1", "Job", "nightly-123", "job-uid"),
			map[int][]*cache.Object{1: {ownerObject(t, "Job", "ns", "nightly-123", "job-uid", ref("batch/v1", "CronJob", "nightly", "cj-uid"))}}, "CronJob/nightly"},
		{"a Job no one controls", ref("batch/v1", "Job", "once", "job-uid"),
			map[int][]*cache.Object{1: {ownerObject(t, "Job", "ns", "once", "job-uid", nil)}}, "Job/once"},
		{"statefulset: the controller", ref("apps/v1", "StatefulSet", "db", "ss-uid"), nil, "StatefulSet/db"},
		{"daemonset: the controller", ref("apps/v1", "DaemonSet", "agent", "ds-uid"), nil, "DaemonSet/agent"},
		{"ReplicaSet not read (yet): the ReplicaSet", ref("apps/v1", "ReplicaSet", "web-7c9", "rs-uid"), nil, "ReplicaSet/web-7c9"},
		{"another ReplicaSet of that name: the pod's", ref("apps/v1", "ReplicaSet", "web-7c9", "rs-uid"),
			map[int][]*cache.Object{0: {ownerObject(t, "ReplicaSet", "ns", "web-7c9", "other-uid", deploy)}}, "ReplicaSet/web-7c9"},
		{"a ReplicaSet of another namespace is not the pod's", ref("apps/v1", "ReplicaSet", "web-7c9", "rs-uid"),
			map[int][]*cache.Object{0: {ownerObject(t, "ReplicaSet", "other", "web-7c9", "rs-uid", deploy)}}, "ReplicaSet/web-7c9"},
		{"a ReplicaSet of another group is not one", ref("example.com/v1", "ReplicaSet", "web-7c9", "rs-uid"),
			map[int][]*cache.Object{0: {ownerObject(t, "ReplicaSet", "ns", "web-7c9", "rs-uid", deploy)}}, "ReplicaSet/web-7c9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := syncedIndex()
			x.workloads = true
			for slot, objs := range tt.owners {
				for _, o := range objs {
					r, err := decodeOwner(o)
					if err != nil {
						t.Fatal(err)
					}
					x.setOwner(slot, keyOf(o), r)
				}
			}
			x.setPod(objKey{"ns", "a"}, decoded(t, podOpts{name: "a", ip: "10.0.0.1", owner: tt.owner}))
			w := x.resolve(ap("10.0.0.1:80")).Workload
			if got := fmt.Sprintf("%s/%s", w.Kind, w.Name); w == nil || got != tt.want {
				t.Fatalf("workload %+v, want %s", w, tt.want)
			}
		})
	}
	x := syncedIndex()
	x.workloads = true
	x.setPod(objKey{"ns", "a"}, decoded(t, podOpts{name: "a", ip: "10.0.0.1", owner: &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "not-a-controller"}}))
	if w := x.resolve(ap("10.0.0.1:80")).Workload; w != nil {
		t.Fatalf("a pod without a controller has workload %+v", w)
	}
}

// TestWatchWorkload: only a watch that asks reads ReplicaSets and Jobs
// (the first starts them, the last stops them) and waits for them before
// its first answer; the workload follows the owner chain as it changes (a
// ReplicaSet created after the pod, adopted, orphaned); a watch that did
// not ask sees none of it; ReplicaSets that cannot be read are named
// Unavailable and the workload is unknown.
func TestWatchWorkload(t *testing.T) {
	tr, c, _ := newTestTracker(t, false)
	c.served[rsGVR], c.served[jobGVR] = true, true
	plain := tr.Watch(Request{Address: ap("10.0.0.1:80")})
	defer plain.Close()
	pods := c.next(t)
	pods.ev.feed(t, added(podObject(t, podOpts{name: "web-1", ip: "10.0.0.1", owner: ref("apps/v1", "ReplicaSet", "web-7c9", "rs-uid")})), synced())
	const pod = "ns/web-1 uid=web-1-uid Running ready=true match=1 claimants=1"
	if got := describe(next(t, plain)); got != pod {
		t.Fatalf("plain watch: %s", got)
	}
	select {
	case s := <-c.subs:
		t.Fatalf("a watch that did not ask for workloads subscribed to %s", s.req.GVR)
	default:
	}

	w := tr.Watch(Request{Address: ap("10.0.0.1:80"), Workload: true})
	subs := c.nextOf(t, rsGVR, jobGVR)
	rs, jobs := subs[rsGVR], subs[jobGVR]
	rs.ev.feed(t, synced()) // the ReplicaSet is not there yet
	if pending(w) {
		t.Fatal("an answer before the Jobs were read")
	}
	jobs.ev.feed(t, synced())
	if got := describe(next(t, w)); got != pod+" workload=ReplicaSet/web-7c9" {
		t.Fatalf("before the ReplicaSet exists: %s", got)
	}
	step := func(what, want string, evs ...*cache.Event) {
		t.Helper()
		rs.ev.feed(t, evs...)
		if got := describe(next(t, w)); got != want {
			t.Fatalf("%s: %s, want %s", what, got, want)
		}
	}
	// The ReplicaSet is created, an orphan, and updated: the workload is
	// still the ReplicaSet, so the next answer is the adoption's.
	rs.ev.feed(t, added(ownerObject(t, "ReplicaSet", "ns", "web-7c9", "rs-uid", nil)))
	rs.ev.feed(t, modified(ownerObject(t, "ReplicaSet", "ns", "web-7c9", "rs-uid", nil)))
	step("ReplicaSet adopted", pod+" workload=Deployment/web",
		modified(ownerObject(t, "ReplicaSet", "ns", "web-7c9", "rs-uid", ref("apps/v1", "Deployment", "web", "d-uid"))))
	step("adopted by another", pod+" workload=Deployment/web2",
		modified(ownerObject(t, "ReplicaSet", "ns", "web-7c9", "rs-uid", ref("apps/v1", "Deployment", "web2", "d2-uid"))))
	step("ReplicaSet deleted", pod+" workload=ReplicaSet/web-7c9", deleted(ownerObject(t, "ReplicaSet", "ns", "web-7c9", "rs-uid", nil)))
	if pending(plain) {
		t.Fatalf("the plain watch has an answer: %s", describe(plain.e.state.Load().answer))
	}

	// ReplicaSets cannot be read any more: the workload is unknown, and
	// answers say why.
	c.setFail(rsGVR, fmt.Errorf("%w: replicasets.apps is forbidden", cache.ErrNotSynced))
	rs.ev.end <- fmt.Errorf("%w: gone", cache.ErrStopped)
	a := next(t, w)
	if got := describe(a); got != pod+" unavailable=replicasets" {
		t.Fatalf("ReplicaSets unavailable: %s", got)
	}
	if pending(plain) {
		t.Fatalf("the plain watch has an answer: %s", describe(plain.e.state.Load().answer))
	}

	// The last workload watch closes: ReplicaSets and Jobs are no longer read.
	w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10e9)
	defer cancel()
	select {
	case <-jobs.ev.closed:
	case <-ctx.Done():
		t.Fatal("the Job subscription is still open")
	}
	if pending(plain) {
		t.Fatalf("the plain watch has an answer: %s", describe(plain.e.state.Load().answer))
	}
}
