package statuswatcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/internal/objref"
	"github.com/informerd/informerd/internal/statusconv"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// Options configure New. Zero values take the defaults.
type Options struct {
	// ClientName identifies the watcher in the daemon's introspection.
	ClientName string
	// Backoff between retries after errors the daemon returns.
	Backoff client.Backoff
	// OnError, if set, is called with every error that ends a stream
	// before the watcher reconnects (a terminal one is an ErrorEvent).
	OnError func(error)
	// IdentityOnly, if set, asks the daemon for the objects' identities
	// only: an event's Resource then carries the object's apiVersion,
	// kind and metadata name, namespace, uid, generation and
	// resourceVersion, and generated resources none, which is all a
	// status display needs and costs the daemon and the stream less. An
	// Applier needs the objects (apply-time mutations read them). Default
	// false: the objects, as cli-utils' own StatusWatcher sends them.
	IdentityOnly bool
}

// New returns a cli-utils StatusWatcher whose statuses c's daemon
// computes (WatchStatus), for apply.NewApplierBuilder().WithStatusWatcher
// and apply.NewDestroyerBuilder().WithStatusWatcher.
//
// Each Watch sends a ResourceUpdateEvent when an object's status, message,
// generation, UID or generated resources change, one SyncEvent once every
// object's status has been sent, and an ErrorEvent for an error retrying
// cannot fix (client.Client.Retry's terminal errors, PERMISSION_DENIED
// included: PERMISSION_DENIED and UNAUTHENTICATED as Kubernetes Forbidden
// and Unauthorized errors; a request the daemon can never accept: more
// than informerdv1.MaxStatusObjects objects, or too large), after which its
// channel closes; it also closes when ctx ends. Across reconnects (a
// daemon restart) it resumes without repeating a status and without going
// back to an older state of an object.
//
// An event's Resource is the object its status was computed from, as the
// daemon's cache held it (managedFields included unless the daemon strips
// them), and so is each generated resource's: what an Applier keeps in its
// resource cache and its apply-time mutations read. It is nil when the
// object is not found. A change of the object that leaves its status
// alone sends no event, so Resource is the object as of its last status
// change (see Options.IdentityOnly).
//
// An identifier that the API server would refuse (no name, an invalid
// kind, namespace or name) is left out of the request: like cli-utils'
// StatusWatcher, which watches its kind and never finds it, the Watch
// reports nothing for it, and its SyncEvent does not wait for it.
//
// The objects are sent to the daemon in parts of at most 32 KiB
// (WatchStatusChunked), within its 64 KiB request limit.
func New(c *client.Client, opts Options) watcher.StatusWatcher {
	return &statusWatcher{c: c, opts: opts}
}

type statusWatcher struct {
	c    *client.Client
	opts Options
}

var _ watcher.StatusWatcher = (*statusWatcher)(nil)

func (w *statusWatcher) Watch(ctx context.Context, ids object.ObjMetadataSet, o watcher.Options) <-chan event.Event {
	out := make(chan event.Event)
	req := &informerdv1.WatchStatusRequest{ClientName: w.opts.ClientName, ScopeStrategy: scopeStrategy(o.RESTScopeStrategy), IncludeObjects: !w.opts.IdentityOnly}
	for _, id := range ids {
		if objref.Invalid(id.GroupKind.Group, id.GroupKind.Kind, id.Namespace, id.Name) != "" {
			continue
		}
		req.Objects = append(req.Objects, &informerdv1.ObjectReference{
			Group: id.GroupKind.Group, Kind: id.GroupKind.Kind, Namespace: id.Namespace, Name: id.Name,
		})
	}
	r := &statusRun{c: w.c, parts: split(req, maxPartBytes), out: out, last: map[object.ObjMetadata]*event.ResourceStatus{}}
	go func() {
		defer close(out)
		ro := client.RetryOptions{Backoff: w.opts.Backoff, OnError: w.opts.OnError, StopOnDenied: true}
		if err := w.c.Retry(ctx, ro, r.once); err != nil {
			r.send(ctx, event.Event{Type: event.ErrorEvent, Error: statusError(err)})
		}
	}()
	return out
}

func scopeStrategy(s watcher.RESTScopeStrategy) informerdv1.ScopeStrategy {
	switch s {
	case watcher.RESTScopeRoot:
		return informerdv1.ScopeStrategy_SCOPE_STRATEGY_ROOT
	case watcher.RESTScopeNamespace:
		return informerdv1.ScopeStrategy_SCOPE_STRATEGY_NAMESPACE
	}
	return informerdv1.ScopeStrategy_SCOPE_STRATEGY_AUTOMATIC
}

// maxPartBytes bounds each part of a request the StatusWatcher sends:
// half the daemon's default request limit (64 KiB, -max-request-bytes).
const maxPartBytes = 32 << 10

// split cuts req into parts of at most max bytes each (but for a single
// larger reference, which a valid one never is), the first carrying req's
// other fields: the messages of a WatchStatusChunked request.
func split(req *informerdv1.WatchStatusRequest, max int) []*informerdv1.WatchStatusRequest {
	objs := req.GetObjects()
	first := proto.CloneOf(req)
	first.Objects = nil
	parts := []*informerdv1.WatchStatusRequest{first}
	p, size := first, proto.Size(first)
	for _, o := range objs {
		// A repeated field costs its tag, its length and the reference.
		n := 1 + protowire.SizeBytes(proto.Size(o))
		if len(p.Objects) > 0 && size+n > max {
			p = &informerdv1.WatchStatusRequest{}
			parts, size = append(parts, p), 0
		}
		p.Objects, size = append(p.Objects, o), size+n
	}
	return parts
}

