package client

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// scriptedDaemon answers each Watch with the next script, recording the
// requests; the stream then stays open until the client leaves.
type scriptedDaemon struct {
	informerdv1.UnimplementedInformerServiceServer
	mu       sync.Mutex // guards the fields below
	scripts  [][]*informerdv1.Event
	ends     []error // after a script: the stream's status (nil: stay open)
	requests []*informerdv1.WatchRequest
}

func (d *scriptedDaemon) Watch(req *informerdv1.WatchRequest, stream informerdv1.InformerService_WatchServer) error {
	d.mu.Lock()
	d.requests = append(d.requests, req)
	var script []*informerdv1.Event
	var end error
	if len(d.scripts) > 0 {
		script, end = d.scripts[0], d.ends[0]
		d.scripts, d.ends = d.scripts[1:], d.ends[1:]
	}
	d.mu.Unlock()
	if len(script) > 0 {
		if err := stream.Send(&informerdv1.WatchResponse{Events: script}); err != nil {
			return err
		}
	}
	if end != nil {
		return end
	}
	<-stream.Context().Done()
	return nil
}

func (d *scriptedDaemon) then(end error, evs ...*informerdv1.Event) *scriptedDaemon {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.scripts, d.ends = append(d.scripts, evs), append(d.ends, end)
	return d
}

func (d *scriptedDaemon) request(i int) *informerdv1.WatchRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.requests[i]
}

// serveScripted serves d on a Unix socket and returns a Client of it.
func serveScripted(t *testing.T, d informerdv1.InformerServiceServer, opts ...grpc.ServerOption) *Client {
	t.Helper()
	return serveScriptedDial(t, d, nil, opts...)
}

// serveScriptedDial is serveScripted with the Client's dial options.
func serveScriptedDial(t *testing.T, d informerdv1.InformerServiceServer, dial []grpc.DialOption, opts ...grpc.ServerOption) *Client {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "d.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	informerdv1.RegisterInformerServiceServer(gs, d)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	c, err := Dial(socket, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); gs.Stop(); <-done })
	return c
}

func cm(name, rv string) *informerdv1.Event {
	return ev(added, name, rv)
}

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func TestListerWatcherList(t *testing.T) {
	d := (&scriptedDaemon{}).then(nil, cm("a", "3"), cm("b", "4"), ev(synced, "", "5"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps, Namespace: "ns", LabelSelector: "app=x"})
	got, err := lw.ListWithContext(t.Context(), metav1.ListOptions{LabelSelector: "app=x", FieldSelector: "metadata.name!=z"})
	if err != nil {
		t.Fatal(err)
	}
	l := got.(*unstructured.UnstructuredList)
	if len(l.Items) != 2 || l.GetResourceVersion() != "5" {
		t.Fatalf("List = %d items at %q, want 2 at 5", len(l.Items), l.GetResourceVersion())
	}
	req := d.request(0)
	if req.GetLabelSelector() != "app=x" || req.GetFieldSelector() != "metadata.name!=z" || req.GetNamespace() != "ns" {
		t.Errorf("request = %v: the ListOptions' selectors did not reach the daemon", req)
	}
	_, err = lw.ListWithContext(t.Context(), metav1.ListOptions{LabelSelector: "app=y"})
	if !apierrors.IsBadRequest(err) {
		t.Errorf("conflicting selectors: %v, want BadRequest", err)
	}
}

