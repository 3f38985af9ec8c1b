package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// Watch implements the Watch RPC: validate, authorize, subscribe, then
// send batches until the client leaves or stops reading, the Source ends,
// a re-check revokes the caller's grant, or the daemon shuts down.
func (s *Server) Watch(req *informerdv1.WatchRequest, stream informerdv1.InformerService_WatchServer) (err error) {
	creq, view, err := validateWatch(req, s.opts.Limits.MaxSelectorBytes)
	if err != nil {
		return s.reject(err)
	}
	c, err := s.begin(stream.Context(), creq.Holder)
	if err != nil {
		return err
	}
	defer func() { err = c.end(err) }()
	sub, err := c.subscribe(creq, req.GetLabelSelector())
	if err != nil {
		return err
	}
	defer sub.Close()
	md := metadata.Pairs(informerdv1.HeaderAccepted, "true")
	switch {
	case sub.Resets() && sub.StartedSource():
		md.Append(informerdv1.HeaderReset, informerdv1.ResetNewInformer)
	case sub.Resets():
		md.Append(informerdv1.HeaderReset, informerdv1.ResetLost)
	}
	if err := stream.SendHeader(md); err != nil {
		return err
	}
	apiVersion, kind := sub.TypeMeta()
	encode := func(e *cache.Event) frame { return encodeEvent(e, view, apiVersion, kind) }
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	log := c.log().With("informer", sub.Key().String())
	log.Debug("stream started", "resume", creq.Resume)
	out := startSender(stream, s.opts.WriteTimeout)
	defer out.close()

	var pending []*cache.Event // fetched but not yet sent: the tail of a batch cut by size
	for {
		if len(pending) == 0 {
			if pending, err = sub.Next(c.ctx, s.opts.MaxBatchEvents); err != nil {
				return err
			}
		}
		// A new slice per batch: gRPC may keep a sent message.
		batch, size := make(frames, 0, 2*len(pending)), 0 // up to 2 buffers per event
		n := 0
		for len(pending) > 0 {
			f := cache.Encoded(pending[0], int(view), encode)
			if n > 0 && size+f.size > s.opts.MaxBatchBytes {
				break
			}
			batch, size, pending, n = append(batch, f.bufs...), size+f.size, pending[1:], n+1
		}
		err = out.send(c.ctx, batch)
		if errors.Is(err, context.Canceled) && errors.Is(context.Cause(c.ctx), errShuttingDown) {
			// What the stream took still goes out when the daemon shuts
			// down (a handoff's Bookmark, the last thing taken, is where
			// the client resumes), within the write timeout, unless the
			// client leaves. Nothing more is taken: Next fails.
			err = out.send(stream.Context(), batch)
		}
		if err != nil {
			if errors.Is(err, errWriteTimeout) {
				log.Info("client stopped reading: stream ended", "timeout", s.opts.WriteTimeout)
			}
			return err
		}
		s.metrics.eventsOut.Add(float64(n))
		s.metrics.bytesOut.Add(float64(size))
	}
}

// sender owns a stream's SendMsg, in a goroutine of its own, so that the
// handler notices a client that stops reading: HTTP/2 flow control then
// blocks SendMsg, and a message not taken within the write timeout ends
// the stream. It holds at most the one message it is sending (a batch of
// frames, or an address answer).
type sender struct {
	stream  grpc.ServerStream
	timeout time.Duration
	batches chan any   // unbuffered: taken when the previous send is done
	failed  chan error // the send error that ended the goroutine
	done    chan struct{}
	stuck   bool // a send timed out
}

func startSender(stream grpc.ServerStream, timeout time.Duration) *sender {
	s := &sender{stream: stream, timeout: timeout, batches: make(chan any), failed: make(chan error, 1), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *sender) loop() {
	defer close(s.done)
	for b := range s.batches {
		if err := s.stream.SendMsg(b); err != nil {
			s.failed <- err
			return
		}
	}
}

// send hands b to the sending goroutine once it has sent the previous
// message. It fails with errWriteTimeout when that takes longer than the
// write timeout, with the error of a failed send, or with ctx's.
func (s *sender) send(ctx context.Context, b any) error {
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case s.batches <- b:
		return nil
	case err := <-s.failed:
		return err
	case <-t.C:
		s.stuck = true
		return errWriteTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close ends the goroutine after its current send, waiting up to the write
// timeout for it (not at all if a send timed out), so that a stream's last
// batch goes out before its status. Returning from the handler ends a
// send still blocked: gRPC cancels the stream.
func (s *sender) close() {
	close(s.batches)
	if s.stuck {
		return
	}
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
	}
}

// encodeEvent encodes e in view as a WatchResponse `events` field. A
// BOOKMARK or SYNCED carries an object of the resource's kind with only its
// resourceVersion, as the API server's bookmarks do. The full view shares
// the object's bytes (and the managedFields it shares) instead of copying
// them.
func encodeEvent(e *cache.Event, view cache.View, apiVersion, kind string) frame {
	var obj [][]byte
	switch {
	case e.Object == nil && (e.Type == cache.Bookmark || e.Type == cache.Synced):
		obj = [][]byte{markerJSON(apiVersion, kind, e.ResourceVersion)}
	case e.Object != nil && view == cache.ViewFull:
		obj = e.Object.Buffers()
	case e.Object != nil:
		b, err := view.Project(e.Object)
		if err != nil {
			// The API server sent these bytes; a projection cannot fail
			// on them. Send the full object rather than nothing.
			obj = e.Object.Buffers()
			break
		}
		obj = [][]byte{b}
	}
	return encodeObjectFrame(eventType(e.Type), obj, e.ResourceVersion)
}

func markerJSON(apiVersion, kind, rv string) []byte {
	b, _ := json.Marshal(map[string]any{ // strings only: cannot fail
		"apiVersion": apiVersion, "kind": kind, "metadata": map[string]string{"resourceVersion": rv},
	})
	return b
}

func eventType(t cache.EventType) informerdv1.EventType {
	switch t {
	case cache.Added:
		return informerdv1.EventType_EVENT_TYPE_ADDED
	case cache.Modified:
		return informerdv1.EventType_EVENT_TYPE_MODIFIED
	case cache.Deleted:
		return informerdv1.EventType_EVENT_TYPE_DELETED
	case cache.Bookmark:
		return informerdv1.EventType_EVENT_TYPE_BOOKMARK
	case cache.Synced:
		return informerdv1.EventType_EVENT_TYPE_SYNCED
	case cache.Reset:
		return informerdv1.EventType_EVENT_TYPE_RESET
	}
	return informerdv1.EventType_EVENT_TYPE_UNSPECIFIED
}

func encodingOf(k cache.Key) informerdv1.Encoding {
	if k.Protobuf {
		return informerdv1.Encoding_ENCODING_PROTOBUF
	}
	return informerdv1.Encoding_ENCODING_JSON
}
