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

// WatchStatus implements the WatchStatus RPC: validate, watch the
// objects' status, authorize and hold each resource the watch reads as
// soon as it is known (a CRD may be established later), then send batches
// until the client leaves, a re-check revokes the caller's grant, the
// watch fails, or the daemon shuts down.
func (s *Server) WatchStatus(req *informerdv1.WatchStatusRequest, stream informerdv1.InformerService_WatchStatusServer) (err error) {
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
		if err := s.sendStatuses(c.ctx, out, b); err != nil {
			if errors.Is(err, errWriteTimeout) {
				log.Info("client stopped reading: status stream ended", "timeout", s.opts.WriteTimeout)
			}
			return err
		}
	}
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
