package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// NewListerWatcher returns a client-go ListerWatcher served by the daemon,
// so that cache.NewSharedIndexInformer works unchanged: with
// &unstructured.Unstructured{} as the object type, or, with opts.Scheme
// (or opts.Protobuf, for client-go's scheme), with the Go types the scheme
// knows (for example &corev1.Pod{}, or a custom resource's type). The
// Namespace, selectors and view of opts apply; selectors may also come in
// the ListOptions (an informer factory's tweakListOptions), and then must
// agree with those of opts.
//
// It implements client-go's WatchList semantics: a Watch with
// SendInitialEvents streams the daemon's snapshot as ADDED events and ends
// it with the initial-events-end bookmark, not older than the requested
// resourceVersion (resourceVersionMatch NotOlderThan). A watch whose
// stream fails resumes by itself (waiting for an unreachable daemon)
// rather than ending. A RESET (the resume point left the daemon's log, as
// after a daemon restart) becomes the DELETED, ADDED and MODIFIED events
// from what the reflector holds to the daemon's new snapshot, and a
// bookmark, when the watch started with initial events or resumes from a
// List of this Client (see resumes); otherwise it surfaces as 410 Expired,
// on which the reflector relists. No List or Watch ever starts from a
// state older than one this ListerWatcher has delivered. While the daemon
// is unreachable, ListWithContext and WatchWithContext wait for it until
// their context ends.
func NewListerWatcher(c *Client, opts WatchOptions) ListerWatcher { return newListWatch(c, opts) }

func newListWatch(c *Client, opts WatchOptions) *listWatch {
	lw := &listWatch{c: c, opts: opts}
	switch {
	case opts.Scheme != nil:
		lw.decoder = serializer.NewCodecFactory(opts.Scheme).UniversalDeserializer()
	case opts.Protobuf:
		lw.decoder = scheme.Codecs.UniversalDeserializer()
	}
	return lw
}

// ListerWatcher is what NewListerWatcher returns: client-go's ListerWatcher
// in both its forms, so that every informer constructor takes it.
type ListerWatcher interface {
	cache.ListerWatcher
	cache.ListerWatcherWithContext
}

type listWatch struct {
	c       *Client
	opts    WatchOptions
	decoder runtime.Decoder // nil: Unstructured for everything

	mu   sync.Mutex // guards seen
	seen uint64     // the newest numeric resourceVersion delivered
}

var _ ListerWatcher = (*listWatch)(nil)

// decode decodes an object into the scheme's type for its kind, or into
// Unstructured when there is no scheme or it does not know the kind (JSON
// only: protobuf needs the type).
func (lw *listWatch) decode(b []byte, rv string) (runtime.Object, error) {
	if lw.decoder == nil {
		return decode(b, rv)
	}
	obj, err := decodeWith(lw.decoder, b)
	switch {
	case err == nil:
		return obj, nil
	case runtime.IsNotRegisteredError(err) && !isProtobuf(b):
		return decode(b, rv)
	}
	return nil, decodeError(b, rv, err)
}

// see notes a resourceVersion delivered.
func (lw *listWatch) see(rv string) {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return
	}
	lw.mu.Lock()
	lw.seen = max(lw.seen, n)
	lw.mu.Unlock()
}

// List is ListWithContext without a context, for client-go's older
// constructors (client-go calls the context forms when they exist), except
// that it fails at once, with 503 ServiceUnavailable, while the daemon is
// unreachable: without a context it would wait forever.
func (lw *listWatch) List(o metav1.ListOptions) (runtime.Object, error) {
	return lw.listing(context.Background(), o, false)
}

// Watch is WatchWithContext without a context; see List.
func (lw *listWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return lw.watching(context.Background(), o, false)
}

// options returns the WatchOptions of a request: lw's, with the selectors
// of o and a NotOlderThan that is never older than what lw delivered, nor
// than o's resourceVersion when o asks for NotOlderThan.
func (lw *listWatch) options(o metav1.ListOptions) (WatchOptions, error) {
	opts := lw.opts
	for _, sel := range []struct {
		name         string
		mine, theirs string
		set          *string
	}{
		{"label", opts.LabelSelector, o.LabelSelector, &opts.LabelSelector},
		{"field", opts.FieldSelector, o.FieldSelector, &opts.FieldSelector},
	} {
		if sel.theirs == "" {
			continue
		}
		if sel.mine != "" && sel.mine != sel.theirs {
			return opts, apierrors.NewBadRequest(fmt.Sprintf("informerd ListerWatcher: %s selector %q in ListOptions differs from %q in client.WatchOptions: set it in one place", sel.name, sel.theirs, sel.mine))
		}
		*sel.set = sel.theirs
	}
	lw.mu.Lock()
	min := lw.seen
	lw.mu.Unlock()
	if o.ResourceVersionMatch == metav1.ResourceVersionMatchNotOlderThan {
		if n, err := strconv.ParseUint(o.ResourceVersion, 10, 64); err == nil {
			min = max(min, n)
		}
	}
	if min > 0 {
		opts.NotOlderThan = strconv.FormatUint(min, 10)
	}
	return opts, nil
}

