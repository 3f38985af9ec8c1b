// Package client is informerd's client library: Dial a node's daemon (with
// the caller's projected ServiceAccount token, see DefaultTokenFile), then
// run a Watcher (automatic reconnect and resume, a local store), or adopt it
// in one line through the client-go adapters: NewListerWatcher for
// informers, NewDynamicClient for dynamicinformer and cli-utils.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// DefaultSocket is where the daemon listens by default.
const DefaultSocket = "/var/run/informerd/informerd.sock"

// Client is a connection to one informerd daemon. It is safe for
// concurrent use.
type Client struct {
	conn   *grpc.ClientConn
	api    informerdv1.InformerServiceClient
	socket string // the Unix socket's path, if the target is one
	// accepts reports whether the daemon accepts connections, for a local
	// daemon; nil: not known.
	accepts func() bool
	// resumes keeps what the client-go adapters' Lists and watches
	// delivered, for the watches resuming from them.
	resumes resumes
}

// reconnect is how gRPC re-makes the connection after the daemon went
// away: at most a second apart (its default backoff grows to 2 minutes).
// A client waiting for a local daemon does not wait for it: see
// awaitDaemon.
var reconnect = grpc.ConnectParams{
	Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// unreachablePace is how often a client waiting for an unreachable daemon
// looks at its socket, and the least time between a stream that failed
// because the daemon was unreachable and the next attempt: a daemon that
// accepts connections and drops them cannot make a client spin.
const unreachablePace = 250 * time.Millisecond

// Dial connects to the daemon at target: a Unix socket path ("/run/x.sock"
// or "unix:///run/x.sock") or a "host:port". The connection is made lazily
// and re-made as needed: by the Watchers and adapters, within 250 ms of a
// local daemon (a Unix socket or loopback) accepting again, else within
// about a second; opts are appended to the defaults.
//
// A unary call the daemon refuses for its caller's share (RESOURCE_EXHAUSTED
// with a retry delay) is made again after that delay, within its context.
//
// Every call carries the caller's token: from WithTokenFile or WithToken,
// else from DefaultTokenFile when it exists. A host that is not loopback
// is reached only WithTLS, so that the token never crosses the network in
// the clear.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	if strings.HasPrefix(target, "/") {
		target = "unix://" + target
	}
	var hasToken, hasTLS bool
	for _, o := range opts {
		switch o := o.(type) {
		case tokenOption:
			hasToken = true
		case tlsOption:
			if o.err != nil {
				return nil, fmt.Errorf("informerd client: %w", o.err)
			}
			hasTLS = true
		}
	}
	if !hasTLS && !local(target) {
		return nil, fmt.Errorf("informerd client: %s is neither a Unix socket nor loopback: dial it WithTLS, the token is not sent in the clear", target)
	}
	defaults := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(informerdv1.MaxMessageBytes)),
		grpc.WithConnectParams(reconnect),
		grpc.WithChainUnaryInterceptor(retryShares),
	}
	if !hasTLS {
		defaults = append(defaults, grpc.WithTransportCredentials(insecure.NewCredentials())) // Unix socket or loopback
	}
	if !hasToken {
		defaults = append(defaults, grpc.WithPerRPCCredentials(&tokenFile{path: DefaultTokenFile, optional: true}))
	}
	conn, err := grpc.NewClient(target, append(defaults, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("informerd client: dialing %s: %w", target, err)
	}
	c := &Client{conn: conn, api: informerdv1.NewInformerServiceClient(conn)}
	if path, ok := strings.CutPrefix(target, "unix://"); ok {
		c.socket = path
		c.accepts = func() bool { return dials("unix", path) }
	} else if addr := strings.TrimPrefix(target, "dns:///"); local(target) {
		c.accepts = func() bool { return dials("tcp", addr) }
	}
	return c, nil
}

// ErrSocketPermission: the caller may not open the daemon's Unix socket.
// Retrying cannot help: Watchers stop with it.
var ErrSocketPermission = errors.New("permission denied on informerd's socket")

// explain returns err with what is wrong with the daemon's Unix socket
// when that is why the daemon is unreachable: a socket the caller may not
// open wraps ErrSocketPermission; a missing one, or one nothing serves, is
// named, so that retries are not silent about it.
func (c *Client) explain(err error) error {
	if c.socket == "" || status.Code(err) != codes.Unavailable {
		return err
	}
	conn, derr := net.DialTimeout("unix", c.socket, time.Second)
	switch {
	case derr == nil:
		conn.Close()
		return err
	case errors.Is(derr, fs.ErrPermission):
		return fmt.Errorf("%w %s: run as a user or group that may write to it (%w)", ErrSocketPermission, c.socket, derr)
	case errors.Is(derr, fs.ErrNotExist):
		return fmt.Errorf("informerd's socket %s does not exist: is informerd running on this node, and is its directory mounted here? (%w)", c.socket, err)
	case errors.Is(derr, syscall.ECONNREFUSED):
		return fmt.Errorf("nothing serves on informerd's socket %s: the daemon is restarting or down (%w)", c.socket, err)
	}
	return err
}

