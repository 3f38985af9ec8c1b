package client

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// scriptedServer answers each WatchStatus call with the next statusScript: its
// responses, then its error.
type scriptedServer struct {
	informerdv1.UnimplementedInformerServiceServer
	mu      sync.Mutex // guards scripts and reqs
	scripts []statusScript
	reqs    []*informerdv1.WatchStatusRequest
}

type statusScript struct {
	responses [][]*informerdv1.StatusEvent
	end       error // nil: block until the client leaves
}

func (s *scriptedServer) WatchStatus(req *informerdv1.WatchStatusRequest, stream informerdv1.InformerService_WatchStatusServer) error {
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

func serveScripts(t *testing.T, scripts ...statusScript) (*Client, *scriptedServer) {
	t.Helper()
	srv := &scriptedServer{scripts: scripts}
	return serveScripted(t, srv), srv
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
	w := NewStatusWatcher(c, StatusWatcherOptions{ClientName: "test", Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond}})
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
	ch := NewStatusWatcher(c, StatusWatcherOptions{}).Watch(ctx, nil, watcher.Options{})
	if ev := <-ch; ev.Type != event.SyncEvent {
		t.Fatalf("first event %v, want SyncEvent", ev)
	}
	cancel()
	if got, _ := collect(t, ch); len(got) != 0 {
		t.Fatalf("after cancel: %q", got)
	}
}
