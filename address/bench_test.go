package address

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/informerd/informerd/cache"
)

const (
	benchPods      = 10000
	benchServers   = 100 // each selects the pods of one app
	benchAffected  = 100 // pods of the "hot" group, all of them watched
	benchNamespace = "ns"
)

// benchIP is pod i's IP.
func benchIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}) }

// benchSetup runs a Tracker over benchPods pods and benchServers + 1
// servers with subs watched addresses (pods 0 to subs-1 on port 8080), each
// read once. The first benchAffected pods are in group "hot", selected by
// server "hot".
func benchSetup(b *testing.B, subs int) (*instance, []*Watch) {
	b.Helper()
	c := newFakeCluster(servers.Resource)
	tr, err := New(Options{Subscribe: c.subscribe, Related: []RelatedKind{servers}})
	if err != nil {
		b.Fatal(err)
	}
	ws := make([]*Watch, subs)
	for i := range ws {
		ws[i] = tr.Watch(Request{Address: netip.AddrPortFrom(benchIP(i), 8080), LabelKeys: []string{"app"}})
	}
	b.Cleanup(func() {
		for _, w := range ws {
			w.Close()
		}
	})
	s1, s2 := c.next(b), c.next(b)
	pods, srvs := s1, s2
	if s1.req.GVR != podsGVR {
		pods, srvs = s2, s1
	}
	var evs []*cache.Event
	for i := range benchPods {
		evs = append(evs, added(benchPodObject(b, i, false)))
	}
	pods.ev.feed(b, append(evs, synced())...)
	evs = nil // the reader still reads the pods
	for k := range benchServers {
		evs = append(evs, added(serverObject(b, benchNamespace, fmt.Sprintf("s%d", k), map[string]string{"app": fmt.Sprintf("app-%d", k)}, "http", "HTTP/1")))
	}
	evs = append(evs, added(serverObject(b, benchNamespace, "hot", map[string]string{"group": "hot"}, 8080, "opaque")))
	srvs.ev.feed(b, append(evs, synced())...)
	for _, w := range ws {
		if a := next(b, w); a.Pod == nil || len(a.Related) != 1+btoi(w.e.addr.Addr().As4()[3] < benchAffected && w.e.addr.Addr().As4()[2] == 0) {
			b.Fatalf("%s: %s", w.e.addr, describe(a))
		}
	}
	return ws[0].inst, ws
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// benchPodObject is pod i as a Deployment makes it, Running on a node;
// touched changes an annotation only.
func benchPodObject(tb testing.TB, i int, touched bool) *cache.Object {
	tb.Helper()
	app := fmt.Sprintf("app-%d", i%benchServers)
	group := "cold"
	if i < benchAffected {
		group = "hot"
	}
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}}
	controller := true
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: benchNamespace, Name: fmt.Sprintf("pod-%05d", i), UID: types.UID(fmt.Sprint("uid-", i)),
			Labels:          map[string]string{"app": app, "group": group, "pod-template-hash": "7d9f8c6b5"},
			Annotations:     map[string]string{"prometheus.io/scrape": "true", "touched": fmt.Sprint(touched)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-7d9f8c6b5", Controller: &controller}},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-1", ServiceAccountName: app,
			Containers: []corev1.Container{
				{Name: "app", Image: "registry.example.com/" + app + ":v1", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: "TCP"}, {Name: "metrics", ContainerPort: 9090, Protocol: "TCP"}},
					Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "REGION", Value: "eu"}}, Resources: res, ReadinessProbe: probe, LivenessProbe: probe},
				{Name: "proxy", Image: "registry.example.com/proxy:v2", Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 4143, Protocol: "TCP"}}, Resources: res},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "192.168.0.1", HostIPs: []corev1.HostIP{{IP: "192.168.0.1"}},
			PodIP: benchIP(i).String(), PodIPs: []corev1.PodIP{{IP: benchIP(i).String()}},
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "registry.example.com/" + app + ":v1"}, {Name: "proxy", Ready: true}},
		},
	}
	data, err := json.Marshal(p)
	if err != nil {
		tb.Fatal(err)
	}
	return &cache.Object{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Data: data}
}

// BenchmarkRelatedUpdate: with 10,000 pods and 1,000 watched addresses,
// one update of a related object that selects 100 of them (a projected
// field flips): the time and allocations to recompute the answers and
// notify, and the answers the watchers then read (msgs/op, exactly the 100
// affected: the others are checked to have nothing, outside the timing).
func BenchmarkRelatedUpdate(b *testing.B) {
	inst, ws := benchSetup(b, 1000)
	key := objKey{benchNamespace, "hot"}
	versions := [2]*relObj{
		decodedServer(b, benchNamespace, "hot", map[string]string{"group": "hot"}, 8080, "HTTP/2"),
		decodedServer(b, benchNamespace, "hot", map[string]string{"group": "hot"}, 8080, "opaque"),
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Next must not wait: an affected watcher has an answer ready
	msgs := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		inst.apply(update{kind: 0, related: []change[*relObj]{{key: key, obj: versions[i%2]}}})
		for _, w := range ws[:benchAffected] {
			a, err := w.Next(ctx)
			if err != nil || a.Related[0].Fields["spec.proxyProtocol"] != versions[i%2].fields["spec.proxyProtocol"] {
				b.Fatalf("watcher %s: %v", w.e.addr, err)
			}
			msgs++
		}
		b.StopTimer()
		for _, w := range ws[benchAffected:] {
			if pending(w) {
				b.Fatalf("watcher %s of an unaffected address has an answer", w.e.addr)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
}

// BenchmarkPodEventNoSubscriber: an update of a pod nobody watches (an
// annotation, decoded beforehand) with 10 and with 1,000 watched
// addresses: allocations must not grow with the watchers (target zero).
func BenchmarkPodEventNoSubscriber(b *testing.B) {
	for _, subs := range []int{10, 1000} {
		b.Run(fmt.Sprintf("watchers=%d", subs), func(b *testing.B) {
			inst, ws := benchSetup(b, subs)
			const unwatched = 5000
			key := objKey{benchNamespace, fmt.Sprintf("pod-%05d", unwatched)}
			var versions [2]*Pod
			for v := range versions {
				p, err := decodePod(benchPodObject(b, unwatched, v == 1))
				if err != nil {
					b.Fatal(err)
				}
				versions[v] = p
			}
			batch := [2][]change[*Pod]{{{key: key, obj: versions[0]}}, {{key: key, obj: versions[1]}}}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				inst.apply(update{kind: podKind, pods: batch[i%2]})
			}
			b.StopTimer()
			for _, w := range ws {
				if pending(w) {
					b.Fatalf("watcher %s has an answer", w.e.addr)
				}
			}
		})
	}
}

// BenchmarkDecodePod: what the pod reader pays per event to read a pod
// from the cache's JSON, whoever watches.
func BenchmarkDecodePod(b *testing.B) {
	o := benchPodObject(b, 42, false)
	b.SetBytes(int64(len(o.Data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodePod(o); err != nil {
			b.Fatal(err)
		}
	}
}
