package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/internal/backoff"
	"github.com/informerd/informerd/internal/snapdiff"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// Backoff bounds the jittered exponential backoff between retries after
// an error the daemon returned. While the daemon is unreachable (it is
// restarting, or down) there is no backoff: the next attempt is made as
// soon as the connection is back (within 250 ms of a local daemon
// accepting again), and at least every Max, so that OnError keeps
// reporting why.
type Backoff struct {
	// Initial is the first delay. Default 100ms.
	Initial time.Duration
	// Max caps the delay. Default 10s.
	Max time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = 100 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 10 * time.Second
	}
	return b
}

// WatcherOptions configure a Watcher. Zero values take the defaults.
type WatcherOptions struct {
	// Backoff between retries after errors the daemon returns.
	Backoff Backoff
	// Indexers are added to the store's namespace index.
	Indexers toolscache.Indexers
	// OnError, if set, is called with every error that ends a stream
	// before the Watcher reconnects; a terminal one is returned by Run
	// instead. Errors about the daemon's Unix socket say what is wrong
	// with it.
	OnError func(error)
}

// Watcher is a resilient watch with a client-go store: it reconnects as
// soon as a restarted daemon serves again (see Backoff), resumes from the
// last resourceVersion it delivered, never accepts a state older than one
// it has seen, and turns a fresh snapshot (after a RESET or a daemon
// restart) into the real changes only. Its store is a client-go Indexer of *unstructured.Unstructured,
// readable at any time; its handler follows client-go's
// ResourceEventHandler contract. Create it with NewWatcher; Run it once.
type Watcher struct {
	c     *Client
	opts  WatchOptions
	h     toolscache.ResourceEventHandler
	o     WatcherOptions
	store toolscache.Indexer // safe for concurrent use

	// Owned by Run's goroutine:
	resume string // "" until the first snapshot completes
	seen   uint64 // the newest numeric resourceVersion received

	syncedOnce sync.Once
	synced     chan struct{}
	resets     atomic.Int64
}

// SyncedHandler is implemented by handlers that want to know when the
// first snapshot has been handed to them: a Watcher calls OnSynced once,
// on the goroutine that calls the handler, right after it.
type SyncedHandler interface {
	OnSynced()
}

// NewWatcher returns a Watcher of opts that calls h (and h.OnSynced, if h
// is a SyncedHandler).
func NewWatcher(c *Client, opts WatchOptions, h toolscache.ResourceEventHandler, o WatcherOptions) *Watcher {
	o.Backoff = o.Backoff.withDefaults()
	indexers := toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc}
	for k, f := range o.Indexers {
		indexers[k] = f
	}
	return &Watcher{
		c: c, opts: opts, h: h, o: o,
		store:  toolscache.NewIndexer(toolscache.DeletionHandlingMetaNamespaceKeyFunc, indexers),
		synced: make(chan struct{}),
	}
}

// Indexer returns the Watcher's store: every object the watch holds, as
// *unstructured.Unstructured, keyed namespace/name. Do not modify it or
// its objects.
func (w *Watcher) Indexer() toolscache.Indexer { return w.store }

// Lister returns a lister over the store.
func (w *Watcher) Lister() toolscache.GenericLister {
	return toolscache.NewGenericLister(w.store, w.opts.Resource.GroupResource())
}

// HasSynced reports whether the first snapshot is in the store and has
// been handed to the handler.
func (w *Watcher) HasSynced() bool {
	select {
	case <-w.synced:
		return true
	default:
		return false
	}
}

// Synced is closed when HasSynced becomes true.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Resets returns how many RESETs the Watcher has received: how often it
// had to diff a fresh snapshot against its store. Safe to call at any time.
func (w *Watcher) Resets() int64 { return w.resets.Load() }

// terminal reports whether a stream error means retrying cannot help.
func terminal(err error) bool {
	var de *DecodeError
	if errors.As(err, &de) || errors.Is(err, ErrSocketPermission) {
		return true
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated,
		codes.Unimplemented, codes.FailedPrecondition:
		return true
	case codes.ResourceExhausted:
		return tooLarge(err)
	}
	return false
}

// tooLarge reports whether err refuses a request larger than the daemon
// ever accepts: one of its own limits (REQUEST_TOO_LARGE), or a message
// over its -max-request-bytes, which gRPC itself refuses. Other
// RESOURCE_EXHAUSTED errors (streams or objects per caller, throttling)
// free up.
func tooLarge(err error) bool {
	return hasReason(err, informerdv1.ReasonRequestTooLarge) || strings.HasPrefix(status.Convert(err).Message(), grpcTooLarge)
}

