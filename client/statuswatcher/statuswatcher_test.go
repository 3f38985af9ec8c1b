package statuswatcher_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/statuswatcher"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// scriptedServer answers each WatchStatus call with the next statusScript: its
// responses, then its error.
type scriptedServer struct {
	informerdv1.UnimplementedInformerServiceServer
	mu      sync.Mutex // guards scripts, reqs and parts
	scripts []statusScript
	reqs    []*informerdv1.WatchStatusRequest
	parts   int // messages of WatchStatusChunked requests
}

type statusScript struct {
	responses [][]*informerdv1.StatusEvent
	end       error // nil: block until the client leaves
}

func (s *scriptedServer) WatchStatus(req *informerdv1.WatchStatusRequest, stream informerdv1.InformerService_WatchStatusServer) error {
	return s.run(req, stream)
}

// WatchStatusChunked reads the request's parts as the daemon does, then
// runs the next script.
func (s *scriptedServer) WatchStatusChunked(stream informerdv1.InformerService_WatchStatusChunkedServer) error {
	var req *informerdv1.WatchStatusRequest
	for {
		p, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.parts++
		s.mu.Unlock()
		if req == nil {
			req = p
		} else {
			req.Objects = append(req.Objects, p.GetObjects()...)
		}
	}
	return s.run(req, stream)
}

func (s *scriptedServer) run(req *informerdv1.WatchStatusRequest, stream interface {
	Context() context.Context
	Send(*informerdv1.WatchStatusResponse) error
}) error {
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	if len(s.scripts) == 0 {
		s.mu.Unlock()
		<-stream.Context().Done()
		return nil
	}
	sc := s.scripts[0]
	s.scripts = s.scripts[1:]
	s.mu.Unlock()
	for _, evs := range sc.responses {
		if err := stream.Send(&informerdv1.WatchStatusResponse{Events: evs}); err != nil {
			return err
		}
	}
	if sc.end == nil {
		<-stream.Context().Done()
		return nil
	}
	return sc.end
}

// serveScripts serves scripts on a Unix socket, with the daemon's default
// request limit, and returns a Client of it.
func serveScripts(t *testing.T, scripts ...statusScript) (*client.Client, *scriptedServer) {
	t.Helper()
	srv := &scriptedServer{scripts: scripts}
	socket := filepath.Join(t.TempDir(), "d.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 10))
	informerdv1.RegisterInformerServiceServer(gs, srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	c, err := client.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); gs.Stop(); <-done })
	return c, srv
}

func statusEv(name string, st informerdv1.Status, uid, rv string, gen ...*informerdv1.ResourceStatus) *informerdv1.StatusEvent {
	return &informerdv1.StatusEvent{Type: informerdv1.StatusEventType_STATUS_EVENT_TYPE_STATUS, Status: &informerdv1.ResourceStatus{
		Object: &informerdv1.ObjectReference{Kind: "ConfigMap", Namespace: "ns", Name: name},
		Status: st, Uid: uid, ResourceVersion: rv, ApiVersion: "v1", Generation: 1, Generated: gen,
	}}
}

var syncedEv = &informerdv1.StatusEvent{Type: informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED}

// collect reads events until the channel closes, as "name=Status", "SYNC"
// or "ERROR".
func collect(t *testing.T, ch <-chan event.Event) ([]string, []event.Event) {
	t.Helper()
	var got []string
	var evs []event.Event
	timeout := time.After(time.Minute)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return got, evs
			}
			evs = append(evs, ev)
			switch ev.Type {
			case event.SyncEvent:
				got = append(got, "SYNC")
			case event.ErrorEvent:
				got = append(got, "ERROR")
			default:
				got = append(got, fmt.Sprintf("%s=%s", ev.Resource.Identifier.Name, ev.Resource.Status))
			}
		case <-timeout:
			t.Fatalf("the channel never closed; got %q", got)
		}
	}
}

