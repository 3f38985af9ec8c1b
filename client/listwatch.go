package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// NewListerWatcher returns a client-go ListerWatcher served by the daemon,
// so that cache.NewSharedIndexInformer works unchanged: with
// &unstructured.Unstructured{} as the object type, or, if opts.Protobuf is
// set, with the built-in type (for example &corev1.Pod{}), whose objects
// are then decoded with client-go's scheme. The Namespace, selectors and
// view of opts apply; the ListOptions' selectors must be empty (put them in
// opts).
//
// It implements client-go's WatchList semantics: a Watch with
// SendInitialEvents streams the daemon's snapshot as ADDED events and ends
// it with the initial-events-end bookmark. A RESET (the resume point left
// the daemon's log) surfaces as 410 Expired, on which the reflector
// relists.
func NewListerWatcher(c *Client, opts WatchOptions) ListerWatcher { return newListWatch(c, opts) }

func newListWatch(c *Client, opts WatchOptions) *listWatch {
	lw := &listWatch{c: c, opts: opts, decode: func(b []byte) (runtime.Object, error) { return decode(b) }}
	if opts.Protobuf {
		lw.decode = decodeTypedOrUnstructured
	}
	return lw
}

// decodeTypedOrUnstructured decodes built-in types (protobuf, or the JSON
// of a marker) into their Go types, and custom resources into Unstructured.
func decodeTypedOrUnstructured(b []byte) (runtime.Object, error) {
	obj, err := decodeTyped(b)
	if err != nil && !isProtobuf(b) {
		return decode(b)
	}
	return obj, err
}

// ListerWatcher is what NewListerWatcher returns: client-go's ListerWatcher
// in both its forms, so that every informer constructor takes it.
type ListerWatcher interface {
	cache.ListerWatcher
	cache.ListerWatcherWithContext
}

type listWatch struct {
	c      *Client
	opts   WatchOptions
	decode func([]byte) (runtime.Object, error)
}

var _ ListerWatcher = (*listWatch)(nil)

// List is ListWithContext without a context, for client-go's older
// constructors; client-go calls the context forms when they exist.
func (lw *listWatch) List(o metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.Background(), o)
}

// Watch is WatchWithContext without a context; see List.
func (lw *listWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.Background(), o)
}

func (lw *listWatch) checkSelectors(o metav1.ListOptions) error {
	if o.LabelSelector != "" || o.FieldSelector != "" {
		return apierrors.NewBadRequest("informerd ListerWatcher: set selectors in client.WatchOptions, not in ListOptions")
	}
	return nil
}

// ListWithContext reads one snapshot.
func (lw *listWatch) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	if err := lw.checkSelectors(o); err != nil {
		return nil, err
	}
	s, err := lw.c.Stream(ctx, lw.opts, "")
	if err != nil {
		return nil, toAPIError(err)
	}
	defer s.Close()
	var objs []runtime.Object
	for {
		evs, err := s.Recv()
		if err != nil {
			return nil, toAPIError(err)
		}
		for _, ev := range evs {
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_ADDED:
				obj, err := lw.decode(ev.GetObject())
				if err != nil {
					return nil, err
				}
				objs = append(objs, obj)
			case informerdv1.EventType_EVENT_TYPE_SYNCED:
				return lw.list(objs, ev.GetResourceVersion()), nil
			}
		}
	}
}

// list returns an UnstructuredList of objs, or, for typed objects, a
// metav1.List (meta.ExtractList reads both).
func (lw *listWatch) list(objs []runtime.Object, rv string) runtime.Object {
	if !lw.opts.Protobuf {
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
// or "0".
func (lw *listWatch) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	if err := lw.checkSelectors(o); err != nil {
		return nil, err
	}
	resume := o.ResourceVersion
	watchList := o.SendInitialEvents != nil && *o.SendInitialEvents
	if watchList || resume == "0" {
		resume = ""
	}
	s, err := lw.c.Stream(ctx, lw.opts, resume)
	if err != nil {
		return nil, toAPIError(err)
	}
	w := &streamWatch{s: s, out: make(chan watch.Event), done: make(chan struct{}),
		bookmarks: o.AllowWatchBookmarks, watchList: watchList, decode: lw.decode}
	go w.run() // ends when the stream ends or Stop cancels it
	return w, nil
}

// streamWatch adapts a Stream to watch.Interface.
type streamWatch struct {
	s         *Stream
	out       chan watch.Event
	done      chan struct{}
	stopOnce  sync.Once
	bookmarks bool
	watchList bool
	decode    func([]byte) (runtime.Object, error)
}

func (w *streamWatch) Stop() {
	w.stopOnce.Do(func() {
		close(w.done)
		w.s.Close()
	})
}

func (w *streamWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *streamWatch) send(ev watch.Event) bool {
	select {
	case w.out <- ev:
		return true
	case <-w.done:
		return false
	}
}

func (w *streamWatch) run() {
	defer close(w.out)
	for {
		evs, err := w.s.Recv()
		if err != nil {
			var st apierrors.APIStatus
			if !errors.Is(err, io.EOF) && terminal(err) && errors.As(toAPIError(err), &st) {
				s := st.Status()
				w.send(watch.Event{Type: watch.Error, Object: &s})
			}
			return // the reflector re-watches from its last resourceVersion
		}
		for _, ev := range evs {
			if !w.deliver(ev) {
				return
			}
		}
	}
}

// deliver translates one event; it returns false when the watch must end.
func (w *streamWatch) deliver(ev *informerdv1.Event) bool {
	var t watch.EventType
	switch ev.GetType() {
	case informerdv1.EventType_EVENT_TYPE_ADDED:
		t = watch.Added
	case informerdv1.EventType_EVENT_TYPE_MODIFIED:
		t = watch.Modified
	case informerdv1.EventType_EVENT_TYPE_DELETED:
		t = watch.Deleted
	case informerdv1.EventType_EVENT_TYPE_BOOKMARK:
		if !w.bookmarks || ev.GetResourceVersion() == "" {
			return true
		}
		return w.send(watch.Event{Type: watch.Bookmark, Object: w.bookmark(ev, false)})
	case informerdv1.EventType_EVENT_TYPE_SYNCED:
		if !w.watchList {
			return true // a plain watch from "" sends the initial state as ADDED only
		}
		return w.send(watch.Event{Type: watch.Bookmark, Object: w.bookmark(ev, true)})
	case informerdv1.EventType_EVENT_TYPE_RESET:
		st := apierrors.NewResourceExpired("informerd: the resume point left the daemon's event log; relist").ErrStatus
		w.send(watch.Event{Type: watch.Error, Object: &st})
		return false
	default:
		return true
	}
	obj, err := w.decode(ev.GetObject())
	if err != nil {
		st := apierrors.NewInternalError(err).ErrStatus
		w.send(watch.Event{Type: watch.Error, Object: &st})
		return false
	}
	return w.send(watch.Event{Type: t, Object: obj})
}

// bookmark returns the object of a BOOKMARK or SYNCED event: the daemon
// sends one of the resource's kind (the reflector checks the type).
func (w *streamWatch) bookmark(ev *informerdv1.Event, initialEventsEnd bool) runtime.Object {
	b, err := w.decode(ev.GetObject())
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
