// Package daemon serves informerd's gRPC API: it validates requests,
// subscribes them to the cache, and writes each subscription's events to
// its stream as pre-encoded frames. It is the only package that knows both
// gRPC and the cache.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/informerd/informerd/address"
	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	statusengine "github.com/informerd/informerd/status"
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	// Cache serves the subscriptions. Required.
	Cache *cache.Manager
	// Status serves WatchStatus. Default: none (WatchStatus answers
	// UNIMPLEMENTED). The caller closes it after the streams end.
	Status *statusengine.Engine
	// MaxBatchEvents bounds the events in one WatchResponse or
	// WatchStatusResponse. Default 256.
	MaxBatchEvents int
	// MaxBatchBytes bounds the encoded size of one WatchResponse, except
	// that a single larger event is sent alone. Default 1 MiB.
	MaxBatchBytes int
	// WriteTimeout ends a stream whose client has not read a batch for
	// this long (HTTP/2 flow control stops the daemon's writes), with
	// UNAVAILABLE: a live client resumes where it was, and a stuck one
	// holds nothing of the daemon's beyond it. Default 1m.
	WriteTimeout time.Duration
	// AddressRelated are the related kinds whose objects WatchAddress
	// answers list. Default none.
	AddressRelated []address.RelatedKind
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics. Default: none are registered.
	Registerer prometheus.Registerer
}

// Server implements informerdv1.InformerServiceServer.
type Server struct {
	informerdv1.UnimplementedInformerServiceServer

	opts    Options
	log     *slog.Logger
	metrics *metrics
	// shutdown ends every stream when cancelled.
	shutdown       context.Context
	cancelShutdown context.CancelFunc
	// addresses answers WatchAddress; addressReads are what it reads.
	addresses    *address.Tracker
	addressReads []access
}

var _ informerdv1.InformerServiceServer = (*Server)(nil)

// New returns a Server. Register it on a grpc.Server created with
// ServerOptions.
func New(opts Options) (*Server, error) {
	if opts.Cache == nil {
		return nil, errors.New("daemon: Options.Cache is required")
	}
	if opts.MaxBatchEvents <= 0 {
		opts.MaxBatchEvents = 256
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = 1 << 20
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: newMetrics(opts.Registerer)}
	var err error
	if s.addresses, s.addressReads, err = newAddresses(opts); err != nil {
		return nil, err
	}
	s.shutdown, s.cancelShutdown = context.WithCancel(context.Background())
	return s, nil
}

// ServerOptions returns the grpc.ServerOptions the Server needs: its codec,
// which writes pre-encoded frames without copying them.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(newCodec())}
}

// Shutdown ends every stream with UNAVAILABLE, so that clients reconnect to
// the daemon's replacement. Call it after the listeners stop accepting and
// before grpc.Server.GracefulStop, which then returns promptly.
func (s *Server) Shutdown() { s.cancelShutdown() }