// TestStatusWatcherAcrossReconnects: statuses, one SyncEvent, then
// changes; after a reconnect, what the new stream repeats and what is
// older than what was sent is dropped; a PERMISSION_DENIED ends the Watch
// with a Forbidden ErrorEvent, and the channel closes.
func TestStatusWatcherAcrossReconnects(t *testing.T) {
	pod := &informerdv1.ResourceStatus{Object: &informerdv1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p"}, Status: informerdv1.Status_STATUS_CURRENT}
	c, srv := serveScripts(t,
		statusScript{responses: [][]*informerdv1.StatusEvent{
			{statusEv("a", informerdv1.Status_STATUS_IN_PROGRESS, "u1", "5"), statusEv("b", informerdv1.Status_STATUS_NOT_FOUND, "", "")},
			{syncedEv},
			{statusEv("a", informerdv1.Status_STATUS_CURRENT, "u1", "6")},
		}, end: status.Error(codes.Unavailable, "daemon restarting")},
		statusScript{responses: [][]*informerdv1.StatusEvent{
			{statusEv("a", informerdv1.Status_STATUS_CURRENT, "u1", "6"), statusEv("b", informerdv1.Status_STATUS_NOT_FOUND, "", ""), syncedEv},
			{statusEv("a", informerdv1.Status_STATUS_IN_PROGRESS, "u1", "4")}, // older than what was sent
			{statusEv("a", informerdv1.Status_STATUS_CURRENT, "u1", "7", pod)},
		}, end: status.Error(codes.PermissionDenied, "no")},
	)
	w := statuswatcher.New(c, statuswatcher.Options{ClientName: "test", Backoff: client.Backoff{Initial: time.Millisecond, Max: time.Millisecond}})
	ids := object.ObjMetadataSet{
		{GroupKind: schema.GroupKind{Kind: "ConfigMap"}, Namespace: "ns", Name: "a"},
		{GroupKind: schema.GroupKind{Kind: "ConfigMap"}, Namespace: "ns", Name: "b"},
	}
	got, evs := collect(t, w.Watch(context.Background(), ids, watcher.Options{RESTScopeStrategy: watcher.RESTScopeRoot}))
	want := []string{"a=InProgress", "b=NotFound", "SYNC", "a=Current", "a=Current", "ERROR"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	if r := evs[3].Resource.Resource; r.GetUID() != "u1" || r.GetGeneration() != 1 || r.GetResourceVersion() != "6" || r.GetKind() != "ConfigMap" {
		t.Fatalf("Resource %v", r.Object)
	}
	if g := evs[4].Resource.GeneratedResources; len(g) != 1 || g[0].Identifier.Name != "p" {
		t.Fatalf("generated %v", g)
	}
	if !apierrors.IsForbidden(evs[5].Error) {
		t.Fatalf("ErrorEvent %v, want Forbidden", evs[5].Error)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.reqs) != 2 || len(srv.reqs[0].GetObjects()) != 2 || srv.reqs[0].GetScopeStrategy() != informerdv1.ScopeStrategy_SCOPE_STRATEGY_ROOT {
		t.Fatalf("requests %v", srv.reqs)
	}
}

// TestStatusWatcherStopsWithContext: cancelling the context closes the
// channel without an ErrorEvent.
func TestStatusWatcherStopsWithContext(t *testing.T) {
	c, _ := serveScripts(t, statusScript{responses: [][]*informerdv1.StatusEvent{{syncedEv}}})
	ctx, cancel := context.WithCancel(context.Background())
	ch := statuswatcher.New(c, statuswatcher.Options{}).Watch(ctx, nil, watcher.Options{})
	if ev := <-ch; ev.Type != event.SyncEvent {
		t.Fatalf("first event %v, want SyncEvent", ev)
	}
	cancel()
	if got, _ := collect(t, ch); len(got) != 0 {
		t.Fatalf("after cancel: %q", got)
	}
}

func refs(n int) object.ObjMetadataSet {
	ids := make(object.ObjMetadataSet, n)
	for i := range ids {
		ids[i] = object.ObjMetadata{GroupKind: schema.GroupKind{Group: "apps", Kind: "Deployment"}, Namespace: "team-a", Name: fmt.Sprintf("frontend-web-server-%06d", i)}
	}
	return ids
}

// TestStatusWatcherLargeRequest: 20,000 objects (over 1 MiB of
// references) reach a daemon that reads at most 64 KiB per message, in
// parts; identifiers the API server would refuse (no name, a bad kind) are
// left out, and the SyncEvent does not wait for them, as with cli-utils'
// watcher; the objects are asked for.
func TestStatusWatcherLargeRequest(t *testing.T) {
	c, srv := serveScripts(t, statusScript{responses: [][]*informerdv1.StatusEvent{{syncedEv}}})
	ids := refs(20000)
	ids = append(ids, object.ObjMetadata{GroupKind: schema.GroupKind{Kind: "Pod"}, Namespace: "team-a"},
		object.ObjMetadata{GroupKind: schema.GroupKind{Kind: "no such kind"}, Namespace: "team-a", Name: "x"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := statuswatcher.New(c, statuswatcher.Options{OnError: func(err error) { t.Errorf("retried after %v", err) }}).Watch(ctx, ids, watcher.Options{})
	if ev := <-ch; ev.Type != event.SyncEvent {
		t.Fatalf("first event %v, want SyncEvent", ev)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	req := srv.reqs[0]
	if len(req.GetObjects()) != 20000 || req.GetObjects()[19999].GetName() != ids[19999].Name || !req.GetIncludeObjects() {
		t.Fatalf("the daemon got %d objects (include_objects %v), want the 20,000 valid ones and the objects", len(req.GetObjects()), req.GetIncludeObjects())
	}
	if srv.parts < 20 {
		t.Fatalf("%d parts", srv.parts)
	}
}

// TestStatusWatcherTerminalErrors: a request the daemon can never accept
// ends the Watch with an ErrorEvent saying what to change, at once; a
// limit that frees up (throttling, objects per caller) is retried.
func TestStatusWatcherTerminalErrors(t *testing.T) {
	tooLarge := status.New(codes.ResourceExhausted, "selector too long")
	tooLarge, _ = tooLarge.WithDetails(&errdetails.ErrorInfo{Domain: informerdv1.ErrorDomain, Reason: informerdv1.ReasonRequestTooLarge})
	for _, tt := range []struct {
		name string
		end  error
		want string // in the ErrorEvent; "" means retried
	}{
		{"too many objects", status.Error(codes.InvalidArgument, "objects: 20001 or more objects, at most 20000 are allowed in one request"), "at most 20000"},
		{"message over the limit", status.Error(codes.ResourceExhausted, "grpc: received message larger than max (84000 vs. 16384)"), "-max-request-bytes must be at least 32768"},
		{"REQUEST_TOO_LARGE", tooLarge.Err(), "selector too long"},
		{"throttled", status.Error(codes.ResourceExhausted, "too many token reviews: retry later"), ""},
		{"objects per caller", status.Error(codes.ResourceExhausted, "limit exceeded: x watches the status of 100000 objects at most (max-status-objects-per-caller)"), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, srv := serveScripts(t, statusScript{end: tt.end}, statusScript{responses: [][]*informerdv1.StatusEvent{{syncedEv}}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch := statuswatcher.New(c, statuswatcher.Options{Backoff: client.Backoff{Initial: time.Millisecond, Max: time.Millisecond}}).Watch(ctx, refs(1), watcher.Options{})
			ev := <-ch
			srv.mu.Lock()
			calls := len(srv.reqs)
			srv.mu.Unlock()
			switch {
			case tt.want == "" && (ev.Type != event.SyncEvent || calls != 2):
				t.Fatalf("event %v after %d calls; want a retry, then SyncEvent", ev, calls)
			case tt.want != "" && (ev.Type != event.ErrorEvent || !strings.Contains(ev.Error.Error(), tt.want) || calls != 1):
				t.Fatalf("event %v after %d calls; want one ErrorEvent mentioning %q", ev, calls, tt.want)
			}
		})
	}
}

// TestStatusWatcherObjects: an event's Resource is the object the daemon
// sent, and so is each generated resource's; with IdentityOnly the
// objects are not asked for.
func TestStatusWatcherObjects(t *testing.T) {
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","uid":"u2"},"status":{"podIP":"10.0.0.7"}}`
	ev := statusEv("a", informerdv1.Status_STATUS_CURRENT, "u1", "5", &informerdv1.ResourceStatus{
		Object: &informerdv1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p"}, Status: informerdv1.Status_STATUS_CURRENT, ObjectJson: []byte(pod),
	})
	ev.Status.ObjectJson = []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"5","generation":1},"data":{"k":"v"}}`)
	c, srv := serveScripts(t, statusScript{responses: [][]*informerdv1.StatusEvent{{ev, syncedEv}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := <-statuswatcher.New(c, statuswatcher.Options{}).Watch(ctx, object.ObjMetadataSet{{GroupKind: schema.GroupKind{Kind: "ConfigMap"}, Namespace: "ns", Name: "a"}}, watcher.Options{})
	if v, _, _ := unstructured.NestedString(got.Resource.Resource.Object, "data", "k"); v != "v" || got.Resource.Resource.GetUID() != "u1" {
		t.Fatalf("Resource %v, want the object sent", got.Resource.Resource)
	}
	if ip, _, _ := unstructured.NestedString(got.Resource.GeneratedResources[0].Resource.Object, "status", "podIP"); ip != "10.0.0.7" {
		t.Fatalf("generated Resource %v, want the Pod sent", got.Resource.GeneratedResources[0].Resource)
	}

	c, srv = serveScripts(t, statusScript{responses: [][]*informerdv1.StatusEvent{{syncedEv}}})
	<-statuswatcher.New(c, statuswatcher.Options{IdentityOnly: true}).Watch(ctx, refs(1), watcher.Options{})
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.reqs[0].GetIncludeObjects() {
		t.Fatal("IdentityOnly asked for the objects")
	}
}