// ListWithContext reads one snapshot. While the daemon is unreachable (a
// restart), it waits for it until ctx ends rather than failing: client-go's
// reflector would back off for up to 30 s before trying again, and the
// informer come back that much later than the daemon.
func (lw *listWatch) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	return lw.listing(ctx, o, true)
}

// listing is ListWithContext; await says whether to wait for an
// unreachable daemon.
func (lw *listWatch) listing(ctx context.Context, o metav1.ListOptions, await bool) (runtime.Object, error) {
	opts, err := lw.options(o)
	if err != nil {
		return nil, err
	}
	s, err := lw.c.openStream(ctx, opts, "", await)
	if err != nil {
		return nil, toAPIError(err)
	}
	defer s.Close()
	var objs []runtime.Object
	for {
		evs, err := s.Recv()
		if err != nil {
			return nil, toAPIError(lw.c.explain(err))
		}
		for _, ev := range evs {
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_ADDED:
				obj, err := lw.decode(ev.GetObject(), ev.GetResourceVersion())
				if err != nil {
					return nil, err
				}
				objs = append(objs, obj)
			case informerdv1.EventType_EVENT_TYPE_SYNCED:
				rv := ev.GetResourceVersion()
				lw.see(rv)
				d := make(delivered, len(objs))
				for _, obj := range objs {
					d.apply(watch.Added, obj)
				}
				lw.c.resumes.leave(opts, rv, d)
				return lw.list(objs, rv), nil
			}
		}
	}
}

// list returns an UnstructuredList of objs, or, for typed objects, a
// metav1.List (meta.ExtractList reads both).
func (lw *listWatch) list(objs []runtime.Object, rv string) runtime.Object {
	if lw.decoder == nil {
		l := &unstructured.UnstructuredList{Items: make([]unstructured.Unstructured, len(objs))}
		for i, o := range objs {
			l.Items[i] = *o.(*unstructured.Unstructured)
		}
		l.SetResourceVersion(rv)
		return l
	}
	l := &metav1.List{Items: make([]runtime.RawExtension, len(objs))}
	for i, o := range objs {
		l.Items[i].Object = o
	}
	l.ResourceVersion = rv
	return l
}

// WatchWithContext opens a watch after o.ResourceVersion, or with initial
// events when o.SendInitialEvents is set (WatchList) or the version is ""
// or "0". While the daemon is unreachable, it waits for it until ctx ends,
// as ListWithContext does.
func (lw *listWatch) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return lw.watching(ctx, o, true)
}

