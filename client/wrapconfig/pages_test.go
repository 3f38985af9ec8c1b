package wrapconfig

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/pager"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func TestContinueTokenIsTheAPIServers(t *testing.T) {
	// k8s.io/apiserver/pkg/storage.EncodeContinue("/registry/pods/ns/b\x00", "/registry/pods", 12),
	// as the API server calls it for a list across namespaces
	want := base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":12,"start":"/ns/b\u0000"}`))
	if got := encodeContinue("/ns/b", 12); got != want {
		t.Errorf("encodeContinue = %s, want %s", got, want)
	}
	rv, start, ok := decodeContinue(want)
	if !ok || rv != "12" || start != "/ns/b\x00" {
		t.Errorf("decodeContinue = %q, %q, %v", rv, start, ok)
	}
	for _, bad := range []string{"token", base64.RawURLEncoding.EncodeToString([]byte(`{"v":"other","rv":1,"start":"a"}`)),
		base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":0,"start":"a"}`))} {
		if _, _, ok := decodeContinue(bad); ok {
			t.Errorf("decodeContinue(%q) accepted it", bad)
		}
	}
}

// pods returns n pods named p0.. in namespace ns, the daemon's snapshot
// of them at rv.
func podScript(t *testing.T, proto bool, rv string, names ...string) []*informerdv1.Event {
	var evs []*informerdv1.Event
	for _, n := range names {
		ns, name, _ := strings.Cut(n, "/")
		p := testPod(name, "5")
		p.Namespace = ns
		evs = append(evs, podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, p, proto))
	}
	return append(evs, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, rv))
}

func TestWrapPaginates(t *testing.T) {
	names := []string{"ns-two/a", "ns-two/b", "ns/a", "ns/b", "ns/c"}
	for _, ct := range contentTypes {
		t.Run(ct.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			proto := ct.name == "protobuf"
			f.daemon.set(nil, podScript(t, proto, "12", names...)...)
			pods := f.clientset(t, ct.contentType).CoreV1().Pods("")
			ctx := context.Background()
			first, err := pods.List(ctx, metav1.ListOptions{Limit: 2})
			if err != nil {
				t.Fatal(err)
			}
			if first.Continue != encodeContinue("/ns-two/b", 12) || first.RemainingItemCount == nil || *first.RemainingItemCount != 3 || len(first.Items) != 2 {
				t.Fatalf("first page: %d items, continue %q, remaining %v", len(first.Items), first.Continue, first.RemainingItemCount)
			}
			// The daemon moves on; the pages stay at 12.
			f.daemon.set(nil, podScript(t, proto, "13", "ns/z")...)
			var got []string
			p := pager.New(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) })
			p.PageSize = 2
			err = p.EachListItem(ctx, metav1.ListOptions{}, func(o runtime.Object) error {
				pod := o.(*corev1.Pod)
				got = append(got, pod.Namespace+"/"+pod.Name)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, []string{"ns/z"}) {
				t.Errorf("a new list paged %v, want the daemon's new snapshot", got)
			}
			second, err := pods.List(ctx, metav1.ListOptions{Limit: 2, Continue: first.Continue})
			if err != nil {
				t.Fatal(err)
			}
			third, err := pods.List(ctx, metav1.ListOptions{Limit: 2, Continue: second.Continue})
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range []*corev1.PodList{second, third} {
				if l.ResourceVersion != "12" {
					t.Errorf("a page at %s, want 12", l.ResourceVersion)
				}
			}
			if third.Continue != "" || third.RemainingItemCount != nil {
				t.Errorf("the last page continues: %q, %v", third.Continue, third.RemainingItemCount)
			}
			got = got[:0]
			for _, l := range []*corev1.PodList{first, second, third} {
				for _, p := range l.Items {
					got = append(got, p.Namespace+"/"+p.Name)
				}
			}
			if !slices.Equal(got, names) {
				t.Errorf("pages hold %v, want %v", got, names)
			}
			if paths := f.api.got(); len(paths) != 0 {
				t.Errorf("passed through %v", paths)
			}
		})
	}
}

func TestWrapPaginationEdges(t *testing.T) {
	f := newWrapFixture(t, Options{})
	f.daemon.set(nil, podScript(t, false, "12", "ns/a", "ns/b", "ns/c")...)
	pods := f.clientset(t, "application/json").CoreV1().Pods("ns")
	ctx := context.Background()
	tests := []struct {
		name      string
		opts      metav1.ListOptions
		items     int
		cont      string
		remaining *int64
		passed    bool
	}{
		{"in a namespace: the name is the key", metav1.ListOptions{Limit: 2}, 2, encodeContinue("/b", 12), ptr(int64(1)), false},
		{"with a label selector: no remainingItemCount", metav1.ListOptions{Limit: 1, LabelSelector: "app"}, 1, encodeContinue("/a", 12), nil, false},
		{"resourceVersion 0: whole, as from the API server's cache", metav1.ListOptions{Limit: 1, ResourceVersion: "0"}, 3, "", nil, false},
		{"a limit over the list", metav1.ListOptions{Limit: 3}, 3, "", nil, false},
		{"a token the wrapper did not issue", metav1.ListOptions{Limit: 1, Continue: encodeContinue("/x", 7)}, 0, "", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(f.api.got())
			l, err := pods.List(ctx, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if passed := len(f.api.got()) > before; passed != tt.passed {
				t.Fatalf("passed through: %v, want %v", passed, tt.passed)
			}
			if tt.passed {
				return
			}
			if len(l.Items) != tt.items || l.Continue != tt.cont || (l.RemainingItemCount == nil) != (tt.remaining == nil) ||
				(tt.remaining != nil && *l.RemainingItemCount != *tt.remaining) {
				t.Errorf("%d items, continue %q, remaining %v; want %d, %q, %v", len(l.Items), l.Continue, l.RemainingItemCount, tt.items, tt.cont, tt.remaining)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestListEnvelopes: the bytes around the items are the API server's.
func TestListEnvelopes(t *testing.T) {
	pod := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"},"spec":{},"status":{}}`)
	cm := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"},"immutable":true,"data":{"k":"v"}}`)
	widget := []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}`)
	rem := int64(4)
	tests := []struct {
		name string
		k    kindInfo
		p    listPage
		want string
	}{
		{"built-in", kindInfo{gvk: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, builtin: true}, listPage{objs: [][]byte{pod}},
			`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"a"},"spec":{},"status":{}}]}` + "\n"},
		{"built-in, fields in their order", kindInfo{gvk: schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, builtin: true}, listPage{objs: [][]byte{cm}, cont: "t", remaining: &rem},
			`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"t","remainingItemCount":4},"items":[{"metadata":{"name":"c"},"immutable":true,"data":{"k":"v"}}]}` + "\n"},
		{"built-in, empty", kindInfo{gvk: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, builtin: true}, listPage{},
			`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[]}` + "\n"},
		{"custom resource", kindInfo{gvk: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}}, listPage{objs: [][]byte{widget}},
			`{"apiVersion":"example.com/v1","items":[` + string(widget) + `],"kind":"WidgetList","metadata":{"continue":"","resourceVersion":"9"}}` + "\n"},
		{"custom resource, a page", kindInfo{gvk: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}}, listPage{objs: [][]byte{widget}, cont: "t", remaining: &rem},
			`{"apiVersion":"example.com/v1","items":[` + string(widget) + `],"kind":"WidgetList","metadata":{"continue":"t","remainingItemCount":4,"resourceVersion":"9"}}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := encodeList(wireFormat{}, tt.k, tt.p, "9")
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}