func TestListerWatcherWatch(t *testing.T) {
	d := (&scriptedDaemon{}).
		then(nil, ev(modified, "a", "6"), ev(bookmarkT, "", "7"), ev(deleted, "b", "8")).
		then(status.Error(codes.PermissionDenied, "may not watch configmaps"), ev(added, "c", "9")).
		then(nil, ev(reset, "", ""))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	collect := func(o metav1.ListOptions, n int) []string {
		t.Helper()
		w, err := lw.WatchWithContext(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		return events(t, w, n)
	}
	if got, want := collect(metav1.ListOptions{ResourceVersion: "5", AllowWatchBookmarks: true}, 3),
		[]string{"MODIFIED a@6", "BOOKMARK @7", "DELETED b@8"}; !slices.Equal(got, want) {
		t.Errorf("watch = %v, want %v", got, want)
	}
	if d.request(0).GetResumeResourceVersion() != "5" {
		t.Errorf("resume = %q, want 5", d.request(0).GetResumeResourceVersion())
	}
	if got, want := collect(metav1.ListOptions{ResourceVersion: "8"}, 2), []string{"ADDED c@9", "ERROR 403"}; !slices.Equal(got, want) {
		t.Errorf("watch ending PERMISSION_DENIED = %v, want %v", got, want)
	}
	// Never older than what this ListerWatcher delivered (9).
	if got := d.request(1).GetNotOlderThanResourceVersion(); got != "8" {
		t.Errorf("second watch asked not older than %q, want 8", got)
	}
	if got, want := collect(metav1.ListOptions{ResourceVersion: "9"}, 1), []string{"ERROR 410"}; !slices.Equal(got, want) {
		t.Errorf("watch after RESET = %v, want %v (relist)", got, want)
	}
	if got := d.request(2).GetNotOlderThanResourceVersion(); got != "9" {
		t.Errorf("third watch asked not older than %q, want 9", got)
	}
}

func TestListerWatcherWatchList(t *testing.T) {
	d := (&scriptedDaemon{}).then(nil, cm("a", "3"), ev(synced, "", "12"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	yes := true
	w, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{
		SendInitialEvents: &yes, ResourceVersion: "10", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	first, second := <-w.ResultChan(), <-w.ResultChan()
	if first.Type != watch.Added || second.Type != watch.Bookmark {
		t.Fatalf("WatchList = %s, %s; want ADDED then BOOKMARK", first.Type, second.Type)
	}
	m := second.Object.(*unstructured.Unstructured)
	if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" || m.GetResourceVersion() != "12" {
		t.Errorf("the initial-events-end bookmark is %v", m.Object)
	}
	req := d.request(0)
	if req.GetResumeResourceVersion() != "" || req.GetNotOlderThanResourceVersion() != "10" {
		t.Errorf("WatchList request = %v, want a snapshot not older than 10", req)
	}
}

// TestListerWatcherTypedWithScheme: with a Scheme, kinds it knows decode
// into their Go types (custom resources too) and others into Unstructured.
func TestListerWatcherTypedWithScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	widget := &unstructured.Unstructured{}
	widget.SetAPIVersion("example.com/v1")
	widget.SetKind("Widget")
	widget.SetName("w")
	wb, _ := widget.MarshalJSON()
	d := (&scriptedDaemon{}).then(nil, cm("a", "3"), &informerdv1.Event{Type: added, Object: wb, ResourceVersion: "4"}, ev(synced, "", "4"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps, Scheme: s})
	got, err := lw.ListWithContext(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	items := got.(*metav1.List).Items
	if _, ok := items[0].Object.(*corev1.ConfigMap); !ok {
		t.Errorf("a ConfigMap decoded as %T", items[0].Object)
	}
	if _, ok := items[1].Object.(*unstructured.Unstructured); !ok {
		t.Errorf("an unknown kind decoded as %T", items[1].Object)
	}
}

// TestListerWatcherRunsAnInformer: a client-go informer over the adapter
// syncs and sees the changes.
func TestListerWatcherRunsAnInformer(t *testing.T) {
	d := (&scriptedDaemon{}).
		then(nil, cm("a", "3"), ev(synced, "", "3"), ev(modified, "a", "4"), cm("b", "5"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	inf := toolscache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, toolscache.Indexers{})
	// Each notification arrives after the store holds it: wake the check.
	changed := make(chan struct{}, 1)
	wake := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { wake() },
		UpdateFunc: func(any, any) { wake() },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("never synced")
	}
	for {
		if obj, ok, _ := inf.GetStore().GetByKey("ns/b"); ok && obj.(*unstructured.Unstructured).GetResourceVersion() == "5" {
			if a, _, _ := inf.GetStore().GetByKey("ns/a"); a.(*unstructured.Unstructured).GetResourceVersion() == "4" {
				return
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the informer never saw the changes")
		}
	}
}

// TestMissingSocketIsNamed (defect 9.9): while the daemon's socket does
// not exist, every reconnect reports that, in words, rather than retrying
// silently.
func TestMissingSocketIsNamed(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "absent.sock")
	c, err := Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 1)
	w := NewWatcher(c, WatchOptions{Resource: configMaps}, &logHandler{}, WatcherOptions{
		Backoff: Backoff{Initial: time.Millisecond},
		OnError: func(err error) {
			select {
			case errs <- err:
				cancel()
			default:
			}
		},
	})
	if err := w.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want it to keep retrying a missing socket", err)
	}
	err = <-errs
	if !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), socket) {
		t.Fatalf("OnError got %v, want it to name the missing socket", err)
	}
}

// events reads n events of w, as "TYPE name@rv".
func events(t *testing.T, w watch.Interface, n int) []string {
	t.Helper()
	var got []string
	for e := range w.ResultChan() {
		switch obj := e.Object.(type) {
		case *metav1.Status:
			got = append(got, fmt.Sprintf("%s %d", e.Type, obj.Code))
		default:
			m := obj.(*unstructured.Unstructured)
			got = append(got, fmt.Sprintf("%s %s@%s", e.Type, m.GetName(), m.GetResourceVersion()))
		}
		if len(got) == n {
			break
		}
	}
	return got
}

