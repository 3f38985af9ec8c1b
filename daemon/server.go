// Package daemon serves informerd's gRPC API: it validates requests,
// subscribes them to the cache, and writes each subscription's events to
// its stream as pre-encoded frames. It is the only package that knows both
// gRPC and the cache.
package daemon

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/address"
	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/version"
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
	// Authenticator verifies each caller's bearer token. Required unless
	// InsecureLocalOnly.
	Authenticator *auth.Authenticator
	// Authorizer checks each resource a request reads, as its caller.
	// Required unless InsecureLocalOnly.
	Authorizer *auth.Authorizer
	// InsecureLocalOnly serves every caller without a token, with the
	// daemon's own permissions: for development on a Unix socket only its
	// own user can open. Never the default; cmd/informerd refuses it with
	// a TCP listener.
	InsecureLocalOnly bool
	// AllowedUIDs, if not empty, admits only Unix socket callers whose
	// uid (SO_PEERCRED) is in it, in addition to their token. TCP callers
	// are not affected.
	AllowedUIDs []uint32
	// Sensitive resources are refused unless also in ServeSensitive; the
	// caller's RBAC still applies to those. Secrets are always sensitive.
	Sensitive, ServeSensitive []schema.GroupResource
	// TLS, if set, serves TCP connections with TLS. Unix socket
	// connections are never TLS.
	TLS *tls.Config
	// Limits bound what callers and connections may use.
	Limits Limits
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

// Limits bound what one caller or connection may use; exceeding one gets
// RESOURCE_EXHAUSTED naming it (connections beyond a limit are closed).
// Zero values take the documented defaults.
type Limits struct {
	// MaxStreamsPerCaller bounds the open streams of one caller (a user),
	// on all its connections. Default 512.
	MaxStreamsPerCaller int
	// MaxRequestBytes bounds a request message. Default 64 KiB.
	MaxRequestBytes int
	// MaxSelectorBytes bounds each selector of a request. Default 4 KiB.
	MaxSelectorBytes int
	// MaxHeaderBytes bounds a request's metadata, its token included.
	// Default 16 KiB.
	MaxHeaderBytes int
	// MaxStreamsPerConnection bounds the concurrent streams of one HTTP/2
	// connection; more wait for a free one. Default 256.
	MaxStreamsPerConnection int
	// MaxConnections bounds the open connections of all peers, and
	// MaxConnectionsPerPeer those of one peer (auth.Peer.Key: a uid on the
	// Unix socket; over TCP every loopback address together, an IPv6 /64,
	// an IPv4 address). Defaults 2048 and 512.
	MaxConnections, MaxConnectionsPerPeer int
	// MaxUnauthenticatedConnections bounds, of all peers, the connections
	// on which no call has passed authentication yet (a token-less health
	// Check does not): their share of MaxConnections. When it, or
	// MaxConnections, is reached, a new connection displaces the oldest
	// unauthenticated connection of the peer that has the most (the new
	// one counted). Default MaxConnections/4.
	MaxUnauthenticatedConnections int
	// ConnectionTimeout bounds a new connection's handshake (TLS, the
	// HTTP/2 preface and settings) and the time until a call on it passes
	// authentication: a connection that has made none by then is closed.
	// Default 10s.
	ConnectionTimeout time.Duration
	// MaxConnectionIdle closes a connection that has had no stream for
	// this long (with a GOAWAY: clients reconnect when they need to).
	// Default 5m.
	MaxConnectionIdle time.Duration
	// KeepaliveMinTime is the shortest interval at which a client may
	// ping; a client that pings more often is disconnected. Default 20s.
	KeepaliveMinTime time.Duration
}

