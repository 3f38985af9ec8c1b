package client

import (
	"context"
	"net/netip"

	"google.golang.org/protobuf/proto"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// AddressOptions say which address to watch.
type AddressOptions struct {
	// Address is the IP and port. Required.
	Address netip.AddrPort
	// LabelKeys are the pod labels answers carry; changes to other labels
	// are not changes.
	LabelKeys []string
	// ClientName identifies this client in the daemon's logs.
	ClientName string
	// Workload asks for the pod's workload in answers (AddressPod.workload:
	// the Deployment or CronJob through its ReplicaSet or Job, else the
	// controller). The caller must be allowed to list and watch
	// replicasets.apps and jobs.batch in all namespaces.
	Workload bool
}

func (o AddressOptions) request() *informerdv1.WatchAddressRequest {
	return &informerdv1.WatchAddressRequest{
		Ip: o.Address.Addr().String(), Port: uint32(o.Address.Port()), LabelKeys: o.LabelKeys, ClientName: o.ClientName,
		Workload: o.Workload,
	}
}

// AddressWatcherOptions configure an AddressWatcher. Zero values take the
// defaults.
type AddressWatcherOptions struct {
	// Backoff between retries after errors the daemon returns.
	Backoff Backoff
	// OnError, if set, is called with every error that ends a stream
	// before the AddressWatcher reconnects; a terminal one is returned by
	// Run instead.
	OnError func(error)
}

// AddressWatcher watches who is behind an address: it reconnects as a
// Watcher does, and hands its handler each answer that differs from the
// last one the handler saw, so that a reconnect finding the same answer
// calls nothing. Create it with NewAddressWatcher; Run it once.
type AddressWatcher struct {
	c    *Client
	opts AddressOptions
	h    func(*informerdv1.WatchAddressResponse)
	o    AddressWatcherOptions
	// last is the answer the handler saw last; owned by Run's goroutine.
	last *informerdv1.WatchAddressResponse
}

// NewAddressWatcher returns an AddressWatcher of opts that calls h, from
// one goroutine, with answers it must not modify.
func NewAddressWatcher(c *Client, opts AddressOptions, h func(*informerdv1.WatchAddressResponse), o AddressWatcherOptions) *AddressWatcher {
	o.Backoff = o.Backoff.withDefaults()
	return &AddressWatcher{c: c, opts: opts, h: h, o: o}
}

// Run watches until ctx ends (returning nil) or the daemon answers with an
// error that retrying cannot fix (for example INVALID_ARGUMENT for a bad
// address), returned as the gRPC status error.
func (w *AddressWatcher) Run(ctx context.Context) error {
	return w.c.retry(ctx, w.o.Backoff, w.o.OnError, w.runOnce, retryable)
}

// runOnce runs one stream; progressed reports whether it received answers.
func (w *AddressWatcher) runOnce(ctx context.Context) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := w.c.api.WatchAddress(ctx, w.opts.request())
	if err != nil {
		return false, err
	}
	for {
		a, err := s.Recv()
		if err != nil {
			return progressed, err
		}
		progressed = true
		w.deliver(a)
	}
}

// deliver hands a to the handler unless it is the answer the handler saw
// last.
func (w *AddressWatcher) deliver(a *informerdv1.WatchAddressResponse) {
	if w.last != nil && proto.Equal(w.last, a) {
		return
	}
	w.last = a
	w.h(a)
}