// TestListerWatcherAnswersResetWithChanges (issue 21, defect 6): a watch
// whose stream fails resumes by itself where it was, and answers the new
// daemon's RESET with the changes from what the List and the watch
// delivered to the snapshot, and a bookmark, not with 410 (on which the
// reflector would relist after its backoff).
func TestListerWatcherAnswersResetWithChanges(t *testing.T) {
	withUID := func(e *informerdv1.Event, uid string) *informerdv1.Event {
		e.Object = []byte(strings.Replace(string(e.Object), `"namespace"`, `"uid":"`+uid+`","namespace"`, 1))
		return e
	}
	d := (&scriptedDaemon{}).
		then(nil, cm("a", "3"), cm("b", "4"), withUID(cm("c", "4"), "old"), cm("d", "4"), ev(synced, "", "5")).
		then(status.Error(codes.Unavailable, "daemon gone"), ev(modified, "a", "6"), ev(deleted, "d", "7")).
		then(nil, ev(reset, "", ""), cm("a", "6"), withUID(cm("c", "9"), "new"), cm("e", "10"), ev(synced, "", "11"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	if _, err := lw.ListWithContext(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "5", AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// Then, in snapdiff's order, deletions first, carrying the position
	// before the RESET (a reflector resuming there gets the rest), then
	// the changes in the order of their resourceVersions; c was
	// re-created.
	if got, want := events(t, w, 7), []string{"MODIFIED a@6", "DELETED d@7",
		"DELETED b@7", "DELETED c@7", "ADDED c@9", "ADDED e@10", "BOOKMARK @11"}; !slices.Equal(got, want) {
		t.Errorf("watch = %v, want %v", got, want)
	}
	if got := d.request(2).GetResumeResourceVersion(); got != "7" {
		t.Errorf("the watch resumed from %q, want 7", got)
	}
}

// TestResetWithoutADeliveredStateIsExpired: a watch resuming from a point
// no List of this Client returned still answers a RESET with 410, for the
// reflector to relist.
func TestResetWithoutADeliveredStateIsExpired(t *testing.T) {
	d := (&scriptedDaemon{}).
		then(status.Error(codes.Unavailable, "daemon gone"), ev(modified, "a", "6")).
		then(nil, ev(reset, "", ""), cm("a", "6"), ev(synced, "", "7"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	w, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "5"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if got, want := events(t, w, 2), []string{"MODIFIED a@6", "ERROR 410"}; !slices.Equal(got, want) {
		t.Errorf("watch = %v, want %v", got, want)
	}
	if _, open := <-w.ResultChan(); open {
		t.Error("the watch goes on after 410")
	}
}

// TestInformerCatchesUpAfterAResetWithoutRelisting: a client-go informer
// over the adapter whose stream ends and is resumed by a daemon that
// RESETs (a restarted daemon) holds the new snapshot without relisting:
// the daemon sees two requests, and the handler the deletion.
func TestInformerCatchesUpAfterAResetWithoutRelisting(t *testing.T) {
	d := (&scriptedDaemon{}).
		then(status.Error(codes.Unavailable, "daemon gone"), cm("a", "3"), cm("b", "4"), ev(synced, "", "5"), ev(modified, "a", "6")).
		then(nil, ev(reset, "", ""), cm("a", "6"), cm("c", "9"), ev(synced, "", "10"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	inf := toolscache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, toolscache.Indexers{})
	// The handler is called after the store has the change.
	calls := make(chan string, 10)
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { calls <- "ADD " + obj.(*unstructured.Unstructured).GetName() },
		DeleteFunc: func(obj any) { calls <- "DELETE " + obj.(*unstructured.Unstructured).GetName() },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	var got []string
	for !slices.Contains(got, "ADD c") {
		select {
		case c := <-calls:
			got = append(got, c)
		case <-ctx.Done():
			t.Fatalf("the informer's handler saw %v, never c's ADD", got)
		}
	}
	// The informer's initial adds may come in either order.
	slices.Sort(got[:min(2, len(got))])
	if want := []string{"ADD a", "ADD b", "DELETE b", "ADD c"}; !slices.Equal(got, want) {
		t.Errorf("handler calls = %v, want %v", got, want)
	}
	keys := inf.GetStore().ListKeys()
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"ns/a", "ns/c"}) {
		t.Errorf("store = %v, want ns/a and ns/c", keys)
	}
	d.mu.Lock()
	n := len(d.requests)
	d.mu.Unlock()
	if n != 2 {
		t.Errorf("the daemon saw %d requests, want 2 (a list and a resumed watch, no relist)", n)
	}
}