func (l *Limits) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxStreamsPerCaller, 512)
	def(&l.MaxRequestBytes, 64<<10)
	def(&l.MaxSelectorBytes, 4<<10)
	def(&l.MaxHeaderBytes, 16<<10)
	def(&l.MaxStreamsPerConnection, 256)
	def(&l.MaxConnections, 2048)
	def(&l.MaxConnectionsPerPeer, 512)
	def(&l.MaxUnauthenticatedConnections, max(1, l.MaxConnections/4))
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur(&l.ConnectionTimeout, 10*time.Second)
	defDur(&l.MaxConnectionIdle, 5*time.Minute)
	defDur(&l.KeepaliveMinTime, 20*time.Second)
}

// Secrets are always sensitive.
var secrets = schema.GroupResource{Resource: "secrets"}

// Server implements informerdv1.InformerServiceServer.
type Server struct {
	informerdv1.UnimplementedInformerServiceServer

	opts    Options
	log     *slog.Logger
	metrics *metrics
	streams *streamCounter
	conns   *connCounter
	holds   *holdRegistry
	// shutdown ends every stream when cancelled.
	shutdown       context.Context
	cancelShutdown context.CancelFunc
	// addresses answers WatchAddress; addressReads are what it reads.
	addresses    *address.Tracker
	addressReads []access
	// streamIDs numbers the streams, for their log lines.
	streamIDs atomic.Uint64
}

var _ informerdv1.InformerServiceServer = (*Server)(nil)

// New returns a Server. Serve it on a grpc.Server created with its
// ServerOptions, on listeners wrapped by its Listen.
func New(opts Options) (*Server, error) {
	if opts.Cache == nil {
		return nil, errors.New("daemon: Options.Cache is required")
	}
	if !opts.InsecureLocalOnly && (opts.Authenticator == nil || opts.Authorizer == nil) {
		return nil, errors.New("daemon: Options.Authenticator and Options.Authorizer are required (or InsecureLocalOnly, for development)")
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
	opts.Limits.setDefaults()
	if !slices.Contains(opts.Sensitive, secrets) {
		opts.Sensitive = append(slices.Clone(opts.Sensitive), secrets)
	}
	s := &Server{
		opts: opts, log: opts.Logger, metrics: newMetrics(opts.Registerer),
		streams: &streamCounter{max: opts.Limits.MaxStreamsPerCaller, open: map[string]int{}},
		conns:   &connCounter{max: opts.Limits.MaxConnections, perPeer: opts.Limits.MaxConnectionsPerPeer, byPeer: map[string]int{}},
		holds:   &holdRegistry{holds: map[*hold]struct{}{}},
	}
	var err error
	if s.addresses, s.addressReads, err = newAddresses(opts); err != nil {
		return nil, err
	}
	s.shutdown, s.cancelShutdown = context.WithCancel(context.Background())
	return s, nil
}

// ServerOptions returns the grpc.ServerOptions a grpc.Server serving s
// needs: its codec (which writes pre-encoded frames without copying them),
// the interceptors that authenticate every caller, the transport
// credentials (TLS over TCP when configured) and the limits.
func (s *Server) ServerOptions() []grpc.ServerOption {
	l := s.opts.Limits
	var creds transportCreds
	if s.opts.TLS != nil {
		creds.tls = credentials.NewTLS(s.opts.TLS)
	}
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(newCodec()),
		grpc.Creds(creds),
		grpc.ChainUnaryInterceptor(s.unaryAuth),
		grpc.ChainStreamInterceptor(s.streamAuth),
		grpc.MaxRecvMsgSize(l.MaxRequestBytes),
		grpc.MaxHeaderListSize(uint32(l.MaxHeaderBytes)),
		grpc.MaxConcurrentStreams(uint32(l.MaxStreamsPerConnection)),
		grpc.ConnectionTimeout(l.ConnectionTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepaliveMinTime}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.MaxConnectionIdle, Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		// gRPC keeps a 32 KiB read buffer per connection (its write
		// buffers come from a pool only while it flushes), most of an idle
		// client's cost to the daemon. Clients send little (requests,
		// window updates, pings): a small read buffer does.
		grpc.ReadBufferSize(connReadBuffer),
	}
}

// connReadBuffer is the read buffer of a connection: see ServerOptions.
const connReadBuffer = 4 << 10