// statusRun is one Watch call's state, owned by its goroutine.
type statusRun struct {
	c      *client.Client
	parts  []*informerdv1.WatchStatusRequest // the request, in parts
	out    chan<- event.Event
	last   map[object.ObjMetadata]*event.ResourceStatus // the latest status sent of each object
	synced bool                                         // SyncEvent sent
}

// once runs one stream until it fails or ctx ends.
func (r *statusRun) once(ctx context.Context) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := r.c.API().WatchStatusChunked(ctx)
	if err != nil {
		return false, err
	}
	for _, p := range r.parts {
		// io.EOF: the daemon ended the stream (refused the request); Recv
		// returns why.
		if err := s.Send(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return false, err
		}
	}
	if err := s.CloseSend(); err != nil {
		return false, err
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return progressed, err
		}
		progressed = true
		for _, ev := range resp.GetEvents() {
			if !r.handle(ctx, ev) {
				return progressed, ctx.Err()
			}
		}
	}
}

// handle sends what ev changes; it returns false if ctx ended.
func (r *statusRun) handle(ctx context.Context, ev *informerdv1.StatusEvent) bool {
	if ev.GetType() == informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED {
		if r.synced {
			return true // a reconnected stream's: sent once per Watch
		}
		r.synced = true
		return r.send(ctx, event.Event{Type: event.SyncEvent})
	}
	rs := fromProtoStatus(ev.GetStatus())
	if prev := r.last[rs.Identifier]; prev != nil && (sameStatus(prev, rs) || older(rs, prev)) {
		return true
	}
	r.last[rs.Identifier] = rs
	return r.send(ctx, event.Event{Type: event.ResourceUpdateEvent, Resource: rs})
}

func (r *statusRun) send(ctx context.Context, ev event.Event) bool {
	select {
	case r.out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// sameStatus reports whether b says nothing new after a: cli-utils'
// definition of a status change, plus the UID.
func sameStatus(a, b *event.ResourceStatus) bool {
	return uid(a) == uid(b) && event.ResourceStatusEqual(a, b)
}

// older reports whether b was computed from an older state of the same
// object than a (a daemon restarted onto a lagging API server).
func older(b, a *event.ResourceStatus) bool {
	if uid(a) == "" || uid(a) != uid(b) {
		return false
	}
	ra, errA := strconv.ParseUint(a.Resource.GetResourceVersion(), 10, 64)
	rb, errB := strconv.ParseUint(b.Resource.GetResourceVersion(), 10, 64)
	return errA == nil && errB == nil && rb < ra
}

func uid(rs *event.ResourceStatus) types.UID {
	if rs.Resource == nil {
		return ""
	}
	return rs.Resource.GetUID()
}

func fromProtoStatus(p *informerdv1.ResourceStatus) *event.ResourceStatus {
	o := p.GetObject()
	rs := &event.ResourceStatus{
		Identifier: object.ObjMetadata{
			GroupKind: schema.GroupKind{Group: o.GetGroup(), Kind: o.GetKind()}, Namespace: o.GetNamespace(), Name: o.GetName(),
		},
		Status:  statusconv.FromProto(p.GetStatus()),
		Message: p.GetMessage(),
	}
	if e := p.GetError(); e != "" {
		rs.Error = errors.New(e)
	}
	if j := p.GetObjectJson(); len(j) > 0 {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err == nil {
			rs.Resource = u
		}
	}
	if rs.Resource == nil && p.GetUid() != "" {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetAPIVersion(p.GetApiVersion())
		u.SetKind(o.GetKind())
		u.SetNamespace(o.GetNamespace())
		u.SetName(o.GetName())
		u.SetUID(types.UID(p.GetUid()))
		u.SetGeneration(p.GetGeneration())
		u.SetResourceVersion(p.GetResourceVersion())
		rs.Resource = u
	}
	for _, g := range p.GetGenerated() {
		rs.GeneratedResources = append(rs.GeneratedResources, fromProtoStatus(g))
	}
	return rs
}

// statusError returns a terminal stream error (one client.Retry returned)
// as a Kubernetes API error where one exists (so that apierrors.IsForbidden
// works as with cli-utils' own watcher), else as it is; a request larger
// than the daemon accepts (the only RESOURCE_EXHAUSTED that is terminal)
// says which limit to raise.
func statusError(err error) error {
	st, _ := status.FromError(err)
	var code int32
	var reason metav1.StatusReason
	switch st.Code() {
	case codes.PermissionDenied:
		code, reason = http.StatusForbidden, metav1.StatusReasonForbidden
	case codes.Unauthenticated:
		code, reason = http.StatusUnauthorized, metav1.StatusReasonUnauthorized
	case codes.ResourceExhausted:
		return fmt.Errorf("informerd refused the status request as larger than it accepts: the daemon's -max-request-bytes must be at least %d, the size of the parts the StatusWatcher sends: %w", maxPartBytes, err)
	default:
		return err
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: code, Reason: reason, Message: "informerd: " + st.Message(),
	}}
}