// unreachable reports whether err, a failed stream's, says the daemon
// could not be reached (rather than being an error the daemon returned):
// UNAVAILABLE while the connection is not READY. Call it right after the
// failure.
func (c *Client) unreachable(err error) bool {
	return status.Code(err) == codes.Unavailable && c.conn.GetState() != connectivity.Ready
}

// awaitDaemon waits, after a stream failed because the daemon was
// unreachable, until the connection is READY again, but at least
// unreachablePace and at most `most` (then the caller tries, and reports,
// again); it returns ctx.Err() if ctx ends first. Every unreachablePace it
// looks at the connection and, for a local daemon, tries the socket itself
// (a refused connect on the local host costs microseconds, gRPC's
// reconnect a thousand times more); once the socket accepts it has gRPC
// connect at once rather than after its reconnect backoff, whose failure
// would be a stale "connection refused" (once: if no connection comes of
// it, gRPC's backoff paces the next attempts). Waiting on the connection rather
// than on a growing timer is what brings a client back as soon as the
// daemon serves, whatever the length of the outage.
func (c *Client) awaitDaemon(ctx context.Context, most time.Duration) error {
	tick := time.NewTicker(unreachablePace)
	defer tick.Stop()
	probe := c.accepts != nil
	// It gives up only just after a look, never between two: the caller's
	// next try on a connection gRPC still holds in TRANSIENT_FAILURE fails
	// at once, and the look after it is again a pace away, not two.
	for looks := max(1, int(most/unreachablePace)); ; looks-- {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if s := c.conn.GetState(); s == connectivity.Ready || s == connectivity.Shutdown {
			return nil
		}
		if probe && c.accepts() {
			c.conn.ResetConnectBackoff()
			c.conn.Connect()
			if c.ready(ctx, unreachablePace) {
				return nil
			}
			// The socket accepts but no connection comes of it (a daemon
			// dropping them): gRPC's own backoff paces the next ones.
			probe = false
		}
		if looks <= 1 {
			return nil
		}
	}
}

// ready waits up to d for the connection to be READY, and reports whether
// it is.
func (c *Client) ready(ctx context.Context, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	s := c.conn.GetState()
	for s != connectivity.Ready && s != connectivity.Shutdown && c.conn.WaitForStateChange(ctx, s) {
		s = c.conn.GetState()
	}
	return s == connectivity.Ready
}