// Shutdown ends every stream with UNAVAILABLE, so that clients reconnect to
// the daemon's replacement. Call it after the listeners stop accepting and
// before grpc.Server.GracefulStop, which then returns promptly.
func (s *Server) Shutdown() { s.cancelShutdown() }

// Watch implements the Watch RPC: validate, authorize, subscribe, then
// send batches until the client leaves or stops reading, the Source ends,
// a re-check denies the caller, or the daemon shuts down.
func (s *Server) Watch(req *informerdv1.WatchRequest, stream informerdv1.InformerService_WatchServer) error {
	creq, view, err := validateWatch(req, s.opts.Limits.MaxSelectorBytes)
	if err != nil {
		return s.reject(err)
	}
	ctx, cancel := s.requestContext(stream.Context())
	defer cancel()
	c := callerOf(ctx)
	if ctx, err = s.authorizeRequest(ctx, &creq, req.GetLabelSelector()); err != nil {
		return s.endStream(ctx, err)
	}
	sub, err := s.opts.Cache.Subscribe(ctx, creq)
	if err != nil {
		return s.endStream(ctx, err)
	}
	defer sub.Close()
	if sub.Key().GVR.GroupResource() != creq.GVR.GroupResource() { // discovery changed in between
		return s.endStream(ctx, fmt.Errorf("%w: %s now names %s: retry", cache.ErrNotSynced, creq.GVR.GroupResource(), sub.Key().GVR.GroupResource()))
	}
	defer s.holds.add(&hold{caller: c, client: creq.Holder, key: sub.Key()})()
	apiVersion, kind := sub.TypeMeta()
	encode := func(e *cache.Event) frame { return encodeEvent(e, view, apiVersion, kind) }
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	log := c.log.With("client", creq.Holder, "informer", sub.Key().String())
	log.Debug("stream started", "resume", creq.Resume)
	out := startSender(stream, s.opts.WriteTimeout)
	defer out.close()

	var pending []*cache.Event // fetched but not yet sent: the tail of a batch cut by size
	for {
		if len(pending) == 0 {
			if pending, err = sub.Next(ctx, s.opts.MaxBatchEvents); err != nil {
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

// requestContext returns the context of a request's work: ended when the
// client leaves, when cancel is called, or when the daemon shuts down.
func (s *Server) requestContext(client context.Context) (ctx context.Context, cancel func()) {
	ctx, cancelCtx := context.WithCancel(client)
	stop := context.AfterFunc(s.shutdown, cancelCtx)
	return ctx, func() { stop(); cancelCtx() }
}

// authorizeRequest resolves the resource creq names to its canonical name
// (so that what is authorized is what the cache will read), sets creq to
// it and to the caller as its owner, and authorizes the caller for it;
// see authorize.
func (s *Server) authorizeRequest(ctx context.Context, creq *cache.Request, labelSelector string) (context.Context, error) {
	gvr, namespaced, err := s.opts.Cache.ResolveResource(ctx, *creq)
	if err != nil {
		return ctx, err
	}
	if !namespaced {
		creq.Namespace = "" // a cluster-scoped resource has none: ignored, as kubectl does
	}
	creq.GVR, creq.Kind, creq.Owner = gvr, "", callerOf(ctx).name
	return s.authorize(ctx, access{GVR: gvr, Namespace: creq.Namespace, LabelSelector: labelSelector, FieldSelector: creq.FieldSelector})
}

// endStream maps the error that ended a stream (or a unary request),
// telling a shutdown apart from the client leaving and from a re-check's
// verdict, and logs it with the caller (at debug level).
func (s *Server) endStream(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); !errors.Is(cause, ctx.Err()) {
			err = cause // a re-check's verdict
		} else if s.shutdown.Err() != nil {
			err = errShuttingDown
		}
	}
	st := toStatus(err)
	s.metrics.requestErrors.WithLabelValues(status.Code(st).String()).Inc()
	if c := callerOf(ctx); c != nil {
		c.log.Debug("request ended", "code", status.Code(st).String(), "err", status.Convert(st).Message())
	}
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
// that serves its resource. The informer lists and watches the resource,
// so the caller must be allowed to, as for Watch.
func (s *Server) Get(ctx context.Context, req *informerdv1.GetRequest) (*informerdv1.GetResponse, error) {
	creq, name, view, err := validateGet(req)
	if err != nil {
		return nil, s.reject(err)
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	if ctx, err = s.authorizeRequest(ctx, &creq, ""); err != nil {
		return nil, s.endStream(ctx, err)
	}
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

// Version implements the Version RPC: the daemon's build, for any
// authenticated caller.
func (s *Server) Version(context.Context, *informerdv1.VersionRequest) (*informerdv1.VersionResponse, error) {
	return &informerdv1.VersionResponse{Version: version.Version, GoVersion: runtime.Version()}, nil
}

// introspectPath is the non-resource URL a caller must be allowed to get
// to see every informer and stream; others see their own.
const introspectPath = "/informerd/informers"

// ListInformers implements the introspection RPC. A caller allowed get on
// introspectPath (or any caller in InsecureLocalOnly mode) sees every
// informer and every stream; another sees only the informers its own
// streams hold, with only its own streams, and without the counts
// (objects, lag) that describe what others read.
func (s *Server) ListInformers(ctx context.Context, _ *informerdv1.ListInformersRequest) (*informerdv1.ListInformersResponse, error) {
	c := callerOf(ctx)
	all := c.user == nil
	if !all {
		_, err := s.opts.Authorizer.Authorize(ctx, c.user, auth.Attributes{Verb: "get", Path: introspectPath})
		if err != nil && !errors.Is(err, auth.ErrDenied) {
			return nil, toStatus(err)
		}
		all = err == nil
	}
	holds := s.holds.byKey(func(h *hold) bool { return all || h.caller.name == c.name })
	infos := s.opts.Cache.Sources()
	resp := &informerdv1.ListInformersResponse{Informers: make([]*informerdv1.Informer, 0, len(infos))}
	for _, in := range infos {
		mine := holds[in.Key]
		if !all && len(mine) == 0 {
			continue
		}
		inf := &informerdv1.Informer{
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
			EventsIn:        in.EventsIn,
		}
		if !all {
			inf.Holders, inf.RefCount, inf.Objects, inf.MaxLagEvents, inf.EventsIn = nil, int32(len(mine)), 0, 0, 0
			for _, h := range mine {
				inf.Holders = append(inf.Holders, h.client)
			}
			slices.Sort(inf.Holders)
		}
		for _, h := range mine {
			inf.Subscribers = append(inf.Subscribers, &informerdv1.Subscriber{ClientName: h.client, User: h.caller.name, Peer: h.caller.peer.String()})
		}
		resp.Informers = append(resp.Informers, inf)
	}
	return resp, nil
}

// hold is one open stream on an informer, for introspection.
type hold struct {
	caller *caller
	client string
	key    cache.Key
}

// holdRegistry is the open streams.
type holdRegistry struct {
	mu    sync.Mutex // guards holds
	holds map[*hold]struct{}
}

// add registers h and returns the func that removes it.
func (r *holdRegistry) add(h *hold) func() {
	r.mu.Lock()
	r.holds[h] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.holds, h)
		r.mu.Unlock()
	}
}

// byKey returns the holds that keep admits, by informer, sorted by client
// and caller.
func (r *holdRegistry) byKey(keep func(*hold) bool) map[cache.Key][]*hold {
	out := map[cache.Key][]*hold{}
	r.mu.Lock()
	for h := range r.holds {
		if keep(h) {
			out[h.key] = append(out[h.key], h)
		}
	}
	r.mu.Unlock()
	for _, hs := range out {
		slices.SortFunc(hs, func(a, b *hold) int {
			return cmp.Or(strings.Compare(a.client, b.client), strings.Compare(a.caller.name, b.caller.name))
		})
	}
	return out
}
