package wrapconfig

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func TestParseWritePath(t *testing.T) {
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	namespaces := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	deployments := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	tests := []struct {
		name, method, path string
		gvr                schema.GroupVersionResource
		namespace          string
		ok                 bool
	}{
		{"a collection", "PUT", "/api/v1/namespaces/ns/pods", pods, "ns", true},
		{"one object", "PUT", "/api/v1/namespaces/ns/pods/p", pods, "ns", true},
		{"status", "PUT", "/api/v1/namespaces/ns/pods/p/status", pods, "ns", true},
		{"scale", "PUT", "/apis/apps/v1/namespaces/ns/deployments/d/scale", deployments, "ns", true},
		{"a namespace", "PUT", "/api/v1/namespaces/ns", namespaces, "", true},
		{"a namespace's status", "PUT", "/api/v1/namespaces/ns/status", namespaces, "", true},
		{"a namespace's finalize", "PUT", "/api/v1/namespaces/ns/finalize", namespaces, "", true},
		{"cluster-scoped", "PUT", "/api/v1/nodes/n", schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", true},
		{"exec", "PUT", "/api/v1/namespaces/ns/pods/p/exec", pods, "", false},
		{"eviction", "PUT", "/api/v1/namespaces/ns/pods/p/eviction", pods, "", false},
		{"binding", "PUT", "/api/v1/namespaces/ns/pods/p/binding", pods, "", false},
		{"proxy", "PUT", "/api/v1/namespaces/ns/services/s/proxy", pods, "", false},
		{"token", "PUT", "/api/v1/namespaces/ns/serviceaccounts/s/token", pods, "", false},
		{"deeper", "PUT", "/api/v1/namespaces/ns/services/s/proxy/x", pods, "", false},
		{"not the API", "PUT", "/healthz", pods, "", false},
		{"create", "POST", "/api/v1/namespaces/ns/pods", pods, "ns", true},
		{"delete one", "DELETE", "/api/v1/namespaces/ns/pods/p", pods, "ns", true},
		{"delete a collection", "DELETE", "/api/v1/namespaces/ns/pods", pods, "", false},
		{"a group's root", "PUT", "/apis/apps/v1", pods, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gvr, ns, ok := parseWritePath(tt.method, tt.path)
			if ok != tt.ok || (ok && (gvr != tt.gvr || ns != tt.namespace)) {
				t.Errorf("parseWritePath(%q) = %v, %q, %v; want %v, %q, %v", tt.path, gvr, ns, ok, tt.gvr, tt.namespace, tt.ok)
			}
		})
	}
}

func TestWriteMeta(t *testing.T) {
	pod := testPod("p", "42")
	pod.UID = "u-pod"
	st := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusSuccess,
		Details: &metav1.StatusDetails{Name: "c", Kind: "configmaps", UID: types.UID("u-cm")}}
	for _, proto := range []bool{false, true} {
		var podB, stB []byte
		if proto {
			podB = podBytes(t, pod, true)
			var buf bytes.Buffer
			if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(st, &buf); err != nil {
				t.Fatal(err)
			}
			stB = buf.Bytes()
		} else {
			podB = podBytes(t, pod, false)
			stB, _ = json.Marshal(st)
		}
		if m, ok := writeMeta(podB); !ok || m.status || m.resourceVersion != "42" || m.uid != "u-pod" {
			t.Errorf("protobuf %v: writeMeta(pod) = %+v, %v; want resourceVersion 42, uid u-pod", proto, m, ok)
		}
		if m, ok := writeMeta(stB); !ok || !m.status || m.resourceVersion != "" || m.uid != "u-cm" {
			t.Errorf("protobuf %v: writeMeta(status) = %+v, %v; want a Status with uid u-cm", proto, m, ok)
		}
	}
	if _, ok := writeMeta([]byte("not an object")); ok {
		t.Error("writeMeta read garbage")
	}
}

func TestHoldingTellsAnObjectFromAReference(t *testing.T) {
	const uid = "0b3a8e2c-6c55-4b43-9d6f-1c7c6a4f0a11"
	owner := testPod("owner", "1")
	owner.UID = uid
	dependent := testPod("dependent", "2")
	dependent.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "owner", UID: uid}}
	for _, proto := range []bool{false, true} {
		if held := holding([][]byte{podBytes(t, dependent, proto)}, []string{uid}); len(held) != 0 {
			t.Errorf("protobuf %v: a reference to %s counted as the object", proto, uid)
		}
		if held := holding([][]byte{podBytes(t, dependent, proto), podBytes(t, owner, proto)}, []string{uid}); len(held) != 1 {
			t.Errorf("protobuf %v: the object %s not found", proto, uid)
		}
	}
}