// grpcTooLarge begins grpc-go's message for a message over the receiver's
// limit.
const grpcTooLarge = "grpc: received message larger than max"

// retryable reports whether the Watcher tries again after err ended a
// stream (progressed: after it delivered events). PERMISSION_DENIED is
// retried, as client-go's reflector retries Forbidden: RBAC changes, and
// an API server that restarts denies for a moment. UNAUTHENTICATED is
// retried after a stream that worked: its token expired, and the next
// stream reads the rotated one.
func retryable(err error, progressed bool) bool {
	switch status.Code(err) {
	case codes.PermissionDenied:
		return true
	case codes.Unauthenticated:
		return progressed
	}
	return !terminal(err)
}

// retryableUnlessDenied is retryable, except that PERMISSION_DENIED is
// terminal, as it is for cli-utils' StatusWatcher.
func retryableUnlessDenied(err error, progressed bool) bool {
	return status.Code(err) != codes.PermissionDenied && retryable(err, progressed)
}

// Run watches until ctx ends (returning nil) or the watch fails in a way
// that retrying cannot fix: a gRPC status error from the daemon, a
// DecodeError, or ErrSocketPermission (see retryable for
// PERMISSION_DENIED and UNAUTHENTICATED). OnError sees every error it
// retries after.
func (w *Watcher) Run(ctx context.Context) error {
	return w.c.Retry(ctx, RetryOptions{Backoff: w.o.Backoff, OnError: w.o.OnError}, w.runOnce)
}

// RetryOptions configure Retry. Zero values take the defaults.
type RetryOptions struct {
	// Backoff between attempts after errors the daemon returns.
	Backoff Backoff
	// OnError, if set, is called with every error that ends an attempt
	// before Retry tries again (a terminal one is returned instead).
	OnError func(error)
	// StopOnDenied makes PERMISSION_DENIED terminal, as it is for
	// cli-utils' StatusWatcher. By default it is retried, as a Watcher
	// retries it (and client-go's reflector retries Forbidden): RBAC
	// changes, and an API server that restarts denies for a moment.
	StopOnDenied bool
}

// Retry is the reconnect loop of a Watcher, for a stream of the daemon's
// API (API) that a caller runs itself. It calls once until ctx ends
// (returning nil) or once returns an error that retrying cannot fix,
// which it returns. once runs one stream until it fails; progressed
// reports whether the stream delivered anything, which starts the
// backoff over. Once ctx has ended, what once returns is ignored.
//
// An error once returns is terminal when it is a DecodeError, when the
// caller may not open the daemon's Unix socket (wrapping
// ErrSocketPermission), or when it is a gRPC status error of code
// INVALID_ARGUMENT, NOT_FOUND, UNIMPLEMENTED, FAILED_PRECONDITION,
// PERMISSION_DENIED (only with StopOnDenied), UNAUTHENTICATED (unless the
// stream progressed: its token expired, and the next attempt reads the
// rotated one) or RESOURCE_EXHAUSTED for a request larger than the daemon
// ever accepts (REQUEST_TOO_LARGE, or a message over its
// -max-request-bytes; other RESOURCE_EXHAUSTED errors free up and are
// retried). Every other error is handed to OnError, and retried: after
// the daemon was unreachable (it is restarting, or down), as soon as the
// connection is back (see Backoff); after an error the daemon returned,
// with jittered exponential backoff. An error about the daemon's Unix
// socket, returned or handed to OnError, says what is wrong with it.
// Retry runs on its caller's goroutine and starts none.
func (c *Client) Retry(ctx context.Context, o RetryOptions, once func(ctx context.Context) (progressed bool, err error)) error {
	policy := retryable
	if o.StopOnDenied {
		policy = retryableUnlessDenied
	}
	return c.retry(ctx, o.Backoff.withDefaults(), o.OnError, once, policy)
}

// retry runs once until ctx ends (returning nil) or once fails in a way
// that retryable says retrying cannot fix (returning the error, explained).
// It hands other errors to onError, if set. After a failure because the
// daemon was unreachable it tries again as soon as the connection is back
// (awaitDaemon, at most b.Max later); after an error the daemon returned,
// it waits with jittered exponential backoff, starting over after an
// attempt that made progress. An attempt that made progress and ended
// UNAVAILABLE (the daemon shut down, or handed off to a new one already
// accepting on its socket) is followed by one at once (settle): gRPC
// connects it to whoever serves now, and should that fail too, the waits
// above apply.
func (c *Client) retry(ctx context.Context, b Backoff, onError func(error), once func(context.Context) (progressed bool, err error),
	retryable func(err error, progressed bool) bool) error {
	bo := backoff.Backoff{Initial: b.Initial, Max: b.Max}
	for ctx.Err() == nil {
		progressed, err := once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		down := c.unreachable(err)
		gone := progressed && status.Code(err) == codes.Unavailable
		if err = c.explain(err); !retryable(err, progressed) {
			return err
		}
		if onError != nil {
			onError(err)
		}
		if progressed {
			bo.Reset()
		}
		if gone {
			c.settle(ctx, b.Initial)
			continue
		}
		wait := bo.Wait
		if down {
			wait = func(ctx context.Context) error { return c.awaitDaemon(ctx, b.Max) }
		}
		if wait(ctx) != nil {
			return nil
		}
	}
	return nil
}

