package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/informerd/informerd/auth"
)

// caller is who made a request, as the interceptors established it.
type caller struct {
	// name identifies the caller for per-caller limits and introspection:
	// the user's name, or the peer in InsecureLocalOnly mode.
	name string
	// user is nil in InsecureLocalOnly mode.
	user *auth.User
	// token is the caller's bearer token, checked again when a stream's
	// grant expires, and until when its authentication holds.
	token string
	until time.Time
	peer  auth.Peer
	// log carries the caller and peer, and the stream's id on a stream:
	// every line a request logs has them.
	log *slog.Logger
}

type callerKey struct{}

// callerOf returns the caller the interceptors attached to ctx, or nil.
func callerOf(ctx context.Context) *caller {
	c, _ := ctx.Value(callerKey{}).(*caller)
	return c
}

// healthCheck is the one method served without a token: kubelet's gRPC
// probes call it. It is unary, so it holds nothing once answered; the
// health service's Watch and List authenticate like any RPC, and a Watch
// holds one of its caller's stream slots.
const healthCheck = "/grpc.health.v1.Health/Check"

// unaryAuth authenticates the caller of a unary RPC, except a health
// Check, spends one of its unary calls (Limits.UnaryCallsPerSecond) for
// it, holding one of its calls in flight, and takes one of the daemon's
// seats (Limits.UnaryCallsInFlight) in the caller's turn, until the call
// returns.
func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod == healthCheck {
		return handler(ctx, req)
	}
	ctx, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	name := callerOf(ctx).name
	done, err := s.unary.admit(ctx, name, s.unaryShare)
	if err == nil {
		defer done()
		done, err = s.unarySeats.acquire(ctx, name, "unary calls")
	}
	if err != nil {
		if _, ok := retryDelay(err); ok {
			s.metrics.unaryRefused.WithLabelValues(path.Base(info.FullMethod)).Inc()
		}
		return nil, s.reject(err)
	}
	defer done()
	return handler(ctx, req)
}

// streamAuth authenticates the caller of a streaming RPC and holds one of
// its MaxStreamsPerCaller slots while the stream runs.
func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := s.authenticate(ss.Context())
	if err != nil {
		return err
	}
	c := callerOf(ctx)
	release, err := s.holdStream(c)
	if err != nil {
		return s.reject(err)
	}
	defer release()
	c.log = c.log.With("stream", s.streamIDs.Add(1))
	return handler(srv, &callerStream{ServerStream: ss, ctx: ctx})
}

// holdStream holds one of c's MaxStreamsPerCaller slots, for a stream or
// for a Get (which holds a subscription while it waits for its informer),
// and returns the func that gives it back.
func (s *Server) holdStream(c *caller) (func(), error) {
	if !s.streams.acquire(c.name, 1) {
		s.metrics.limited.WithLabelValues("streams_per_caller").Inc()
		return nil, fmt.Errorf("%w: %s has %d streams and Gets open, the limit per caller (max-streams-per-caller): close some first",
			errLimit, c.name, s.opts.Limits.MaxStreamsPerCaller)
	}
	return func() { s.streams.release(c.name, 1) }, nil
}

// callerStream is a ServerStream whose context carries the caller.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *callerStream) Context() context.Context { return s.ctx }

// authenticate establishes the caller of ctx: its peer from the transport
// and, unless InsecureLocalOnly, its user from its bearer token. On
// success the call's connection counts as authenticated (see Listen).
func (s *Server) authenticate(ctx context.Context) (context.Context, error) {
	p := peerOf(ctx)
	if len(s.opts.AllowedUIDs) > 0 && p.Network == "unix" && (!p.Cred || !slices.Contains(s.opts.AllowedUIDs, p.UID)) {
		return nil, s.reject(fmt.Errorf("%w: the socket admits only uids %v (allowed-uids); this caller is %s", auth.ErrDenied, s.opts.AllowedUIDs, p))
	}
	if s.opts.InsecureLocalOnly {
		s.conns.authenticated(ctx)
		return context.WithValue(ctx, callerKey{}, &caller{name: p.Key(), peer: p, log: s.callerLog(p.Key(), p)}), nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get("authorization")
	user, until, err := s.opts.Authenticator.Authenticate(ctx, values, p.Key())
	if err != nil {
		return nil, s.reject(err)
	}
	s.conns.authenticated(ctx)
	token, _ := auth.ParseBearer(values) // Authenticate accepted it
	return context.WithValue(ctx, callerKey{}, &caller{name: user.Name, user: user, token: token, until: until, peer: p, log: s.callerLog(user.Name, p)}), nil
}

// callerLog returns the logger of a caller's requests.
func (s *Server) callerLog(name string, p auth.Peer) *slog.Logger {
	return s.log.With("caller", name, "peer", p.String())
}

// reject maps err for a request refused before its handler ran, and
// counts it.
func (s *Server) reject(err error) error {
	st := toStatus(err)
	s.metrics.requestErrors.WithLabelValues(status.Code(st).String()).Inc()
	return st
}

// peerOf returns what the transport knows of the caller.
func peerOf(ctx context.Context) auth.Peer {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(peerAddr); ok {
			return a.peer
		}
		if p.Addr != nil {
			return auth.Peer{Network: p.Addr.Network()}
		}
	}
	return auth.Peer{Network: "unknown"}
}

// callerCounter counts what each caller holds (its open streams, the
// objects of its status streams) against a limit.
type callerCounter struct {
	max int

	mu   sync.Mutex // guards open
	open map[string]int
}

// acquire adds n to name's count unless that would exceed the limit.
func (c *callerCounter) acquire(name string, n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[name]+n > c.max {
		return false
	}
	c.open[name] += n
	return true
}

// release takes back n of what acquire added.
func (c *callerCounter) release(name string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[name] -= n; c.open[name] <= 0 {
		delete(c.open, name)
	}
}
