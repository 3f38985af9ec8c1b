package wrapconfig

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	clientmetadata "k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// wrapDaemon is a daemon that accepts every Watch (sending the accepted
// header, and the reset header (resetHeader, default lost) for a script
// that starts with RESET), sends its script for the stream, then keeps it open until the
// client leaves or end is closed; or refuses it with refuse.
type wrapDaemon struct {
	informerdv1.UnimplementedInformerServiceServer
	mu       sync.Mutex // guards the fields below
	script   []*informerdv1.Event
	reset    string // the reset header's value; "": lost
	refuse   error
	requests []*informerdv1.WatchRequest
	end      chan struct{} // closed: open streams end with UNAVAILABLE
	left     chan struct{} // if set, closed when a stream's client leaves
	onWatch  func(n int)   // if set, called with d.mu held and the number of Watches so far, before the script is read
}

func (d *wrapDaemon) Watch(req *informerdv1.WatchRequest, stream informerdv1.InformerService_WatchServer) error {
	d.mu.Lock()
	d.requests = append(d.requests, req)
	if d.onWatch != nil {
		d.onWatch(len(d.requests))
	}
	script, refuse, end, reset, left := d.script, d.refuse, d.end, d.reset, d.left
	d.mu.Unlock()
	if refuse != nil {
		return refuse
	}
	md := metadata.Pairs(informerdv1.HeaderAccepted, "true")
	if len(script) > 0 && script[0].GetType() == informerdv1.EventType_EVENT_TYPE_RESET {
		md.Append(informerdv1.HeaderReset, cmp.Or(reset, informerdv1.ResetLost))
	}
	if err := stream.SendHeader(md); err != nil {
		return err
	}
	if len(script) > 0 {
		if err := stream.Send(&informerdv1.WatchResponse{Events: script}); err != nil {
			return err
		}
	}
	select {
	case <-stream.Context().Done():
		if left != nil {
			close(left)
		}
	case <-end:
		return status.Error(codes.Unavailable, "shutting down")
	}
	return nil
}

func (d *wrapDaemon) GetDiscovery(_ context.Context, req *informerdv1.GetDiscoveryRequest) (*informerdv1.GetDiscoveryResponse, error) {
	list := []string{"list", "watch", "get"}
	return &informerdv1.GetDiscoveryResponse{Groups: []*informerdv1.APIGroup{{
		Name: "", PreferredVersion: "v1",
		Versions: []*informerdv1.APIGroupVersion{{Version: "v1", Resources: []*informerdv1.APIResource{
			{Name: "pods", SingularName: "pod", Kind: "Pod", Namespaced: true, Verbs: list},
			{Name: "nodes", Kind: "Node", Verbs: list},
		}}},
	}, {
		Name: "example.com", PreferredVersion: "v1",
		Versions: []*informerdv1.APIGroupVersion{{Version: "v1", Resources: []*informerdv1.APIResource{
			{Name: "widgets", Kind: "Widget", Namespaced: true, Verbs: list},
		}}},
	}}}, nil
}

func (d *wrapDaemon) set(refuse error, script ...*informerdv1.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refuse, d.script = refuse, script
}

func (d *wrapDaemon) lastRequest(t *testing.T) *informerdv1.WatchRequest {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.requests) == 0 {
		t.Fatal("the daemon got no Watch")
	}
	return d.requests[len(d.requests)-1]
}

// apiServer stands for the API server: it records what is passed through
// and answers 200 with an empty JSON PodList.
type apiServer struct {
	mu    sync.Mutex // guards paths and written
	paths []string
	// written, if set, answers writes (JSON): what the API server
	// returns for them.
	written []byte
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.paths = append(a.paths, r.Method+" "+r.URL.RequestURI())
	written := a.written
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodGet {
		_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`))
		return
	}
	if written != nil {
		_, _ = w.Write(written)
		return
	}
	_, _ = w.Write([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns"}}`))
}

func (a *apiServer) got() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.paths...)
}

type wrapFixture struct {
	daemon *wrapDaemon
	api    *apiServer
	reg    *prometheus.Registry
	cfg    *rest.Config // wrapped
	// startGRPC serves the daemon on its socket; stopGRPC stops it.
	startGRPC, stopGRPC func()
}

