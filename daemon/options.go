package daemon

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/address"
	"github.com/informerd/informerd/auth"
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
	// MaxRequestBytes bounds a request message, of every method.
	// WatchStatusChunked takes a larger WatchStatus request in several
	// messages. Default 64 KiB.
	MaxRequestBytes int
	// MaxStatusObjectsPerCaller bounds the objects of all the open status
	// streams of one caller, counted as their requests arrive, so that a
	// caller cannot make the daemon hold more than this many objects'
	// worth of status state (about 1 KiB each), whatever its number of
	// streams. It is at least one request's limit (20,000 objects).
	// Default 100,000.
	MaxStatusObjectsPerCaller int
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
	// UnaryCallsPerSecond and UnaryCallBurst are the token bucket of each
	// caller's unary calls (Get, GetDiscovery, ListInformers, Version, the
	// health service's List; not the health Check), and
	// UnaryCallsInFlightPerCaller bounds those it has in flight, waiting
	// for a token included. A call whose token comes within UnaryCallMaxWait
	// waits for it; later, or beyond the calls in flight, it gets
	// RESOURCE_EXHAUSTED with the retry delay in its details
	// (errdetails.RetryInfo), which the client library waits before it
	// retries. Defaults 100/s, 200, 64 and 500ms.
	UnaryCallsPerSecond         float64
	UnaryCallBurst              int
	UnaryCallsInFlightPerCaller int
	UnaryCallMaxWait            time.Duration
	// UnaryCallsInFlight bounds the unary calls the daemon runs at once,
	// of all callers (seats.go): one caller holds at most a quarter of
	// them, and a call that finds none free to it waits in its caller's
	// queue, served in turn with the other callers' (round robin), up to
	// UnaryCallMaxWait, then gets RESOURCE_EXHAUSTED with a retry delay.
	// Default 32.
	UnaryCallsInFlight int
	// NewInformersPerMinute and NewInformerBurst are the token bucket of
	// the informers each caller's requests start (a request served by an
	// informer that runs, lingering or not, costs none): a request that
	// would start one beyond it gets RESOURCE_EXHAUSTED with the retry
	// delay, before anything is started or stopped for it, so that no
	// other caller's lingering informer is evicted for a caller over its
	// rate. Defaults 60 and 32.
	NewInformersPerMinute float64
	NewInformerBurst      int
}

func (l *Limits) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxStreamsPerCaller, 512)
	def(&l.MaxRequestBytes, 64<<10)
	def(&l.MaxStatusObjectsPerCaller, 5*informerdv1.MaxStatusObjects)
	l.MaxStatusObjectsPerCaller = max(l.MaxStatusObjectsPerCaller, informerdv1.MaxStatusObjects)
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
	defDur(&l.UnaryCallMaxWait, 500*time.Millisecond)
	def(&l.UnaryCallBurst, 200)
	def(&l.UnaryCallsInFlightPerCaller, 64)
	def(&l.UnaryCallsInFlight, 32)
	def(&l.NewInformerBurst, 32)
	if l.UnaryCallsPerSecond <= 0 {
		l.UnaryCallsPerSecond = 100
	}
	if l.NewInformersPerMinute <= 0 {
		l.NewInformersPerMinute = 60
	}
}