// Watch implements the Watch RPC: validate, subscribe, then send batches
// until the client leaves or stops reading, the Source ends, or the
// daemon shuts down.
func (s *Server) Watch(req *informerdv1.WatchRequest, stream informerdv1.InformerService_WatchServer) error {
	creq, view, err := validateWatch(req)
	if err != nil {
		return s.badRequest(err)
	}
	ctx, cancel := s.requestContext(stream.Context())
	defer cancel()

	sub, err := s.opts.Cache.Subscribe(ctx, creq)
	if err != nil {
		return s.endStream(ctx, err)
	}
	defer sub.Close()
	apiVersion, kind := sub.TypeMeta()
	encode := func(e *cache.Event) frame { return encodeEvent(e, view, apiVersion, kind) }
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	log := s.log.With("client", creq.Holder, "informer", sub.Key().String())
	log.Debug("stream started", "resume", creq.Resume)
	out := startSender(stream, s.opts.WriteTimeout)
	defer out.close()

	var pending []*cache.Event // fetched but not yet sent: the tail of a batch cut by size
	for {
		if len(pending) == 0 {
			if pending, err = sub.Next(ctx, s.opts.MaxBatchEvents); err != nil {
				log.Debug("stream ended", "err", err)
				return s.endStream(ctx, err)
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
		if err := out.send(ctx, batch); err != nil {
			if errors.Is(err, errWriteTimeout) {
				log.Info("client stopped reading: stream ended", "timeout", s.opts.WriteTimeout)
			}
			return s.endStream(ctx, err)
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

// badRequest counts and returns a request's INVALID_ARGUMENT status.
func (s *Server) badRequest(err error) error {
	s.metrics.requestErrors.WithLabelValues(codes.InvalidArgument.String()).Inc()
	return err
}

// requestContext returns the context of a request's work: ended when the
// client leaves, when cancel is called, or when the daemon shuts down.
func (s *Server) requestContext(client context.Context) (ctx context.Context, cancel func()) {
	ctx, cancelCtx := context.WithCancel(client)
	stop := context.AfterFunc(s.shutdown, cancelCtx)
	return ctx, func() { stop(); cancelCtx() }
}

// endStream maps the error that ended a stream, telling a shutdown apart
// from the client leaving.
func (s *Server) endStream(ctx context.Context, err error) error {
	if ctx.Err() != nil && s.shutdown.Err() != nil {
		err = errShuttingDown
	}
	st := toStatus(err)
	s.metrics.requestErrors.WithLabelValues(status.Code(st).String()).Inc()
	return st
}

// encodeEvent encodes e in view as a WatchResponse `events` field. A
// BOOKMARK or SYNCED carries an object of the resource's kind with only its
// resourceVersion, as the API server's bookmarks do. The full view shares
// the object's bytes instead of copying them.
func encodeEvent(e *cache.Event, view cache.View, apiVersion, kind string) frame {
	var obj []byte
	switch {
	case e.Object == nil && (e.Type == cache.Bookmark || e.Type == cache.Synced):
		obj = markerJSON(apiVersion, kind, e.ResourceVersion)
	case e.Object != nil:
		var err error
		if obj, err = view.Project(e.Object); err != nil {
			// The API server sent these bytes; a projection cannot fail
			// on them. Send the full object rather than nothing.
			obj = e.Object.Data
		}
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

// Get implements the Get RPC: one object from the store of the informer
// that serves its resource.
func (s *Server) Get(ctx context.Context, req *informerdv1.GetRequest) (*informerdv1.GetResponse, error) {
	creq, name, view, err := validateGet(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	o, err := s.opts.Cache.Get(ctx, creq, name)
	if err != nil {
		return nil, s.endStream(ctx, err)
	}
	data, err := view.Project(o)
	if err != nil {
		data = o.Data // as encodeEvent: the API server sent these bytes
	}
	return &informerdv1.GetResponse{Object: data}, nil
}

// ListInformers implements the introspection RPC.
func (s *Server) ListInformers(context.Context, *informerdv1.ListInformersRequest) (*informerdv1.ListInformersResponse, error) {
	infos := s.opts.Cache.Sources()
	resp := &informerdv1.ListInformersResponse{Informers: make([]*informerdv1.Informer, 0, len(infos))}
	for _, in := range infos {
		resp.Informers = append(resp.Informers, &informerdv1.Informer{
			Resource: &informerdv1.GroupVersionResource{
				Group: in.Key.GVR.Group, Version: in.Key.GVR.Version, Resource: in.Key.GVR.Resource,
			},
			Namespace:       in.Key.Namespace,
			FieldSelector:   in.Key.FieldSelector,
			State:           string(in.State),
			Lingering:       in.RefCount == 0,
			Holders:         in.Holders,
			RefCount:        int32(in.RefCount),
			Objects:         int64(in.Objects),
			ResourceVersion: in.ResourceVersion,
			MaxLagEvents:    int64(in.MaxLagEvents),
			Message:         in.Message,
			Encoding:        encodingOf(in.Key),
		})
	}
	return resp, nil
}