// newWrapFixture serves a wrapDaemon and an apiServer, and returns a
// config of the apiServer wrapped with o.
func newWrapFixture(t *testing.T, o Options) *wrapFixture {
	t.Helper()
	f := &wrapFixture{daemon: &wrapDaemon{end: make(chan struct{})}, api: &apiServer{}, reg: prometheus.NewRegistry()}
	socket := filepath.Join(t.TempDir(), "d.sock")
	f.startGRPC = func() {
		l, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		informerdv1.RegisterInformerServiceServer(srv, f.daemon)
		served := make(chan struct{})
		go func() { defer close(served); _ = srv.Serve(l) }()
		var once sync.Once
		f.stopGRPC = func() { once.Do(func() { srv.Stop(); <-served }) }
		t.Cleanup(f.stopGRPC)
	}
	f.startGRPC()
	c, err := client.Dial(socket, client.WithToken("t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	hs := httptest.NewServer(f.api)
	t.Cleanup(hs.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	o.Registerer = f.reg
	f.cfg = Wrap(&rest.Config{Host: hs.URL, Transport: tr}, c, o)
	return f
}

func (f *wrapFixture) count(outcome, reason string) float64 {
	return testutil.ToFloat64(wrapRequests(f.reg).WithLabelValues(outcome, reason))
}

func (f *wrapFixture) clientset(t *testing.T, contentType string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(f.cfg)
	cfg.ContentType = contentType
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func testPod(name, rv string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: rv, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: "node-" + name, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}
}

// podBytes encodes a pod as the daemon sends it: JSON, or the API
// server's protobuf.
func podBytes(t *testing.T, p *corev1.Pod, proto bool) []byte {
	t.Helper()
	if !proto {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(p, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func podEvent(t *testing.T, typ informerdv1.EventType, p *corev1.Pod, proto bool) *informerdv1.Event {
	return &informerdv1.Event{Type: typ, Object: podBytes(t, p, proto), ResourceVersion: p.ResourceVersion}
}

func marker(typ informerdv1.EventType, rv string) *informerdv1.Event {
	return &informerdv1.Event{Type: typ, ResourceVersion: rv,
		Object: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"resourceVersion":"` + rv + `"}}`)}
}

var contentTypes = []struct{ name, contentType string }{
	{"json", "application/json"},
	{"protobuf", "application/vnd.kubernetes.protobuf"},
}

func TestWrapListIsDecodedByClientGo(t *testing.T) {
	for _, ct := range contentTypes {
		t.Run(ct.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			proto := ct.name == "protobuf"
			a, b := testPod("a", "10"), testPod("b", "11")
			f.daemon.set(nil, podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, a, proto),
				podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, b, proto), marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "12"))
			list, err := f.clientset(t, ct.contentType).CoreV1().Pods("ns").List(context.Background(),
				metav1.ListOptions{LabelSelector: "app", ResourceVersion: "0", Limit: 500})
			if err != nil {
				t.Fatal(err)
			}
			if list.ResourceVersion != "12" || len(list.Items) != 2 {
				t.Fatalf("list at %q with %d items, want 12 and 2", list.ResourceVersion, len(list.Items))
			}
			for i, want := range []*corev1.Pod{a, b} {
				got := list.Items[i]
				if got.Name != want.Name || got.ResourceVersion != want.ResourceVersion || got.Spec.NodeName != want.Spec.NodeName || got.Labels["app"] != want.Name {
					t.Errorf("item %d = %s/%s rv %s node %s, want %s", i, got.Namespace, got.Name, got.ResourceVersion, got.Spec.NodeName, want.Name)
				}
				if got.Kind != "" || got.APIVersion != "" {
					t.Errorf("item %d has TypeMeta %v: the API server's typed lists have none", i, got.TypeMeta)
				}
			}
			req := f.daemon.lastRequest(t)
			if req.GetNamespace() != "ns" || req.GetLabelSelector() != "app" || req.GetResource().GetResource() != "pods" ||
				(req.GetEncoding() == informerdv1.Encoding_ENCODING_PROTOBUF) != proto {
				t.Errorf("daemon request %v", req)
			}
			if got := f.count(outcomeServed, ""); got != 1 {
				t.Errorf("served %v, want 1", got)
			}
			if paths := f.api.got(); len(paths) != 0 {
				t.Errorf("the API server got %v", paths)
			}
		})
	}
}

// recv returns the next event of w, failing after a while.
func recv(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("the watch ended")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event")
	}
	return watch.Event{}
}

func TestWrapWatchIsDecodedByClientGo(t *testing.T) {
	for _, ct := range contentTypes {
		t.Run(ct.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			proto := ct.name == "protobuf"
			a := testPod("a", "20")
			a2 := testPod("a", "21")
			a2.Labels["v"] = "2"
			f.daemon.set(nil, podEvent(t, informerdv1.EventType_EVENT_TYPE_MODIFIED, a2, proto),
				marker(informerdv1.EventType_EVENT_TYPE_BOOKMARK, "22"),
				podEvent(t, informerdv1.EventType_EVENT_TYPE_DELETED, testPod("a", "23"), proto),
				&informerdv1.Event{Type: informerdv1.EventType_EVENT_TYPE_RESET},
				podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, testPod("b", "29"), proto),
				marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "30"))
			w, err := f.clientset(t, ct.contentType).CoreV1().Pods("ns").Watch(context.Background(),
				metav1.ListOptions{ResourceVersion: a.ResourceVersion, AllowWatchBookmarks: true, TimeoutSeconds: new(int64(300))})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			ev := recv(t, w)
			if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Modified || !ok || p.ResourceVersion != "21" || p.Labels["v"] != "2" || p.Spec.NodeName != "node-a" {
				t.Fatalf("first event %s %#v", ev.Type, ev.Object)
			}
			ev = recv(t, w)
			if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Bookmark || !ok || p.ResourceVersion != "22" {
				t.Fatalf("second event %s %#v, want a bookmark at 22", ev.Type, ev.Object)
			}
			ev = recv(t, w)
			if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Deleted || !ok || p.ResourceVersion != "23" {
				t.Fatalf("third event %s %#v", ev.Type, ev.Object)
			}
			ev = recv(t, w)
			// The API server's text: the lost position, and one it could resume from.
			if st, ok := ev.Object.(*metav1.Status); ev.Type != watch.Error || !ok || !apierrors.IsResourceExpired(apierrors.FromObject(st)) ||
				st.Code != http.StatusGone || st.Message != "too old resource version: 23 (30)" {
				t.Fatalf("after RESET: %s %#v, want ERROR 410 Expired", ev.Type, ev.Object)
			}
			if _, ok := <-w.ResultChan(); ok {
				t.Fatal("the watch goes on after 410")
			}
			if req := f.daemon.lastRequest(t); req.GetResumeResourceVersion() != "20" {
				t.Errorf("resumed at %q, want 20", req.GetResumeResourceVersion())
			}
		})
	}
}

func TestWrapWatchList(t *testing.T) {
	for _, ct := range contentTypes {
		t.Run(ct.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			proto := ct.name == "protobuf"
			f.daemon.set(nil, podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, testPod("a", "30"), proto),
				marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "31"),
				podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, testPod("b", "32"), proto))
			w, err := f.clientset(t, ct.contentType).CoreV1().Pods("").Watch(context.Background(), metav1.ListOptions{
				ResourceVersion: "25", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
				SendInitialEvents: new(true), AllowWatchBookmarks: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			if ev := recv(t, w); ev.Type != watch.Added || ev.Object.(*corev1.Pod).Name != "a" {
				t.Fatalf("first event %s %#v", ev.Type, ev.Object)
			}
			ev := recv(t, w)
			p, ok := ev.Object.(*corev1.Pod)
			if ev.Type != watch.Bookmark || !ok || p.ResourceVersion != "31" || p.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
				t.Fatalf("second event %s %#v, want the initial-events-end bookmark at 31", ev.Type, ev.Object)
			}
			if ev := recv(t, w); ev.Type != watch.Added || ev.Object.(*corev1.Pod).Name != "b" {
				t.Fatalf("third event %s %#v", ev.Type, ev.Object)
			}
			req := f.daemon.lastRequest(t)
			if req.GetResumeResourceVersion() != "" || req.GetNotOlderThanResourceVersion() != "25" {
				t.Errorf("daemon request resume %q not older than %q, want a snapshot not older than 25", req.GetResumeResourceVersion(), req.GetNotOlderThanResourceVersion())
			}
		})
	}
}

func TestWrapMetadata(t *testing.T) {
	f := newWrapFixture(t, Options{})
	a := testPod("a", "40")
	a.Annotations = map[string]string{"k": "v"}
	metaOnly := func(p *corev1.Pod) []byte {
		b, _ := json.Marshal(metav1.PartialObjectMetadata{TypeMeta: p.TypeMeta, ObjectMeta: p.ObjectMeta})
		return b
	}
	f.daemon.set(nil, &informerdv1.Event{Type: informerdv1.EventType_EVENT_TYPE_ADDED, Object: metaOnly(a), ResourceVersion: "40"},
		marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "41"))
	mc, err := clientmetadata.NewForConfig(f.cfg) // asks for protobuf first
	if err != nil {
		t.Fatal(err)
	}
	pods := mc.Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace("ns")
	list, err := pods.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if list.ResourceVersion != "41" || len(list.Items) != 1 || list.Items[0].Name != "a" || list.Items[0].Annotations["k"] != "v" {
		t.Fatalf("list %#v", list)
	}
	if req := f.daemon.lastRequest(t); req.GetView() != informerdv1.View_VIEW_METADATA || req.GetEncoding() == informerdv1.Encoding_ENCODING_PROTOBUF {
		t.Errorf("daemon request %v, want the metadata view in JSON", req)
	}
	w, err := pods.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := recv(t, w)
	if m, ok := ev.Object.(*metav1.PartialObjectMetadata); ev.Type != watch.Added || !ok || m.Name != "a" || m.ResourceVersion != "40" {
		t.Fatalf("event %s %#v", ev.Type, ev.Object)
	}
}

func TestWrapPassesThrough(t *testing.T) {
	f := newWrapFixture(t, Options{})
	cs := f.clientset(t, "application/json")
	ctx := context.Background()
	pods := cs.CoreV1().Pods("ns")
	if _, err := pods.Create(ctx, testPod("p", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Get(ctx, "p", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.List(ctx, metav1.ListOptions{ResourceVersion: "5", ResourceVersionMatch: metav1.ResourceVersionMatchExact}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.List(ctx, metav1.ListOptions{Continue: "token"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/ns/pods").SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/pods").SetHeader("Accept", "application/yaml").DoRaw(ctx); err != nil {
		t.Fatal(err)
	}
	// The daemon does not know "po": the API server does not either.
	if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/po").DoRaw(ctx); err != nil {
		t.Fatal(err)
	}
	// A namespace of a cluster-scoped resource.
	if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/ns/nodes").DoRaw(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"POST /api/v1/namespaces/ns/pods",
		"GET /api/v1/namespaces/ns/pods/p",
		"GET /api/v1/namespaces/ns/pods?resourceVersion=5&resourceVersionMatch=Exact",
		"GET /api/v1/namespaces/ns/pods?continue=token",
		"GET /api/v1/namespaces/ns/pods",
		"GET /api/v1/pods",
		"GET /api/v1/po",
		"GET /api/v1/namespaces/ns/nodes",
	}
	if got := f.api.got(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the API server got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for reason, n := range map[string]float64{reasonMethod: 1, reasonNotList: 1, reasonExactRV: 2, reasonFormat: 2, reasonNotServed: 2} {
		if got := f.count(outcomePassed, reason); got != n {
			t.Errorf("passed for %s: %v, want %v", reason, got, n)
		}
	}
}

func withReason(code codes.Code, reason string, md map[string]string) error {
	st, _ := status.New(code, "refused").WithDetails(&errdetails.ErrorInfo{Domain: informerdv1.ErrorDomain, Reason: reason, Metadata: md})
	return st.Err()
}

func TestWrapDaemonRefusals(t *testing.T) {
	denied := withReason(codes.PermissionDenied, informerdv1.ReasonDenied, map[string]string{informerdv1.MetadataUser: "system:serviceaccount:a:sa"})
	for _, tc := range []struct {
		name   string
		refuse error
		reason string
		// strict: the API server's answer the strict mode returns
		code    int
		message string
	}{
		{"denied", denied, reasonDenied, http.StatusForbidden,
			`pods is forbidden: User "system:serviceaccount:a:sa" cannot list resource "pods" in API group "" in the namespace "b"`},
		{"sensitive", withReason(codes.PermissionDenied, informerdv1.ReasonSensitive, nil), reasonSensitive, http.StatusForbidden, ""},
		{"not served", status.Error(codes.NotFound, "gone"), reasonNotServed, http.StatusNotFound, "the server could not find the requested resource"},
		{"exhausted", status.Error(codes.ResourceExhausted, "too many"), reasonExhausted, http.StatusTooManyRequests, ""},
		{"rejected", status.Error(codes.InvalidArgument, "bad selector"), reasonRejected, http.StatusBadRequest, ""},
		{"CRD terminating", withReason(codes.Unavailable, informerdv1.ReasonCRDTerminating, nil), reasonTerminating, http.StatusServiceUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			f.daemon.set(tc.refuse)
			if _, err := f.clientset(t, "application/json").CoreV1().Pods("b").List(context.Background(), metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := f.api.got(); len(got) != 1 || got[0] != "GET /api/v1/namespaces/b/pods" {
				t.Errorf("the API server got %v, want the list passed through", got)
			}
			if got := f.count(outcomePassed, tc.reason); got != 1 {
				t.Errorf("passed for %s: %v, want 1", tc.reason, got)
			}

			strict := newWrapFixture(t, Options{Strict: true})
			strict.daemon.set(tc.refuse)
			_, err := strict.clientset(t, "application/json").CoreV1().Pods("b").List(context.Background(), metav1.ListOptions{})
			var se *apierrors.StatusError
			if !errors.As(err, &se) || int(se.ErrStatus.Code) != tc.code || (tc.message != "" && se.ErrStatus.Message != tc.message) {
				t.Fatalf("strict: %v, want %d %q", err, tc.code, tc.message)
			}
			if got := strict.api.got(); len(got) != 0 {
				t.Errorf("strict: the API server got %v", got)
			}
		})
	}
}

// TestWrapStrictRetryAfterIsTheDaemons: a strict config answers the
// daemon's RESOURCE_EXHAUSTED with a 429 whose Retry-After is the delay
// the daemon asked for (rounded up to whole seconds), so that client-go
// waits as long as the daemon's per-caller budget needs.
func TestWrapStrictRetryAfterIsTheDaemons(t *testing.T) {
	st, _ := status.New(codes.ResourceExhausted, "over the caller's share").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(2300 * time.Millisecond)})
	f := newWrapFixture(t, Options{Strict: true})
	f.daemon.set(st.Err())
	rt, err := rest.TransportFor(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, f.cfg.Host+"/api/v1/namespaces/b/pods", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("got %d with Retry-After %q, want 429 with 3", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

func TestWrapStrictRefusesWhatItDoesNotServe(t *testing.T) {
	f := newWrapFixture(t, Options{Strict: true})
	_, err := f.clientset(t, "application/json").CoreV1().Pods("ns").Create(context.Background(), testPod("p", ""), metav1.CreateOptions{})
	if !errors.Is(err, ErrNotServed) {
		t.Fatalf("create: %v, want ErrNotServed", err)
	}
	if got := f.count(outcomeRefused, reasonMethod); got != 1 {
		t.Errorf("refused: %v", got)
	}
}

func TestWrapFallsBackWhileTheDaemonIsDown(t *testing.T) {
	f := newWrapFixture(t, Options{DialTimeout: 100 * time.Millisecond})
	f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "50"))
	cs := f.clientset(t, "application/json")
	ctx := context.Background()
	w, err := cs.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{ResourceVersion: "50"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.stopGRPC()
	// The watch ends as one the API server ends: no event, a closed channel.
	select {
	case ev, ok := <-w.ResultChan():
		if ok {
			t.Fatalf("the watch sent %s %#v as the daemon went away", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch goes on after the daemon went away")
	}
	list, err := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
	if err != nil || list.ResourceVersion != "1" {
		t.Fatalf("list while the daemon is down: %v, %v; want the API server's", list, err)
	}
	if got := f.count(outcomeFellBack, reasonUnavailable); got != 1 {
		t.Errorf("fell back %v times, want 1", got)
	}

	// Back: requests return to the daemon once the connection is up
	// again (its reconnect backoff is at most a second).
	f.startGRPC()
	f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "60"))
	deadline := time.Now().Add(10 * time.Second)
	for f.count(outcomeServed, "") < 2 { // the watch, then this list
		if time.Now().After(deadline) {
			t.Fatalf("requests still go to the API server %v after the daemon is back", 10*time.Second)
		}
		if _, err := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); err != nil || list.ResourceVersion != "60" {
		t.Fatalf("list once the daemon is back: %v, %v; want the daemon's at 60", list, err)
	}
}

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct {
		accept string
		watch  bool
		want   wireFormat
		ok     bool
	}{
		{"", false, wireFormat{}, true},
		{"application/json", false, wireFormat{}, true},
		{"application/json, */*", false, wireFormat{jsonFallback: true}, true},
		{"application/vnd.kubernetes.protobuf, */*", false, wireFormat{protobuf: true, jsonFallback: true}, true},
		{"application/vnd.kubernetes.protobuf", true, wireFormat{protobuf: true}, true},
		{"application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json", false,
			wireFormat{protobuf: true, metadata: true}, true},
		{"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", true, wireFormat{metadata: true}, true},
		{"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", false, wireFormat{}, false},
		{"application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1", false, wireFormat{}, false},
		{"application/json;as=Table;v=v1;g=meta.k8s.io,application/json", false, wireFormat{}, false},
		{"application/yaml", false, wireFormat{}, false},
		{"application/cbor, application/json", false, wireFormat{}, false},
		{"application/json;q=0.5, application/yaml", false, wireFormat{}, false},
		{"text/html", false, wireFormat{}, false},
	} {
		got, ok := negotiate([]string{tc.accept}, tc.watch)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("negotiate(%q, watch %v) = %+v, %v; want %+v, %v", tc.accept, tc.watch, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		gvr  schema.GroupVersionResource
		ns   string
		ok   bool
	}{
		{"/api/v1/pods", schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "", true},
		{"/api/v1/namespaces", schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, "", true},
		{"/api/v1/namespaces/a/pods", schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "a", true},
		{"/apis/apps/v1/namespaces/a/deployments", schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, "a", true},
		{"/apis/rbac.authorization.k8s.io/v1/clusterroles", schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, "", true},
		{"/api/v1/namespaces/a", schema.GroupVersionResource{}, "", false},
		{"/api/v1/namespaces/a/status", schema.GroupVersionResource{}, "", false},
		{"/api/v1/namespaces/a/pods/p", schema.GroupVersionResource{}, "", false},
		{"/api/v1/namespaces/a/pods/p/log", schema.GroupVersionResource{}, "", false},
		{"/api/v1/watch/pods", schema.GroupVersionResource{}, "", false},
		{"/api", schema.GroupVersionResource{}, "", false},
		{"/apis/apps/v1", schema.GroupVersionResource{}, "", false},
		{"/version", schema.GroupVersionResource{}, "", false},
	} {
		gvr, ns, ok := parsePath(tc.path)
		if ok != tc.ok || (ok && (gvr != tc.gvr || ns != tc.ns)) {
			t.Errorf("parsePath(%q) = %v %q %v", tc.path, gvr, ns, ok)
		}
	}
}

// TestWrapStrictNotFoundIsTheAPIServers: a strict config answers the
// daemon's NOT_FOUND as the API server answers for a resource it does not
// serve: for a custom resource (a deleted CRD's), its mux's plain "404
// page not found", for a built-in group version a Status.
func TestWrapStrictNotFoundIsTheAPIServers(t *testing.T) {
	for _, tc := range []struct {
		path, contentType, body string
	}{
		{"/apis/example.com/v1/namespaces/b/widgets", "text/plain; charset=utf-8", "404 page not found\n"},
		{"/api/v1/namespaces/b/pods", "application/json", `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			f := newWrapFixture(t, Options{Strict: true})
			f.daemon.set(status.Error(codes.NotFound, "its CustomResourceDefinition was deleted"))
			rt, err := rest.TransportFor(f.cfg)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodGet, f.cfg.Host+tc.path, nil)
			req.Header.Set("Accept", "application/json, */*")
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != tc.contentType || string(body) != tc.body {
				t.Errorf("got %d %q %q, want 404 %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.contentType, tc.body)
			}
			if got := f.count(outcomeRefused, reasonNotServed); got != 1 {
				t.Errorf("refused for not_served: %v, want 1", got)
			}
			if got := f.api.got(); len(got) != 0 {
				t.Errorf("the API server got %v", got)
			}
		})
	}
}