// settle waits, at most d, while the connection is READY: after a working
// stream ended UNAVAILABLE, gRPC may not yet have seen its connection go,
// and an attempt made on it would fail too, then wait for the daemon.
func (c *Client) settle(ctx context.Context, d time.Duration) {
	if s := c.conn.GetState(); s == connectivity.Ready {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		c.conn.WaitForStateChange(ctx, s)
	}
}

// runOnce runs one stream; progressed reports whether it delivered events.
func (w *Watcher) runOnce(ctx context.Context) (progressed bool, err error) {
	opts := w.opts
	if w.seen > 0 {
		opts.NotOlderThan = strconv.FormatUint(w.seen, 10)
	}
	s, err := w.c.Stream(ctx, opts, w.resume)
	if err != nil {
		return false, err
	}
	defer s.Close()
	// Without a resume point the stream starts with a snapshot, which
	// replaces the store as a RESET does.
	var snap map[string]*unstructured.Unstructured
	if w.resume == "" {
		snap = map[string]*unstructured.Unstructured{}
	}
	for {
		evs, err := s.Recv()
		if err != nil {
			return progressed, err
		}
		progressed = true
		for _, ev := range evs {
			if snap, err = w.apply(ev, snap); err != nil {
				return progressed, err
			}
		}
	}
}

// see notes a resourceVersion received.
func (w *Watcher) see(rv string) {
	if n, err := strconv.ParseUint(rv, 10, 64); err == nil && n > w.seen {
		w.seen = n
	}
}

// apply handles one event; snap is non-nil while a snapshot is being read.
func (w *Watcher) apply(ev *informerdv1.Event, snap map[string]*unstructured.Unstructured) (map[string]*unstructured.Unstructured, error) {
	switch ev.GetType() {
	case informerdv1.EventType_EVENT_TYPE_RESET:
		w.resets.Add(1)
		return map[string]*unstructured.Unstructured{}, nil
	case informerdv1.EventType_EVENT_TYPE_SYNCED:
		if snap != nil {
			w.replace(snap)
		}
		w.resume = ev.GetResourceVersion()
		w.see(w.resume)
		w.syncedOnce.Do(func() {
			close(w.synced)
			if sh, ok := w.h.(SyncedHandler); ok {
				sh.OnSynced()
			}
		})
		return nil, nil
	case informerdv1.EventType_EVENT_TYPE_BOOKMARK:
		if snap == nil && ev.GetResourceVersion() != "" {
			w.resume = ev.GetResourceVersion()
			w.see(w.resume)
		}
		return snap, nil
	}
	obj, err := decode(ev.GetObject(), ev.GetResourceVersion())
	if err != nil {
		return snap, err
	}
	k := storeKey(obj)
	if snap != nil {
		if ev.GetType() != informerdv1.EventType_EVENT_TYPE_DELETED {
			snap[k] = obj
		}
		return snap, nil
	}
	switch ev.GetType() {
	case informerdv1.EventType_EVENT_TYPE_ADDED, informerdv1.EventType_EVENT_TYPE_MODIFIED:
		w.upsert(k, obj)
	case informerdv1.EventType_EVENT_TYPE_DELETED:
		if _, ok, _ := w.store.GetByKey(k); ok {
			_ = w.store.Delete(obj) // keyed by namespace/name: cannot fail
			w.h.OnDelete(obj)
		}
	}
	if rv := ev.GetResourceVersion(); rv != "" {
		w.resume = rv
		w.see(rv)
	}
	return nil, nil
}