// dials reports whether a connection to address can be made at once.
func dials(network, address string) bool {
	conn, err := net.DialTimeout(network, address, unreachablePace)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// local reports whether target is a Unix socket or a loopback address.
func local(target string) bool {
	if strings.HasPrefix(target, "unix:") {
		return true
	}
	host := strings.TrimPrefix(target, "dns:///")
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Connected reports whether the connection to the daemon is up, waiting
// up to d for it unless it is failing (TRANSIENT_FAILURE) or closed: what
// a caller with somewhere else to go, such as WrapConfig, asks before each
// request.
func (c *Client) Connected(ctx context.Context, d time.Duration) bool {
	state := c.conn.GetState()
	if state == connectivity.Ready {
		return true
	}
	if state == connectivity.TransientFailure || state == connectivity.Shutdown {
		return false
	}
	c.conn.Connect()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		if state = c.conn.GetState(); state == connectivity.Ready {
			return true
		}
		if state == connectivity.TransientFailure || state == connectivity.Shutdown || !c.conn.WaitForStateChange(ctx, state) {
			return false
		}
	}
}

// Close closes the connection; watches on it end.
func (c *Client) Close() error { return c.conn.Close() }

// API returns the raw gRPC client, for introspection.
func (c *Client) API() informerdv1.InformerServiceClient { return c.api }

// WatchOptions say what to watch.
type WatchOptions struct {
	// Resource to watch. Required, unless Kind is set.
	Resource schema.GroupVersionResource
	// Kind names the resource by kind instead, with Resource.Group and an
	// optional Resource.Version; Resource.Resource must be empty.
	Kind string
	// Namespace, or "" for all namespaces.
	Namespace string
	// LabelSelector and FieldSelector, in kubectl syntax.
	LabelSelector, FieldSelector string
	// MetadataOnly receives apiVersion, kind and metadata only.
	MetadataOnly bool
	// ClientName identifies this client in the daemon's introspection.
	ClientName string
	// WaitForResource waits for a resource the API server does not serve
	// yet, instead of failing with NotFound.
	WaitForResource bool
	// Protobuf receives built-in types in the API server's protobuf
	// encoding (custom resources still come as JSON): the daemon watches
	// the API server in protobuf for them, and objects decode faster.
	// NewListerWatcher then returns typed objects (client-go's scheme, or
	// Scheme) for built-in types, for typed informers.
	Protobuf bool
	// Scheme, if set, makes NewListerWatcher return typed objects for
	// every kind it knows (custom resources included), and Unstructured
	// for the others. Default: client-go's scheme when Protobuf is set,
	// else Unstructured for everything.
	Scheme *runtime.Scheme
	// NotOlderThan, a resourceVersion, makes the daemon start the stream
	// only from an informer that has reached it (it waits a few seconds,
	// then fails with UNAVAILABLE): a client that has seen a state never
	// receives an older one. The Watcher and the adapters set it
	// themselves.
	NotOlderThan string
	// ExistingInformerOnly streams only from an informer the daemon
	// already runs or keeps lingering; otherwise the stream fails with
	// FAILED_PRECONDITION and the daemon starts nothing: for one-off reads.
	ExistingInformerOnly bool
}

func (o WatchOptions) request(resume string) *informerdv1.WatchRequest {
	view := informerdv1.View_VIEW_FULL
	if o.MetadataOnly {
		view = informerdv1.View_VIEW_METADATA
	}
	encoding := informerdv1.Encoding_ENCODING_JSON
	if o.Protobuf {
		encoding = informerdv1.Encoding_ENCODING_PROTOBUF
	}
	return &informerdv1.WatchRequest{
		Resource: &informerdv1.GroupVersionResource{
			Group: o.Resource.Group, Version: o.Resource.Version, Resource: o.Resource.Resource,
		},
		Namespace:                   o.Namespace,
		LabelSelector:               o.LabelSelector,
		FieldSelector:               o.FieldSelector,
		View:                        view,
		ResumeResourceVersion:       resume,
		ClientName:                  o.ClientName,
		WaitForResource:             o.WaitForResource,
		Kind:                        o.Kind,
		Encoding:                    encoding,
		NotOlderThanResourceVersion: o.NotOlderThan,
		ExistingInformerOnly:        o.ExistingInformerOnly,
	}
}

// Stream is one watch stream, without reconnect: the low-level form that
// Watch and the adapters build on.
type Stream struct {
	cancel context.CancelFunc
	s      informerdv1.InformerService_WatchClient
}

// Stream opens one watch stream after resume (a resourceVersion a previous
// stream delivered), or with a snapshot if resume is "". The daemon's
// answer to the request (for example INVALID_ARGUMENT or NOT_FOUND) comes
// with the first Recv.
func (c *Client) Stream(ctx context.Context, opts WatchOptions, resume string) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.api.Watch(ctx, opts.request(resume))
	if err != nil {
		cancel()
		return nil, err
	}
	return &Stream{cancel: cancel, s: s}, nil
}

// Recv returns the next batch of events. It returns io.EOF if the daemon
// ended the stream cleanly, else the stream's gRPC status error.
func (s *Stream) Recv() ([]*informerdv1.Event, error) {
	resp, err := s.s.Recv()
	if err != nil {
		return nil, err
	}
	return resp.GetEvents(), nil
}

// Accepted waits for the daemon's answer to the stream's request: nil once
// the daemon accepted it (authorized, its informer synced), else the
// status the stream ended with.
func (s *Stream) Accepted() error {
	if md, err := s.s.Header(); err == nil && md.Get(informerdv1.HeaderAccepted) != nil {
		return nil
	}
	_, err := s.s.Recv() // the status of a stream that ended before it was accepted
	if err == nil || errors.Is(err, io.EOF) {
		err = status.Error(codes.Unavailable, "informerd ended the stream before accepting it")
	}
	return err
}

// Reset tells, before any event is read, whether an accepted stream starts
// with RESET and a snapshot because the daemon does not hold its resume
// point: informerdv1.ResetLost (its informer no longer holds it) or
// ResetNewInformer (the request started the informer, after it); "" if
// not. A caller may then ask elsewhere instead.
func (s *Stream) Reset() string {
	md, err := s.s.Header()
	if err != nil {
		return ""
	}
	if v := md.Get(informerdv1.HeaderReset); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Close ends the stream.
func (s *Stream) Close() { s.cancel() }
