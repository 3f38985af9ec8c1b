package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/address"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

// The resources an address client reads: pods in all namespaces, and the
// related kind of the daemon it talks to (the Server-like CRD below).
var (
	podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	// serversGVR is a Server-like CRD: spec.podSelector selects pods,
	// spec.port a port by number or name, spec.proxyProtocol is projected.
	serversGVR = schema.GroupVersionResource{Group: "address.informerd.dev", Version: "v1", Resource: "servers"}
)

// readsPods is what a proxy needs to ask who is behind an address: pods in
// every namespace.
var readsPods = reads(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "")

// withServers configures the daemon with the Server-like related kind.
func withServers(o *security) {
	o.AddressRelated = []address.RelatedKind{{
		Resource: serversGVR, SelectorPath: "spec.podSelector", PortPath: "spec.port", Fields: []string{"spec.proxyProtocol"},
	}}
}

// addressStream records every message of one raw WatchAddress stream, so
// that tests see exactly what the daemon sent (no client-side dedupe).
type addressStream struct {
	answers chan *informerdv1.WatchAddressResponse // every message, in order
	done    chan error                             // the stream's end
}

// watchAddress opens a raw stream of addr, ended when the test ends.
func watchAddress(t *testing.T, c *client.Client, addr string, labelKeys ...string) *addressStream {
	t.Helper()
	ap := netip.MustParseAddrPort(addr)
	return openAddress(t, c, &informerdv1.WatchAddressRequest{Ip: ap.Addr().String(), Port: uint32(ap.Port()), LabelKeys: labelKeys})
}

// openAddress opens a raw stream of req, ended when the test ends.
func openAddress(t *testing.T, c *client.Client, req *informerdv1.WatchAddressRequest) *addressStream {
	t.Helper()
	req.ClientName = t.Name()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.API().WatchAddress(ctx, req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	as := &addressStream{answers: make(chan *informerdv1.WatchAddressResponse, 1000), done: make(chan error, 1)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			a, err := s.Recv()
			if err != nil {
				as.done <- err
				return
			}
			as.answers <- a
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return as
}

// expect reads the next message and checks its summary.
func (s *addressStream) expect(ctx context.Context, t *testing.T, want string) *informerdv1.WatchAddressResponse {
	t.Helper()
	var a *informerdv1.WatchAddressResponse
	select {
	case a = <-s.answers:
	case err := <-s.done:
		// An answer queued before the end is still the next one.
		select {
		case a = <-s.answers:
			s.done <- err // for the next reader
		default:
			t.Fatalf("stream ended with %v, want %s", err, want)
		}
	case <-ctx.Done():
		t.Fatalf("no answer, want %s", want)
	}
	if got := summary(a); got != want {
		t.Fatalf("next answer:\n got %s\nwant %s", got, want)
	}
	return a
}

// summary is an answer in one line, without the pod's UID (see uidOf).
func summary(a *informerdv1.WatchAddressResponse) string {
	p := a.GetPod()
	if p == nil {
		return "none" + unavailableSummary(a)
	}
	s := fmt.Sprintf("%s %s ready=%v %s", p.GetName(), p.GetPhase(), p.GetReady(), strings.ToLower(strings.TrimPrefix(a.GetMatch().String(), "ADDRESS_MATCH_")))
	if pt := a.GetPort(); pt != nil {
		s += fmt.Sprintf(" port=%s/%d/%d", pt.GetName(), pt.GetContainerPort(), pt.GetHostPort())
	}
	for _, k := range slices.Sorted(maps.Keys(p.GetLabels())) {
		s += " " + k + "=" + p.GetLabels()[k]
	}
	for _, r := range a.GetRelated() {
		s += " related=" + r.GetName() + r.GetFields()["spec.proxyProtocol"]
	}
	if w := p.GetWorkload(); w != nil {
		s += " workload=" + w.GetKind() + "/" + w.GetName()
	}
	return s + unavailableSummary(a)
}

// unavailableSummary names an answer's unavailable kinds.
func unavailableSummary(a *informerdv1.WatchAddressResponse) string {
	s := ""
	for _, u := range a.GetUnavailable() {
		s += " unavailable=" + u.GetResource().GetResource()
	}
	return s
}

// podSpec is a pod for the fake node; ports are named by number.
type podSpec struct {
	name        string
	labels      map[string]string
	ports       []corev1.ContainerPort
	hostNetwork bool
}

// createPod creates a pod, which the scheduler places on the kwok node, and
// waits until it is Running with its IPs; it returns the pod. When the test
// ends the pod is deleted, and waited for: the host ports it holds are free
// for the next test, whatever the namespace's deletion is still doing.
func createPod(ctx context.Context, t *testing.T, ns string, spec podSpec) *corev1.Pod {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: spec.name, Labels: spec.labels},
		Spec: corev1.PodSpec{
			HostNetwork: spec.hostNetwork,
			Containers:  []corev1.Container{{Name: "app", Image: "registry.invalid/none:1", Ports: spec.ports}},
		},
	}
	created, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pods := admin.CoreV1().Pods(ns)
		err := pods.Delete(ctx, spec.name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(created.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			t.Errorf("deleting pod %s: %v", spec.name, err)
			return
		}
		err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			p, err := pods.Get(ctx, spec.name, metav1.GetOptions{})
			return apierrors.IsNotFound(err) || err == nil && p.UID != created.UID, nil
		})
		if err != nil {
			t.Errorf("pod %s never went away: %v", spec.name, err)
		}
	})
	var got *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = admin.CoreV1().Pods(ns).Get(ctx, spec.name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning && got.Status.PodIP != "" && got.Status.HostIP != "", err
	})
	if err != nil {
		t.Fatalf("pod %s never Running with its IPs: %v", spec.name, err)
	}
	if got.Spec.NodeName != controlplane.FakeNodeName {
		t.Fatalf("pod %s on node %q, want %s", spec.name, got.Spec.NodeName, controlplane.FakeNodeName)
	}
	return got
}