// watching is WatchWithContext; await says whether to wait for an
// unreachable daemon.
func (lw *listWatch) watching(ctx context.Context, o metav1.ListOptions, await bool) (watch.Interface, error) {
	opts, err := lw.options(o)
	if err != nil {
		return nil, err
	}
	watchList := o.SendInitialEvents != nil && *o.SendInitialEvents
	resume := o.ResourceVersion
	if watchList || resume == "0" {
		resume = ""
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &streamWatch{lw: lw, o: o, out: make(chan watch.Event), cancel: cancel, done: make(chan struct{}),
		bookmarks: o.AllowWatchBookmarks, watchList: watchList, await: await, resume: resume, told: resume}
	if resume == "" {
		w.held, w.initial = delivered{}, true
	} else {
		w.held = lw.c.resumes.take(opts, resume)
	}
	s, err := lw.c.openStream(ctx, opts, resume, await)
	if err != nil {
		cancel()
		lw.c.resumes.leave(opts, resume, w.held)
		return nil, toAPIError(err)
	}
	go w.run(ctx, s) // ends when Stop or ctx ends it, or the watch cannot go on
	return w, nil
}

// streamWatch adapts the daemon's streams to watch.Interface. While the
// daemon is unreachable or restarts, it resumes by itself (as Watcher
// does) rather than ending the watch: client-go's reflector takes a watch
// that ends within a second with no events for a failure, and relists
// after its backoff.
type streamWatch struct {
	lw        *listWatch
	o         metav1.ListOptions
	out       chan watch.Event
	cancel    context.CancelFunc // ends the watch
	done      chan struct{}      // closed when run has returned
	bookmarks bool
	watchList bool
	await     bool // resume after the daemon was unreachable

	// Owned by run.
	// resume is where the next stream resumes: after the last event sent
	// ("" during the initial events).
	resume string
	// told is the receiver's position: the resourceVersion of the last
	// object or bookmark it received, where a reflector resumes.
	told string
	// held is what the receiver holds: what the List or watch this one
	// resumes from delivered, and what this one delivered since; nil when
	// not known (a resume point no List of this Client left).
	held delivered
	// initial: the initial events (of a WatchList, or of a watch from "")
	// are being sent; a stream failing then ends the watch.
	initial bool
	// fresh collects the snapshot after a RESET (nil when there is none).
	fresh delivered
}

// errWatchEnded: the watch sent its last event.
var errWatchEnded = errors.New("informerd: watch ended")

// Stop ends the watch and returns once it has ended, so that the watch a
// reflector opens next finds what this one left (see leave). It returns
// promptly: nothing run waits for outlasts the watch's context.
func (w *streamWatch) Stop() { w.cancel(); <-w.done }

func (w *streamWatch) ResultChan() <-chan watch.Event { return w.out }

// run sends the events of s, then of each stream resuming after it, until
// the watch ends: Stop, an error the daemon will repeat (sent as an ERROR
// event), a RESET with nothing to compare with (410), or a failure it
// cannot resume from (the channel closes; the reflector watches again).
func (w *streamWatch) run(ctx context.Context, s *Stream) {
	defer close(w.done)
	defer close(w.out)
	once := func(ctx context.Context) (progressed bool, err error) {
		if s == nil {
			opts, err := w.lw.options(w.o)
			if err != nil {
				return false, err
			}
			if s, err = w.lw.c.Stream(ctx, opts, w.resume); err != nil {
				return false, err
			}
		}
		defer func() { s.Close(); s = nil }()
		w.fresh = nil
		for {
			evs, err := s.Recv()
			if err != nil {
				return progressed, err
			}
			progressed = true
			for _, ev := range evs {
				if !w.deliver(ctx, ev) {
					return progressed, errWatchEnded
				}
			}
		}
	}
	// A stream that worked and ends UNAUTHENTICATED ended with its token:
	// the next one reads the rotated token (see WithTokenFile) and resumes,
	// as Watcher does, rather than a 401 on which the reflector relists.
	resumable := func(err error, progressed bool) bool {
		return w.await && !w.initial && !errors.Is(err, errWatchEnded) &&
			(!terminal(err) || progressed && status.Code(err) == codes.Unauthenticated)
	}
	err := w.lw.c.retry(ctx, Backoff{}.withDefaults(), nil, once, resumable)
	var st apierrors.APIStatus
	if err != nil && terminal(err) && errors.As(toAPIError(err), &st) {
		s := st.Status()
		w.send(ctx, watch.Event{Type: watch.Error, Object: &s})
	}
	w.leave()
}

// leave keeps what the receiver holds for the watch that resumes from
// its position (the reflector watches again at once after a watch ends,
// at each timeoutSeconds), so that a RESET that one receives, or a RESET
// interrupted by the end of this one, is answered with the changes too.
func (w *streamWatch) leave() {
	if w.held == nil || w.initial {
		return
	}
	if opts, err := w.lw.options(w.o); err == nil {
		w.lw.c.resumes.leave(opts, w.told, w.held)
	}
}

func (w *streamWatch) send(ctx context.Context, ev watch.Event) bool {
	select {
	case w.out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// deliver translates one event; it returns false when the watch must end.
func (w *streamWatch) deliver(ctx context.Context, ev *informerdv1.Event) bool {
	rv := ev.GetResourceVersion()
	var t watch.EventType
	switch ev.GetType() {
	case informerdv1.EventType_EVENT_TYPE_ADDED:
		t = watch.Added
	case informerdv1.EventType_EVENT_TYPE_MODIFIED:
		t = watch.Modified
	case informerdv1.EventType_EVENT_TYPE_DELETED:
		t = watch.Deleted
	case informerdv1.EventType_EVENT_TYPE_BOOKMARK:
		if rv == "" || w.fresh != nil || w.initial {
			return true
		}
		return w.sendBookmark(ctx, ev, false)
	case informerdv1.EventType_EVENT_TYPE_SYNCED:
		switch {
		case w.fresh != nil:
			return w.catchUp(ctx, ev)
		case w.initial:
			w.initial = false
			if !w.watchList { // a plain watch from "" sends the initial state as ADDED only
				w.resume = rv
				return true
			}
			return w.sendBookmark(ctx, ev, true)
		}
		return true
	case informerdv1.EventType_EVENT_TYPE_RESET:
		if w.held == nil || w.initial {
			st := apierrors.NewResourceExpired("informerd: the resume point left the daemon's event log; relist").ErrStatus
			w.send(ctx, watch.Event{Type: watch.Error, Object: &st})
			return false
		}
		w.fresh = delivered{}
		return true
	default:
		return true
	}
	obj, err := w.lw.decode(ev.GetObject(), rv)
	if err != nil {
		st := apierrors.NewInternalError(err).ErrStatus
		w.send(ctx, watch.Event{Type: watch.Error, Object: &st})
		return false
	}
	if w.fresh != nil { // a snapshot after a RESET: ADDED only
		w.fresh.apply(watch.Added, obj)
		return true
	}
	w.lw.see(rv) // before the receiver can act on it
	return w.sendObject(ctx, watch.Event{Type: t, Object: obj})
}

// sendObject sends an object's event and notes that the receiver holds it.
func (w *streamWatch) sendObject(ctx context.Context, e watch.Event) bool {
	if !w.send(ctx, e) {
		return false
	}
	if w.held != nil {
		w.held.apply(e.Type, e.Object)
	}
	if m, err := meta.Accessor(e.Object); err == nil && !w.initial {
		w.resume, w.told = m.GetResourceVersion(), m.GetResourceVersion()
	}
	return true
}

// sendBookmark notes the resourceVersion of a BOOKMARK or SYNCED event, and
// sends its bookmark if the receiver takes them (the initial-events-end
// one always).
func (w *streamWatch) sendBookmark(ctx context.Context, ev *informerdv1.Event, initialEventsEnd bool) bool {
	rv := ev.GetResourceVersion()
	w.lw.see(rv)
	w.resume = rv
	if !w.bookmarks && !initialEventsEnd {
		return true
	}
	if !w.send(ctx, watch.Event{Type: watch.Bookmark, Object: w.bookmark(ev, initialEventsEnd)}) {
		return false
	}
	w.told = rv
	return true
}

// catchUp ends the snapshot after a RESET (ev is its SYNCED): it sends the
// changes from what the receiver holds to the snapshot (see changesTo:
// deletions carry the position before the RESET), then a bookmark at the
// snapshot's resourceVersion.
func (w *streamWatch) catchUp(ctx context.Context, ev *informerdv1.Event) bool {
	rv := ev.GetResourceVersion()
	deletedAt := w.resume
	if deletedAt == "" {
		deletedAt = rv
	}
	changes := w.held.changesTo(w.fresh, deletedAt)
	w.fresh = nil
	w.lw.see(rv)
	for _, e := range changes {
		if !w.sendObject(ctx, e) {
			return false
		}
	}
	if rv == "" {
		return true
	}
	return w.sendBookmark(ctx, ev, false)
}

// bookmark returns the object of a BOOKMARK or SYNCED event: the daemon
// sends one of the resource's kind (the reflector checks the type).
func (w *streamWatch) bookmark(ev *informerdv1.Event, initialEventsEnd bool) runtime.Object {
	b, err := w.lw.decode(ev.GetObject(), ev.GetResourceVersion())
	if err != nil {
		b = &unstructured.Unstructured{Object: map[string]any{}}
	}
	m, err := meta.Accessor(b)
	if err != nil {
		m = &unstructured.Unstructured{Object: map[string]any{}}
		b = m.(runtime.Object)
	}
	m.SetResourceVersion(ev.GetResourceVersion())
	if initialEventsEnd {
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	}
	return b
}

// recheckUnreachable is how often openStream looks again at why the daemon
// is unreachable (a socket it may no longer open ends the wait).
const recheckUnreachable = 10 * time.Second

// openStream is Stream for the client-go adapters, with its error
// explained. With await, while the daemon is unreachable it waits for it
// (awaitDaemon) until ctx ends instead of failing; a socket the caller may
// not open fails at once, with ErrSocketPermission.
func (c *Client) openStream(ctx context.Context, opts WatchOptions, resume string, await bool) (*Stream, error) {
	for {
		s, err := c.Stream(ctx, opts, resume)
		if err == nil {
			return s, nil
		}
		down := c.unreachable(err)
		if err = c.explain(err); !await || !down || errors.Is(err, ErrSocketPermission) {
			return nil, err
		}
		if c.awaitDaemon(ctx, recheckUnreachable) != nil {
			return nil, err
		}
	}
}

// toAPIError turns a daemon status into the API error client-go expects.
func toAPIError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := "informerd: " + st.Message()
	switch st.Code() {
	case codes.NotFound:
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound, Message: msg}}
	case codes.InvalidArgument:
		return apierrors.NewBadRequest(msg)
	case codes.PermissionDenied:
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: msg}}
	case codes.Unauthenticated:
		return apierrors.NewUnauthorized(msg)
	case codes.Unavailable, codes.Canceled:
		return apierrors.NewServiceUnavailable(msg)
	}
	return apierrors.NewInternalError(fmt.Errorf("%s", msg))
}
