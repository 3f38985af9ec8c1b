// Package resumetest breaks clients' watches at a chosen point, for tests
// of the rules by which clients resume: client.Watcher and the client-go
// adapters (through a gRPC stream that fails, Breaker.DialOption) and
// client-go's reflector (through a watch that ends, BreakingLW). Tests
// only: nothing else imports it.
package resumetest

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// Breaker breaks one client's connection once: right after the K-th
// object event that follows the client's initial state (the first SYNCED
// on its streams, or, for BreakingLW, the start of the reflector's first
// watch after a List or the end of a WatchList's initial events). Safe for
// concurrent use.
type Breaker struct {
	K int

	mu    sync.Mutex // guards the fields below
	armed bool
	n     int
	done  bool
}

// Broke reports whether the break happened.
func (b *Breaker) Broke() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

// arm starts the count.
func (b *Breaker) arm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = true
}

// object counts an object event; it reports whether it is the K-th since
// the count started (then the break is due).
func (b *Breaker) object() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.armed || b.done {
		return false
	}
	b.n++
	b.done = b.n == b.K
	return b.done
}

// cut counts the events of resp, truncating it after the K-th object
// event; it reports whether it did.
func (b *Breaker) cut(resp *informerdv1.WatchResponse) bool {
	for i, e := range resp.Events {
		switch e.GetType() {
		case informerdv1.EventType_EVENT_TYPE_SYNCED:
			b.arm()
		case informerdv1.EventType_EVENT_TYPE_ADDED, informerdv1.EventType_EVENT_TYPE_MODIFIED, informerdv1.EventType_EVENT_TYPE_DELETED:
			if b.object() {
				resp.Events = resp.Events[:i+1]
				return true
			}
		}
	}
	return false
}

// DialOption makes a client's streams break as b says: the stream it cuts
// fails UNAVAILABLE after the truncated batch, as a broken connection.
func (b *Breaker) DialOption() grpc.DialOption {
	return grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &breakingStream{ClientStream: s, b: b}, nil
	})
}

type breakingStream struct {
	grpc.ClientStream
	b   *Breaker
	cut bool // owned by the goroutine that receives
}

func (s *breakingStream) RecvMsg(m any) error {
	if s.cut {
		return status.Error(codes.Unavailable, "resumetest: the connection broke")
	}
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	if resp, ok := m.(*informerdv1.WatchResponse); ok {
		s.cut = s.b.cut(resp)
	}
	return nil
}

// BreakingLW is a client-go ListerWatcher that counts the reflector's
// requests for an initial state (a LIST, or a watch with initial events)
// and, with a Breaker, ends its watch (closing its channel, as at its
// timeoutSeconds) right after the Breaker's K-th object event: the
// reflector then watches again from the resourceVersion of the last
// object it received.
type BreakingLW struct {
	client.ListerWatcher
	Breaker *Breaker // nil: no break

	mu    sync.Mutex // guards lists
	lists int
}

// Initial returns how many times the reflector asked for an initial state.
func (lw *BreakingLW) Initial() int {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.lists
}

func (lw *BreakingLW) counted() {
	lw.mu.Lock()
	lw.lists++
	lw.mu.Unlock()
}

// List is ListWithContext without a context.
func (lw *BreakingLW) List(o metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.Background(), o)
}

// ListWithContext counts a request for an initial state.
func (lw *BreakingLW) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	lw.counted()
	return lw.ListerWatcher.ListWithContext(ctx, o)
}

// Watch is WatchWithContext without a context.
func (lw *BreakingLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.Background(), o)
}

// WatchWithContext opens the watch, which ends where the Breaker says.
func (lw *BreakingLW) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	initial := o.SendInitialEvents != nil && *o.SendInitialEvents
	if initial {
		lw.counted()
	}
	w, err := lw.ListerWatcher.WatchWithContext(ctx, o)
	if err != nil || lw.Breaker == nil {
		return w, err
	}
	if !initial {
		lw.Breaker.arm() // after a List: the watch brings changes only
	}
	bw := &breakingWatch{inner: w, out: make(chan watch.Event), stop: make(chan struct{}), done: make(chan struct{})}
	go bw.run(lw.Breaker) // ends when inner ends, is cut, or Stop
	return bw, nil
}

type breakingWatch struct {
	inner    watch.Interface
	out      chan watch.Event
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{} // closed when run has returned
}

func (w *breakingWatch) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

func (w *breakingWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *breakingWatch) run(b *Breaker) {
	defer close(w.done)
	defer close(w.out)
	defer w.inner.Stop()
	for {
		var e watch.Event
		var ok bool
		select {
		case e, ok = <-w.inner.ResultChan():
			if !ok {
				return
			}
		case <-w.stop:
			return
		}
		select {
		case w.out <- e:
		case <-w.stop:
			return
		}
		switch e.Type {
		case watch.Bookmark:
			if m, ok := e.Object.(metav1.Object); ok && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				b.arm() // the end of a WatchList's initial events
			}
		case watch.Added, watch.Modified, watch.Deleted:
			if b.object() {
				return
			}
		}
	}
}
