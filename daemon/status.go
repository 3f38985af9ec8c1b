package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/internal/statusconv"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	statusengine "github.com/informerd/informerd/status"
)

// WatchStatus implements the WatchStatus RPC: see watchStatus.
func (s *Server) WatchStatus(req *informerdv1.WatchStatusRequest, stream informerdv1.InformerService_WatchStatusServer) error {
	n := len(req.GetObjects())
	if n > informerdv1.MaxStatusObjects {
		return s.reject(tooManyObjects(n))
	}
	name := callerName(stream.Context())
	if err := s.holdStatusObjects(name, n); err != nil {
		return err
	}
	defer s.statusObjects.release(name, n)
	return s.watchStatus(req, stream)
}

// WatchStatusChunked implements the WatchStatusChunked RPC: it receives the
// request's parts until the client closes its side, then serves it as
// WatchStatus does. Each part is at most -max-request-bytes, as every
// request message; the objects of all parts count, as they arrive, against
// the request's limit (MaxStatusObjects) and the caller's
// (MaxStatusObjectsPerCaller), so that a caller, authenticated before the
// first part is read, holds no more than that while it sends.
func (s *Server) WatchStatusChunked(stream informerdv1.InformerService_WatchStatusChunkedServer) error {
	name := callerName(stream.Context())
	var req *informerdv1.WatchStatusRequest
	held, parts := 0, 0
	defer func() { s.statusObjects.release(name, held) }()
	for {
		part, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		n := len(part.GetObjects())
		switch {
		case req != nil && n == 0:
			return s.reject(invalid("part %d has no objects: every part after the first carries at least one", parts))
		case held+n > informerdv1.MaxStatusObjects:
			return s.reject(tooManyObjects(held + n))
		}
		if err := s.holdStatusObjects(name, n); err != nil {
			return err
		}
		held, parts = held+n, parts+1
		if req == nil {
			req = part
		} else {
			req.Objects = append(req.Objects, part.GetObjects()...)
		}
	}
	if req == nil {
		return s.reject(invalid("no request: send at least one WatchStatusRequest before closing the stream"))
	}
	return s.watchStatus(req, stream)
}

func tooManyObjects(n int) error {
	return invalid("objects: %d or more objects, at most %d are allowed in one request: watch the others in another request", n, informerdv1.MaxStatusObjects)
}

// holdStatusObjects counts n more objects of the caller's status streams,
// or returns RESOURCE_EXHAUSTED if that would exceed
// MaxStatusObjectsPerCaller (streams that end give theirs back).
func (s *Server) holdStatusObjects(caller string, n int) error {
	if s.statusObjects.acquire(caller, n) {
		return nil
	}
	s.metrics.limited.WithLabelValues("status_objects_per_caller").Inc()
	return s.reject(fmt.Errorf("%w: %s watches the status of %d objects in its open streams at most (max-status-objects-per-caller): close some first",
		errLimit, caller, s.opts.Limits.MaxStatusObjectsPerCaller))
}

// callerName is the name of ctx's caller, as streamAuth established it.
func callerName(ctx context.Context) string {
	if c := callerOf(ctx); c != nil {
		return c.name
	}
	return ""
}

// watchStatus serves a status request: validate, watch the objects'
// status, authorize and hold each resource the watch reads as soon as it
// is known (a CRD may be established later), then send batches until the
// client leaves, a re-check revokes the caller's grant, the watch fails,
// or the daemon shuts down.
func (s *Server) watchStatus(req *informerdv1.WatchStatusRequest, stream grpc.ServerStream) (err error) {
	sreq, err := validateWatchStatus(req)
	if err != nil {
		return s.reject(err)
	}
	if s.opts.Status == nil {
		return s.reject(status.Error(codes.Unimplemented, "this informerd computes no status (daemon.Options.Status is not set)"))
	}
	c, err := s.begin(stream.Context(), sreq.Holder)
	if err != nil {
		return err
	}
	defer func() { err = c.end(err) }()
	w, err := s.opts.Status.Watch(c.ctx, sreq)
	if err != nil {
		return err
	}
	defer w.Close()
	s.metrics.statusStreams.Inc()
	defer s.metrics.statusStreams.Dec()
	log := c.log()
	log.Debug("status stream started", "objects", len(sreq.IDs))
	out := startSender(stream, s.opts.WriteTimeout)
	defer out.close()

	for {
		b, err := w.Next(c.ctx)
		if err != nil {
			return err
		}
		for _, a := range b.Access {
			if err := c.hold(access{GVR: a.GVR, Namespace: a.Namespace}); err != nil {
				return err
			}
		}
		if len(b.Access) > 0 {
			if err := w.Grant(c.ctx, b.Access); err != nil {
				return err
			}
		}
		if err := s.sendStatuses(c.ctx, out, b, req.GetIncludeObjects()); err != nil {
			if errors.Is(err, errWriteTimeout) {
				log.Info("client stopped reading: status stream ended", "timeout", s.opts.WriteTimeout)
			}
			return err
		}
	}
}