// TestWrapReadsItsWrites: a write's resourceVersion raises the floor of
// every informer of its resource in its namespace and cluster-wide, in
// both formats, whatever the label selector (one informer: what it
// served raises its floor too); and nothing else's.
func TestWrapReadsItsWrites(t *testing.T) {
	f := newWrapFixture(t, Options{})
	f.api.mu.Lock()
	f.api.written = []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"77","uid":"u"}}`)
	f.api.mu.Unlock()
	ctx := context.Background()
	f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "80"))
	if _, err := f.clientset(t, "application/json").CoreV1().Pods("ns").Create(ctx, testPod("p", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, namespace, labels, contentType, want string
	}{
		{"same namespace", "ns", "", "application/json", "77"},
		{"with a label selector: the same informer, which served 80", "ns", "app=x", "application/json", "80"},
		{"in protobuf", "ns", "", "application/vnd.kubernetes.protobuf", "77"},
		{"cluster-wide", "", "", "application/json", "77"},
		{"another namespace", "other", "", "application/json", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := f.clientset(t, tt.contentType).CoreV1().Pods(tt.namespace).List(ctx, metav1.ListOptions{LabelSelector: tt.labels}); err != nil {
				t.Fatal(err)
			}
			if got := f.daemon.lastRequest(t).GetNotOlderThanResourceVersion(); got != tt.want {
				t.Errorf("not older than %q, want %q", got, tt.want)
			}
		})
	}
}

// TestWrapFloorIsPerFormat: what a protobuf informer served never makes
// a JSON read wait, and the other way round.
func TestWrapFloorIsPerFormat(t *testing.T) {
	f := newWrapFixture(t, Options{})
	ctx := context.Background()
	f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "90"))
	pods := func(ct string) error {
		_, err := f.clientset(t, ct).CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
		return err
	}
	if err := pods("application/vnd.kubernetes.protobuf"); err != nil {
		t.Fatal(err)
	}
	if err := pods("application/json"); err != nil {
		t.Fatal(err)
	}
	if got := f.daemon.lastRequest(t).GetNotOlderThanResourceVersion(); got != "" {
		t.Errorf("a JSON read after a protobuf one is not older than %q, want no floor", got)
	}
	if err := pods("application/json"); err != nil {
		t.Fatal(err)
	}
	if got := f.daemon.lastRequest(t).GetNotOlderThanResourceVersion(); got != "90" {
		t.Errorf("a JSON read after a JSON one is not older than %q, want 90", got)
	}
}

// TestWrapWaitsForADeletionItCannotDate: a delete answered with a Status
// has no resourceVersion; a list that still holds the object waits for
// the informer's next change, and one that does not is served.
func TestWrapWaitsForADeletionItCannotDate(t *testing.T) {
	f := newWrapFixture(t, Options{})
	ctx := context.Background()
	f.api.mu.Lock()
	f.api.written = []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","details":{"name":"a","kind":"pods","uid":"0b3a8e2c-6c55-4b43-9d6f-1c7c6a4f0a11"}}`)
	f.api.mu.Unlock()
	a, b := testPod("a", "10"), testPod("b", "11")
	a.UID = "0b3a8e2c-6c55-4b43-9d6f-1c7c6a4f0a11"
	stale := []*informerdv1.Event{podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, a, false),
		podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, b, false), marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "12")}
	fresh := []*informerdv1.Event{podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, b, false), marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "13")}
	cs := f.clientset(t, "application/json")
	if err := cs.CoreV1().Pods("ns").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.daemon.mu.Lock()
	f.daemon.onWatch = func(n int) { // the first snapshot is stale, the next has the deletion
		f.daemon.script = fresh
		if n == 1 {
			f.daemon.script = stale
		}
	}
	f.daemon.mu.Unlock()
	list, err := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "b" || list.ResourceVersion != "13" {
		t.Fatalf("list at %s holds %d items, want only b at 13", list.ResourceVersion, len(list.Items))
	}
	if got := f.daemon.lastRequest(t).GetNotOlderThanResourceVersion(); got != "13" {
		t.Errorf("the second snapshot was not older than %q, want 13 (after the stale one's 12)", got)
	}
	// Seen gone: the next list reads once.
	f.daemon.mu.Lock()
	before := len(f.daemon.requests)
	f.daemon.mu.Unlock()
	if _, err := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	f.daemon.mu.Lock()
	after := len(f.daemon.requests)
	f.daemon.mu.Unlock()
	if after != before+1 {
		t.Errorf("a list after the deletion was seen took %d snapshots, want 1", after-before)
	}
	if paths := f.api.got(); len(paths) != 1 {
		t.Errorf("passed through %v, want only the DELETE", paths)
	}
}

// TestWrapFieldSelectorAfterAWrite: an informer with a field selector
// may never receive a write's event, so a list through it older than the
// write passes through instead of waiting.
func TestWrapFieldSelectorAfterAWrite(t *testing.T) {
	f := newWrapFixture(t, Options{})
	ctx := context.Background()
	f.api.mu.Lock()
	f.api.written = []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"50"}}`)
	f.api.mu.Unlock()
	cs := f.clientset(t, "application/json")
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, testPod("p", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, synced string
		passed       bool
	}{
		{"older than the write", "49", true},
		{"as new as the write", "50", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, tt.synced))
			before := len(f.api.got())
			if _, err := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n"}); err != nil {
				t.Fatal(err)
			}
			if got := f.daemon.lastRequest(t).GetNotOlderThanResourceVersion(); got != "" {
				t.Errorf("not older than %q: a field-selected informer must not wait for another's write", got)
			}
			if passed := len(f.api.got()) > before; passed != tt.passed {
				t.Errorf("passed through: %v, want %v", passed, tt.passed)
			}
		})
	}
}