// replace makes snap the store, handing only the differences to the
// handler, by snapdiff's rule and in its order: deletions first (as
// DeletedFinalStateUnknown, since the final state was not seen; an object
// created again under its name is deleted, then added), then additions
// and updates. The adds of the first snapshot are the initial list.
func (w *Watcher) replace(snap map[string]*unstructured.Unstructured) {
	items := w.store.List()
	old := make([]*unstructured.Unstructured, 0, len(items))
	for _, item := range items {
		old = append(old, item.(*unstructured.Unstructured))
	}
	snapdiff.Sort(old, compareObjects)
	next := slices.Collect(maps.Values(snap))
	snapdiff.Sort(next, compareObjects)
	for _, c := range snapdiff.Diff(slices.Values(old), next, unstructuredAccessors) {
		k := storeKey(c.Object)
		if c.Type == snapdiff.Deleted {
			_ = w.store.Delete(c.Object) // keyed by namespace/name: cannot fail
			w.h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: k, Obj: c.Object})
			continue
		}
		w.upsert(k, c.Object)
	}
}

// compareObjects orders objects by namespace, then name.
func compareObjects(a, b *unstructured.Unstructured) int {
	return cmp.Or(strings.Compare(a.GetNamespace(), b.GetNamespace()), strings.Compare(a.GetName(), b.GetName()))
}

var unstructuredAccessors = snapdiff.Accessors[*unstructured.Unstructured]{
	Compare:         compareObjects,
	ResourceVersion: (*unstructured.Unstructured).GetResourceVersion,
	UID:             func(o *unstructured.Unstructured) string { return string(o.GetUID()) },
}

// upsert stores obj and tells the handler, unless the store already has
// that resourceVersion (a duplicate) or a newer one.
func (w *Watcher) upsert(k string, obj *unstructured.Unstructured) {
	item, ok, _ := w.store.GetByKey(k)
	if !ok {
		_ = w.store.Add(obj)
		w.h.OnAdd(obj, !w.HasSynced())
		return
	}
	old := item.(*unstructured.Unstructured)
	if !newer(obj.GetResourceVersion(), old.GetResourceVersion()) {
		return
	}
	_ = w.store.Update(obj)
	w.h.OnUpdate(old, obj)
}

// newer reports whether resourceVersion a is a change after b: different,
// and, when both are numbers, larger.
func newer(a, b string) bool {
	if a == b {
		return false
	}
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA != nil || errB != nil || x > y
}

// DecodeError says an object the daemon sent cannot be decoded. Retrying
// cannot help: a Watcher stops with it, naming the object.
type DecodeError struct {
	// APIVersion, Kind, Namespace and Name, as far as they could be read.
	APIVersion, Kind, Namespace, Name string
	// ResourceVersion is the event's position.
	ResourceVersion string
	Err             error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("informerd client: cannot decode %s %s/%s (apiVersion %q) at resourceVersion %q: %v; "+
		"a type the scheme does not know must be added to WatchOptions.Scheme, or watched without WatchOptions.Protobuf",
		e.Kind, e.Namespace, e.Name, e.APIVersion, e.ResourceVersion, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// decodeError returns a DecodeError for b, reading what it can of its type
// and metadata.
func decodeError(b []byte, rv string, err error) *DecodeError {
	de := &DecodeError{ResourceVersion: rv, Err: err}
	var pom metav1.PartialObjectMetadata
	if isProtobuf(b) {
		var u runtime.Unknown
		if u.Unmarshal(b[len(protobufMagic):]) == nil {
			de.APIVersion, de.Kind = u.APIVersion, u.Kind
			_ = pom.Unmarshal(u.Raw) // every built-in type's field 1 is its ObjectMeta
		}
	} else if json.Unmarshal(b, &pom) == nil {
		de.APIVersion, de.Kind = pom.APIVersion, pom.Kind
	}
	de.Namespace, de.Name = pom.Namespace, pom.Name
	return de
}

// decode decodes an object from the daemon into Unstructured: JSON
// directly, protobuf through client-go's scheme. rv is the event's
// position, for errors.
func decode(b []byte, rv string) (*unstructured.Unstructured, error) {
	if isProtobuf(b) {
		typed, err := decodeWith(scheme.Codecs.UniversalDeserializer(), b)
		if err != nil {
			return nil, decodeError(b, rv, err)
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
		if err != nil {
			return nil, decodeError(b, rv, err)
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetGroupVersionKind(typed.GetObjectKind().GroupVersionKind())
		return u, nil
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(b); err != nil {
		return nil, decodeError(b, rv, err)
	}
	return obj, nil
}

// protobufMagic starts every object in the API server's protobuf encoding.
var protobufMagic = []byte("k8s\x00")

func isProtobuf(b []byte) bool { return bytes.HasPrefix(b, protobufMagic) }

// decodeWith decodes b with a scheme's deserializer, keeping its
// apiVersion and kind.
func decodeWith(d runtime.Decoder, b []byte) (runtime.Object, error) {
	obj, gvk, err := d.Decode(b, nil, nil)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	return obj, nil
}

func storeKey(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}
