// Package client is informerd's client library: Dial a node's daemon, then
// run a Watcher (automatic reconnect and resume, a local store), or adopt it
// in one line through the client-go adapters: NewListerWatcher for
// informers, NewDynamicClient for dynamicinformer and cli-utils.
package client

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/runtime/schema"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// DefaultSocket is where the daemon listens by default.
const DefaultSocket = "/var/run/informerd/informerd.sock"

// maxRecvMsgSize admits the largest batch the daemon sends: a batch is cut
// at 1 MiB unless a single object is larger, and objects are at most about
// 1.5 MiB in etcd.
const maxRecvMsgSize = 16 << 20

// Client is a connection to one informerd daemon. It is safe for
// concurrent use.
type Client struct {
	conn *grpc.ClientConn
	api  informerdv1.InformerServiceClient
}

// Dial connects to the daemon at target: a Unix socket path ("/run/x.sock"
// or "unix:///run/x.sock") or a loopback "host:port". The connection is
// made lazily and re-made as needed; opts are appended to the defaults.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	if strings.HasPrefix(target, "/") {
		target = "unix://" + target
	}
	defaults := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), // local socket or loopback only
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
	}
	conn, err := grpc.NewClient(target, append(defaults, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("informerd client: dialing %s: %w", target, err)
	}
	return &Client{conn: conn, api: informerdv1.NewInformerServiceClient(conn)}, nil
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
	// NewListerWatcher then returns typed objects (client-go's scheme) for
	// built-in types, for typed informers.
	Protobuf bool
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
		Namespace:             o.Namespace,
		LabelSelector:         o.LabelSelector,
		FieldSelector:         o.FieldSelector,
		View:                  view,
		ResumeResourceVersion: resume,
		ClientName:            o.ClientName,
		WaitForResource:       o.WaitForResource,
		Kind:                  o.Kind,
		Encoding:              encoding,
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

// Close ends the stream.
func (s *Stream) Close() { s.cancel() }