// setReady sets a Running pod's Ready condition. kwok makes a pod Ready
// only in its pod-ready stage, which selects Pending pods: once a pod is
// Running, kwok leaves its conditions alone, so a status patch is how a
// test flips readiness (a kubelet would, after a readiness probe).
func setReady(ctx context.Context, t *testing.T, ns, name string, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":%q}]}}`, st)
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if _, err := admin.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

// annotate sets an annotation on a pod.
func annotate(ctx context.Context, t *testing.T, ns, name, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value)
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if _, err := admin.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// nodeIP is the fake node's InternalIP: the host IP of its pods.
func nodeIP(ctx context.Context, t *testing.T) string {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	n, err := admin.CoreV1().Nodes().Get(ctx, controlplane.FakeNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	t.Fatalf("node %s has no InternalIP", controlplane.FakeNodeName)
	return ""
}

// podNamespace creates a namespace where pods can be created.
func podNamespace(ctx context.Context, t *testing.T, prefix string) string {
	t.Helper()
	ns := createNamespace(ctx, t, prefix)
	if err := controlplane.WaitForDefaultServiceAccount(ctx, kubernetes.NewForConfigOrDie(env.RESTConfig()), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestAddressHostPortReplaced: a pod behind a hostPort is deleted and
// created again: the stream shows the pod, then no pod, then the new pod
// with its new identity, and nothing more (the readiness flip that follows
// is the next message).
func TestAddressHostPortReplaced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := podNamespace(ctx, t, "hostport")
	d := startDaemon(t, cache.Options{})
	spec := podSpec{name: "web", ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, HostPort: 31080}}}
	s := watchAddress(t, d.dial(t, readsPods), netip.AddrPortFrom(netip.MustParseAddr(nodeIP(ctx, t)), 31080).String())
	s.expect(ctx, t, "none")

	first := createPod(ctx, t, ns, spec)
	a := s.expect(ctx, t, "web Running ready=true host_port port=http/8080/31080")
	if a.GetPod().GetUid() != string(first.UID) || a.GetPod().GetNamespace() != ns || a.GetPod().GetServiceAccount() != "default" {
		t.Fatalf("answer %v, want pod %s/web uid %s", a.GetPod(), ns, first.UID)
	}

	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if err := admin.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.expect(ctx, t, "none") // terminating: no answer
	eventually(ctx, t, "pod web gone", func() bool {
		_, err := admin.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	second := createPod(ctx, t, ns, spec)
	a = s.expect(ctx, t, "web Running ready=true host_port port=http/8080/31080")
	if a.GetPod().GetUid() != string(second.UID) || second.UID == first.UID {
		t.Fatalf("answer uid %s, want the new pod's %s (the old one was %s)", a.GetPod().GetUid(), second.UID, first.UID)
	}
	setReady(ctx, t, ns, "web", false)
	s.expect(ctx, t, "web Running ready=false host_port port=http/8080/31080")
}

// TestAddressReadinessFlips: each readiness flip sends exactly one message.
func TestAddressReadinessFlips(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := podNamespace(ctx, t, "ready")
	d := startDaemon(t, cache.Options{})
	pod := createPod(ctx, t, ns, podSpec{name: "web", labels: map[string]string{"app": "web", "v": "1"}, ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}})
	s := watchAddress(t, d.dial(t, readsPods), pod.Status.PodIP+":8080", "app")
	s.expect(ctx, t, "web Running ready=true pod_ip port=http/8080/0 app=web")
	for i, ready := range []bool{false, true, false, true} {
		setReady(ctx, t, ns, "web", ready)
		s.expect(ctx, t, fmt.Sprintf("web Running ready=%v pod_ip port=http/8080/0 app=web", ready))
		// The same status again changes nothing: the next message is the
		// next flip's, or the label change below.
		setReady(ctx, t, ns, "web", ready)
		t.Logf("flip %d seen once", i+1)
	}
	// A label the stream does not carry: nothing. The one it carries: a message.
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if _, err := admin.CoreV1().Pods(ns).Patch(ctx, "web", types.MergePatchType, []byte(`{"metadata":{"labels":{"v":"2"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Pods(ns).Patch(ctx, "web", types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"web2"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s.expect(ctx, t, "web Running ready=true pod_ip port=http/8080/0 app=web2")
}

// TestAddressRelatedObjects: a Server-like object that selects the pod's
// port appears in the answer with its projected field; its selector
// changed to stop matching, it disappears; deleted, the answer stays
// correct; 100 unrelated pod updates send nothing.
func TestAddressRelatedObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	createCRD(ctx, t, dyn, serversGVR, "Server")
	ns := podNamespace(ctx, t, "related")
	d := startDaemon(t, cache.Options{}, withServers)
	http := []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	web := createPod(ctx, t, ns, podSpec{name: "web", labels: map[string]string{"app": "web"}, ports: http})
	createPod(ctx, t, ns, podSpec{name: "other", labels: map[string]string{"app": "other"}, ports: http})
	s := watchAddress(t, d.dial(t, readsPods, reads(serversGVR, "")), web.Status.PodIP+":8080")
	const base = "web Running ready=true pod_ip port=http/8080/0"
	s.expect(ctx, t, base)

	servers := dyn.Resource(serversGVR).Namespace(ns)
	server := func(name string, selector map[string]any, port any, protocol string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "address.informerd.dev/v1", "kind": "Server",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"podSelector": map[string]any{"matchLabels": selector}, "port": port, "proxyProtocol": protocol},
		}}
	}
	s1, err := servers.Create(ctx, server("s1", map[string]any{"app": "web"}, "http", "opaque"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := s.expect(ctx, t, base+` related=s1"opaque"`)
	if r := a.GetRelated()[0]; r.GetNamespace() != ns || r.GetResource().GetGroup() != serversGVR.Group || r.GetResource().GetResource() != "servers" {
		t.Fatalf("related object %v", r)
	}
	if _, err := servers.Create(ctx, server("s2", map[string]any{"app": "web"}, int64(8080), "HTTP/2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.expect(ctx, t, base+` related=s1"opaque" related=s2"HTTP/2"`)
	// A server of another port and one of another pod: nothing.
	if _, err := servers.Create(ctx, server("s3", map[string]any{"app": "web"}, int64(9090), "opaque"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := servers.Create(ctx, server("s4", map[string]any{"app": "other"}, "http", "opaque"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// s1's selector stops matching: it leaves the answer.
	if err := unstructured.SetNestedField(s1.Object, map[string]any{"app": "nobody"}, "spec", "podSelector", "matchLabels"); err != nil {
		t.Fatal(err)
	}
	if _, err := servers.Update(ctx, s1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.expect(ctx, t, base+` related=s2"HTTP/2"`)
	// Deleting s1, which no longer selects the pod, changes nothing; then
	// deleting s2 does.
	for _, name := range []string{"s1", "s2"} {
		if err := servers.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.expect(ctx, t, base)

	// 100 unrelated pod updates: annotations of the watched pod, and the
	// other pod's annotations and labels.
	for i := range 50 {
		annotate(ctx, t, ns, "web", "touched", fmt.Sprint(i))
		annotate(ctx, t, ns, "other", "touched", fmt.Sprint(i))
	}
	// Wait until the daemon's pod informer has delivered them all, so that
	// a message they caused would be sent before the marker below.
	last, err := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().Pods(ns).Get(ctx, "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the address tracker read the 100 updates", func() bool {
		for _, src := range d.mgr.Sources() {
			if src.Key.GVR == podsGVR && src.Key.Namespace == "" {
				return rvAtLeast(src.ResourceVersion, last.ResourceVersion) && src.MaxLagEvents == 0
			}
		}
		return false
	})
	setReady(ctx, t, ns, "web", false)
	s.expect(ctx, t, "web Running ready=false pod_ip port=http/8080/0")
	select {
	case a := <-s.answers:
		t.Fatalf("an answer after the marker: %s", summary(a))
	default:
	}
}

// TestAddressNobodyThenPod: an address nobody is behind answers "no pod"
// and turns into the pod when one appears (here a host-network pod, found
// on its declared port of the node's IP); informerctl prints the answer.
func TestAddressNobodyThenPod(t *testing.T) {
	informerctl := informerctlBin.build(t) // before the deadline starts
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := podNamespace(ctx, t, "nobody")
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, readsPods)
	addr := netip.AddrPortFrom(netip.MustParseAddr(nodeIP(ctx, t)), 31090).String()
	s := watchAddress(t, c, addr)
	s.expect(ctx, t, "none")
	createPod(ctx, t, ns, podSpec{name: "agent", hostNetwork: true, labels: map[string]string{"app": "agent"},
		ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 31090}}})
	s.expect(ctx, t, "agent Running ready=true host_port port=metrics/31090/31090")

	out, err := exec.CommandContext(ctx, informerctl, "-address", d.socket, "-token-file", tokenFile(t, readsPods), "address", addr, "-labels", "app").CombinedOutput()
	if err != nil {
		t.Fatalf("informerctl address: %v\n%s", err, out)
	}
	if line := strings.TrimSpace(string(out)); !strings.HasPrefix(line, "pod "+ns+"/agent ") || !strings.Contains(line, "match=host_port") ||
		!strings.Contains(line, "label:app=agent") || strings.Count(line, "\n") != 0 {
		t.Fatalf("informerctl address printed %q", out)
	}

	// A bad request is refused with a message naming the field; the
	// stream above is unaffected.
	bad, err := c.API().WatchAddress(ctx, &informerdv1.WatchAddressRequest{Ip: "web.default.svc", Port: 80})
	if err == nil {
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "ip") {
		t.Fatalf("bad address: %v, want InvalidArgument naming ip", err)
	}
	setReady(ctx, t, ns, "agent", false)
	s.expect(ctx, t, "agent Running ready=false host_port port=metrics/31090/31090")
}

// TestAddressWatcherReconnects: the client's AddressWatcher survives a
// daemon restart, and its handler sees an answer only if it differs from
// the last one it saw.
func TestAddressWatcherReconnects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := podNamespace(ctx, t, "reconnect")
	pod := createPod(ctx, t, ns, podSpec{name: "web", ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}})
	socket := t.TempDir() + "/informerd.sock"
	d := startDaemonAt(t, socket, cache.Options{})

	var mu sync.Mutex // guards seen
	var seen []string
	changed := make(chan struct{}, 10)
	reconnects := make(chan error, 100)
	w := client.NewAddressWatcher(d.dial(t, readsPods), client.AddressOptions{Address: netip.MustParseAddrPort(pod.Status.PodIP + ":8080"), ClientName: "proxy"},
		func(a *informerdv1.WatchAddressResponse) {
			mu.Lock()
			seen = append(seen, summary(a))
			mu.Unlock()
			changed <- struct{}{}
		}, client.AddressWatcherOptions{
			Backoff: client.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
			OnError: func(err error) { reconnects <- err },
		})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	waitFor := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("%s: never happened", what)
		}
	}
	waitFor("first answer", changed)

	d.stop()
	select {
	case err := <-reconnects:
		t.Logf("reconnecting after: %v", err)
	case <-ctx.Done():
		t.Fatal("the watcher never saw the daemon go")
	}
	d2 := startDaemonAt(t, socket, cache.Options{})
	eventually(ctx, t, "the watcher is back on the new daemon", func() bool {
		for _, src := range d2.mgr.Sources() {
			if src.Key.GVR == podsGVR && src.RefCount > 0 {
				return true
			}
		}
		return false
	})
	// Whether or not the new stream's first answer (the same as before)
	// has arrived yet, the handler sees the flip once and nothing else.
	setReady(ctx, t, ns, "web", false)
	waitFor("the flip", changed)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"web Running ready=true pod_ip port=http/8080/0", "web Running ready=false pod_ip port=http/8080/0"}
	if !slices.Equal(seen, want) {
		t.Fatalf("handler saw %q, want %q", seen, want)
	}
}

// rvAtLeast compares resourceVersions as the numbers the API server makes.
func rvAtLeast(rv, want string) bool {
	var a, b uint64
	_, errA := fmt.Sscan(rv, &a)
	_, errB := fmt.Sscan(want, &b)
	return errA == nil && errB == nil && a >= b
}

// TestAddressRelatedKindUnavailable: the daemon may not read the related
// kind. Every stream is still answered, without its objects, naming it
// unavailable with the API server's refusal (each stream used to fail
// with UNAVAILABLE, and every reconnect the same way); once the daemon may
// read it, answers gain its objects. A caller that may not read the kind
// is answered too, never with its objects: its answers name it
// unavailable with the caller's missing permission. No stream asked for
// workloads: the daemon reads no ReplicaSets or Jobs.
func TestAddressRelatedKindUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	createCRD(ctx, t, dyn, serversGVR, "Server")
	ns := podNamespace(ctx, t, "unreadable")
	http := []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	web := createPod(ctx, t, ns, podSpec{name: "web", labels: map[string]string{"app": "web"}, ports: http})
	other := createPod(ctx, t, ns, podSpec{name: "other", labels: map[string]string{"app": "other"}, ports: http})
	if _, err := dyn.Resource(serversGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "address.informerd.dev/v1", "kind": "Server",
		"metadata": map[string]any{"name": "s1", "namespace": ns},
		"spec":     map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": "web"}}, "port": "http", "proxyProtocol": "opaque"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The daemon's own identity may read pods, not servers.
	daemonNS, daemonSA := newServiceAccount(t)
	grant(t, daemonNS, daemonSA, readsPods)
	token, err := controlplane.ServiceAccountToken(ctx, kubernetes.NewForConfigOrDie(env.RESTConfig()), daemonNS, daemonSA)
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cache.Options{Config: env.TokenConfig(token)}, withServers)

	const webBase, otherBase = "web Running ready=true pod_ip port=http/8080/0", "other Running ready=true pod_ip port=http/8080/0"
	full := watchAddress(t, d.dial(t, readsPods, reads(serversGVR, "")), web.Status.PodIP+":8080")
	a := full.expect(ctx, t, webBase+" unavailable=servers")
	if u := a.GetUnavailable()[0]; u.GetResource().GetGroup() != serversGVR.Group || !strings.Contains(u.GetReason(), "forbidden") {
		t.Fatalf("unavailable %v, want servers with the API server's refusal", u)
	}
	bystander := watchAddress(t, d.dial(t, readsPods, reads(serversGVR, "")), other.Status.PodIP+":8080")
	bystander.expect(ctx, t, otherBase+" unavailable=servers")
	podsOnly := watchAddress(t, d.dial(t, readsPods), web.Status.PodIP+":8080")
	a = podsOnly.expect(ctx, t, webBase+" unavailable=servers")
	if reason := a.GetUnavailable()[0].GetReason(); !strings.Contains(reason, "may not") {
		t.Fatalf("the pods-only caller's reason %q, want its missing permission", reason)
	}

	// The daemon may read servers now: the answers that may see them gain them.
	grant(t, daemonNS, daemonSA, readsPods, reads(serversGVR, ""))
	full.expect(ctx, t, webBase+` related=s1"opaque"`)
	bystander.expect(ctx, t, otherBase)
	// The pods-only caller's next answer is the readiness flip, still
	// without the server.
	setReady(ctx, t, ns, "web", false)
	podsOnly.expect(ctx, t, "web Running ready=false pod_ip port=http/8080/0 unavailable=servers")
	full.expect(ctx, t, `web Running ready=false pod_ip port=http/8080/0 related=s1"opaque"`)

	for _, src := range d.mgr.Sources() {
		if src.Key.GVR.Resource == "replicasets" || src.Key.GVR.Resource == "jobs" {
			t.Fatalf("no stream asked for workloads, yet the daemon reads %s", src.Key)
		}
	}
}

// TestAddressWorkload: a stream that asks for the workload gets the pod's
// Deployment, resolved through its ReplicaSet (the controller is still
// reported as owner); a stream that does not ask gets none; a caller that
// may not read ReplicaSets and Jobs everywhere is refused; and the
// workload follows the owner chain: a ReplicaSet's pod reports the
// ReplicaSet until a Deployment adopts it. informerctl prints it.
func TestAddressWorkload(t *testing.T) {
	informerctl := informerctlBin.build(t) // before the deadline starts
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := podNamespace(ctx, t, "workload")
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	template := func(app string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "app", Image: "registry.invalid/none:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}}},
		}
	}
	deployment := func(app string) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: app},
			Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}, Template: template(app)},
		}
	}
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, deployment("web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// An orphan ReplicaSet, which a Deployment adopts below.
	if _, err := admin.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "solo", Labels: map[string]string{"app": "solo"}},
		Spec:       appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "solo"}}, Template: template("solo")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web, solo := podWithIP(ctx, t, ns, "app=web"), podWithIP(ctx, t, ns, "app=solo")

	d := startDaemon(t, cache.Options{})
	replicaSets := reads(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, "")
	jobs := reads(schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, "")
	c := d.dial(t, readsPods, replicaSets, jobs)
	workload := func(pod *corev1.Pod) *addressStream {
		return openAddress(t, c, &informerdv1.WatchAddressRequest{Ip: pod.Status.PodIP, Port: 8080, Workload: true, LabelKeys: []string{"pod-template-hash"}})
	}
	s := workload(web)
	a := s.expect(ctx, t, fmt.Sprintf("%s Running ready=true pod_ip port=/8080/0 pod-template-hash=%s workload=Deployment/web", web.Name, web.Labels["pod-template-hash"]))
	if o := a.GetPod().GetOwner(); o.GetKind() != "ReplicaSet" || o.GetName() != "web-"+web.Labels["pod-template-hash"] {
		t.Fatalf("owner %v, want the ReplicaSet web-%s", o, web.Labels["pod-template-hash"])
	}
	if w := a.GetPod().GetWorkload(); w.GetApiVersion() != "apps/v1" {
		t.Fatalf("workload %v, want apps/v1", w)
	}
	watchAddress(t, c, web.Status.PodIP+":8080").expect(ctx, t, web.Name+" Running ready=true pod_ip port=/8080/0")

	// informerctl address -workload (client.AddressWatcher) prints it.
	out, err := exec.CommandContext(ctx, informerctl, "-address", d.socket, "-token-file", tokenFile(t, readsPods, replicaSets, jobs),
		"address", web.Status.PodIP+":8080", "-workload").CombinedOutput()
	if err != nil {
		t.Fatalf("informerctl address -workload: %v\n%s", err, out)
	}
	if line := string(out); !strings.Contains(line, " owner=ReplicaSet/web-") || !strings.Contains(line, " workload=Deployment/web") {
		t.Fatalf("informerctl address -workload printed %q", out)
	}

	// Without ReplicaSets and Jobs in every namespace: refused, with the
	// permission named. (Pods alone are enough without workloads.)
	refused := openAddress(t, d.dial(t, readsPods, reads(replicaSets.gvr, ns), reads(jobs.gvr, ns)), &informerdv1.WatchAddressRequest{Ip: web.Status.PodIP, Port: 8080, Workload: true})
	select {
	case err := <-refused.done:
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "replicasets") {
			t.Fatalf("caller without replicasets everywhere: %v, want PermissionDenied naming replicasets", err)
		}
	case a := <-refused.answers:
		t.Fatalf("caller without replicasets everywhere got an answer: %s", summary(a))
	case <-ctx.Done():
		t.Fatal("caller without replicasets everywhere: no answer and no error")
	}

	// Adoption: the orphan ReplicaSet's pod reports the ReplicaSet, until
	// a Deployment of the same template adopts it.
	s = workload(solo)
	const soloBase = "Running ready=true pod_ip port=/8080/0"
	s.expect(ctx, t, solo.Name+" "+soloBase+" workload=ReplicaSet/solo")
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, deployment("solo"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.expect(ctx, t, solo.Name+" "+soloBase+" workload=Deployment/solo")
}

// podWithIP waits for a pod matching selector in ns running on the fake
// node with its IP, and returns it.
func podWithIP(ctx context.Context, t *testing.T, ns, selector string) *corev1.Pod {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	var pod *corev1.Pod
	eventually(ctx, t, "a running pod "+selector+" with its IP", func() bool {
		p := runningPod(ctx, t, admin, ns, selector)
		pod = p
		return p.Status.PodIP != ""
	})
	return pod
}
