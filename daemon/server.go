// Package daemon serves informerd's gRPC API: it validates requests,
// subscribes them to the cache, and writes each subscription's events to
// its stream as pre-encoded frames. It is the only package that knows both
// gRPC and the cache.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/address"
	"github.com/informerd/informerd/internal/version"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// Secrets are always sensitive.
var secrets = schema.GroupResource{Resource: "secrets"}

// Server implements informerdv1.InformerServiceServer.
type Server struct {
	informerdv1.UnimplementedInformerServiceServer

	opts    Options
	log     *slog.Logger
	metrics *metrics
	streams *callerCounter
	// statusObjects counts the objects of each caller's status streams.
	statusObjects *callerCounter
	conns         *connCounter
	holds         *holdRegistry
	// unary is every caller's share of unary calls, unaryShare its name
	// in refusals; newInformers every caller's rate of new informers.
	unary        *callerBudgets
	unaryShare   string
	unarySeats   *seats
	newInformers *callerBudgets
	// discovery is GetDiscovery's answer.
	discovery discoveryAnswer
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
		streams:       &callerCounter{max: opts.Limits.MaxStreamsPerCaller, open: map[string]int{}},
		statusObjects: &callerCounter{max: opts.Limits.MaxStatusObjectsPerCaller, open: map[string]int{}},
		conns:         &connCounter{max: opts.Limits.MaxConnections, perPeer: opts.Limits.MaxConnectionsPerPeer, byPeer: map[string]int{}},
		holds:         &holdRegistry{holds: map[*hold]struct{}{}},
		unary: newCallerBudgets(opts.Limits.UnaryCallsPerSecond, opts.Limits.UnaryCallBurst,
			opts.Limits.UnaryCallsInFlightPerCaller, opts.Limits.UnaryCallMaxWait),
		unaryShare: fmt.Sprintf("unary calls (-unary-calls-per-second %g, -unary-call-burst %d, -unary-calls-in-flight-per-caller %d)",
			opts.Limits.UnaryCallsPerSecond, opts.Limits.UnaryCallBurst, opts.Limits.UnaryCallsInFlightPerCaller),
		unarySeats:   newSeats(opts.Limits.UnaryCallsInFlight, opts.Limits.UnaryCallsInFlight/4, opts.Limits.UnaryCallMaxWait),
		newInformers: newCallerBudgets(opts.Limits.NewInformersPerMinute/60, opts.Limits.NewInformerBurst, 0, 0),
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
// the daemon's replacement. A Watch stream first sends the events it has
// taken, within the write timeout, and takes no more. Call it after the
// listeners stop accepting and before grpc.Server.GracefulStop, which then
// returns once the streams have sent what they took.
func (s *Server) Shutdown() { s.cancelShutdown() }

// Get implements the Get RPC: one object from the store of the informer
// that serves its resource. The informer lists and watches the resource,
// so the caller must be allowed to, as for Watch.
func (s *Server) Get(ctx context.Context, req *informerdv1.GetRequest) (_ *informerdv1.GetResponse, err error) {
	creq, name, view, err := validateGet(req)
	if err != nil {
		return nil, s.reject(err)
	}
	c, err := s.begin(ctx, creq.Holder)
	if err != nil {
		return nil, err
	}
	defer func() { err = c.end(err) }()
	// While it waits for its informer to sync or reach
	// not_older_than_resource_version, a Get holds a subscription, as a
	// stream does: it counts as one.
	release, err := s.holdStream(c.caller)
	if err != nil {
		return nil, err
	}
	c.releases = append(c.releases, release)
	if err := c.resolve(&creq, ""); err != nil {
		return nil, err
	}
	o, err := s.opts.Cache.Get(c.ctx, creq, name)
	if err != nil {
		return nil, err
	}
	data, err := view.Project(o)
	if err != nil {
		data = o.Bytes() // as encodeEvent: the API server sent these bytes
	}
	return &informerdv1.GetResponse{Object: data}, nil
}

// Version implements the Version RPC: the daemon's build, for any
// authenticated caller.
func (s *Server) Version(context.Context, *informerdv1.VersionRequest) (*informerdv1.VersionResponse, error) {
	return &informerdv1.VersionResponse{Version: version.Version, GoVersion: runtime.Version()}, nil
}
