package daemon

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"

	"github.com/informerd/informerd/internal/statusconv"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	statusengine "github.com/informerd/informerd/status"
)

// WatchStatus implements the WatchStatus RPC: validate, authenticate,
// watch the objects' status, authorize each resource the watch reads as
// soon as it is known (a CRD may be established later), then send batches
// until the client leaves, authorization is revoked, the watch fails, or
// the daemon shuts down.
func (s *Server) WatchStatus(req *informerdv1.WatchStatusRequest, stream informerdv1.InformerService_WatchStatusServer) error {
	sreq, err := validateWatchStatus(req)
	if err != nil {
		s.metrics.requestErrors.WithLabelValues(codes.InvalidArgument.String()).Inc()
		return err
	}
	if s.opts.Status == nil {
		return status.Error(codes.Unimplemented, "this informerd computes no status (daemon.Options.Status is not set)")
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	defer context.AfterFunc(s.shutdown, func() { cancel(errShuttingDown) })()
	// The caller must be known before anything is started on its behalf;
	// each resource is authorized when the watch reports it.
	if _, err := s.authorize(ctx); err != nil {
		return s.endStream(ctx, err)
	}
	w, err := s.opts.Status.Watch(ctx, sreq)
	if err != nil {
		return s.endStream(ctx, err)
	}
	defer w.Close()
	s.metrics.statusStreams.Inc()
	defer s.metrics.statusStreams.Dec()
	log := callerOf(ctx).log.With("client", sreq.Holder)
	log.Debug("status stream started", "objects", len(sreq.IDs))
	out := startSender(stream, s.opts.WriteTimeout)
	defer out.close()

	for {
		b, err := w.Next(ctx)
		if err != nil {
			return s.endStream(ctx, causeOf(ctx, err))
		}
		if len(b.Access) > 0 {
			if err := s.authorizeStatus(ctx, cancel, b.Access); err != nil {
				return s.endStream(ctx, err)
			}
			if err := w.Grant(ctx, b.Access); err != nil {
				return s.endStream(ctx, causeOf(ctx, err))
			}
		}
		if err := s.sendStatuses(ctx, out, b); err != nil {
			if errors.Is(err, errWriteTimeout) {
				log.Info("client stopped reading: status stream ended", "timeout", s.opts.WriteTimeout)
			}
			return s.endStream(ctx, err)
		}
	}
}

// authorizeStatus authorizes a status stream's resources; a later denial
// ends the stream through cancel, with the denial as the cause.
func (s *Server) authorizeStatus(ctx context.Context, cancel context.CancelCauseFunc, as []statusengine.Access) error {
	accesses := make([]access, len(as))
	for i, a := range as {
		accesses[i] = access{GVR: a.GVR, Namespace: a.Namespace}
	}
	actx, err := s.authorize(ctx, accesses...)
	if err != nil {
		return err
	}
	// Lives until ctx ends (actx is derived from it).
	context.AfterFunc(actx, func() { cancel(context.Cause(actx)) })
	return nil
}

// sendStatuses sends b's statuses, then SYNCED, in responses of at most
// MaxBatchEvents events.
func (s *Server) sendStatuses(ctx context.Context, out *sender, b statusengine.Batch) error {
	evs := make([]*informerdv1.StatusEvent, 0, len(b.Statuses)+1)
	for _, rs := range b.Statuses {
		evs = append(evs, &informerdv1.StatusEvent{Type: informerdv1.StatusEventType_STATUS_EVENT_TYPE_STATUS, Status: toProtoStatus(rs)})
	}
	if b.Synced {
		evs = append(evs, &informerdv1.StatusEvent{Type: informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED})
	}
	for len(evs) > 0 {
		n := min(len(evs), s.opts.MaxBatchEvents)
		if err := out.send(ctx, &informerdv1.WatchStatusResponse{Events: evs[:n]}); err != nil {
			return err
		}
		s.metrics.statusEventsOut.Add(float64(n))
		evs = evs[n:]
	}
	return nil
}

// causeOf returns why ctx ended, if it did, else err: a shutdown or a
// revoked authorization rather than "context canceled".
func causeOf(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return err
}

func toProtoStatus(rs *event.ResourceStatus) *informerdv1.ResourceStatus {
	id := rs.Identifier
	out := &informerdv1.ResourceStatus{
		Object: &informerdv1.ObjectReference{
			Group: id.GroupKind.Group, Kind: id.GroupKind.Kind, Namespace: id.Namespace, Name: id.Name,
		},
		Status:  statusconv.ToProto(rs.Status),
		Message: rs.Message,
	}
	if rs.Error != nil {
		out.Error = rs.Error.Error()
	}
	if u := rs.Resource; u != nil {
		out.ApiVersion, out.Uid, out.Generation, out.ResourceVersion = u.GetAPIVersion(), string(u.GetUID()), u.GetGeneration(), u.GetResourceVersion()
	}
	for _, g := range rs.GeneratedResources {
		out.Generated = append(out.Generated, toProtoStatus(g))
	}
	return out
}