// sendStatuses sends b's statuses (with their objects if asked for), then
// SYNCED, in responses of at most MaxBatchEvents events and MaxBatchBytes
// bytes (a single larger event is sent alone). The objects are only read
// here, from the cache's bytes, for the events sent: the Engine delivers
// a status (and so an object) only once the caller was granted every
// resource it was computed from.
func (s *Server) sendStatuses(ctx context.Context, out *sender, b statusengine.Batch, objects bool) error {
	var evs []*informerdv1.StatusEvent
	size := 0
	flush := func() error {
		if len(evs) == 0 {
			return nil
		}
		if err := out.send(ctx, &informerdv1.WatchStatusResponse{Events: evs}); err != nil {
			return err
		}
		s.metrics.statusEventsOut.Add(float64(len(evs)))
		evs, size = nil, 0
		return nil
	}
	add := func(ev *informerdv1.StatusEvent) error {
		n := proto.Size(ev)
		if len(evs) > 0 && (len(evs) >= s.opts.MaxBatchEvents || size+n > s.opts.MaxBatchBytes) {
			if err := flush(); err != nil {
				return err
			}
		}
		evs, size = append(evs, ev), size+n
		return nil
	}
	for _, rs := range b.Statuses {
		var objs map[object.ObjMetadata][]byte
		if objects {
			objs = rs.Objects
		}
		if err := add(statusEvent(rs.ResourceStatus, objs)); err != nil {
			return err
		}
	}
	if b.Synced {
		if err := add(&informerdv1.StatusEvent{Type: informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED}); err != nil {
			return err
		}
	}
	return flush()
}

// statusEvent is the event of rs with objs' JSON. An event that would be
// larger than a client accepts (a Deployment with thousands of Pods) goes
// without its generated resources' objects.
func statusEvent(rs *event.ResourceStatus, objs map[object.ObjMetadata][]byte) *informerdv1.StatusEvent {
	ev := &informerdv1.StatusEvent{Type: informerdv1.StatusEventType_STATUS_EVENT_TYPE_STATUS, Status: toProtoStatus(rs, objs)}
	if len(objs) > 1 && proto.Size(ev) > informerdv1.MaxMessageBytes-informerdv1.MaxEventOverhead {
		ev.Status = toProtoStatus(rs, map[object.ObjMetadata][]byte{rs.Identifier: objs[rs.Identifier]})
	}
	return ev
}

// toProtoStatus converts rs, with the JSON of each object of it found in
// objs.
func toProtoStatus(rs *event.ResourceStatus, objs map[object.ObjMetadata][]byte) *informerdv1.ResourceStatus {
	id := rs.Identifier
	out := &informerdv1.ResourceStatus{
		Object: &informerdv1.ObjectReference{
			Group: id.GroupKind.Group, Kind: id.GroupKind.Kind, Namespace: id.Namespace, Name: id.Name,
		},
		Status:     statusconv.ToProto(rs.Status),
		Message:    rs.Message,
		ObjectJson: objs[id],
	}
	if rs.Error != nil {
		out.Error = rs.Error.Error()
	}
	if u := rs.Resource; u != nil {
		out.ApiVersion, out.Uid, out.Generation, out.ResourceVersion = u.GetAPIVersion(), string(u.GetUID()), u.GetGeneration(), u.GetResourceVersion()
	}
	for _, g := range rs.GeneratedResources {
		out.Generated = append(out.Generated, toProtoStatus(g, objs))
	}
	return out
}
