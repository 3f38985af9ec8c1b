package status

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/backoff"
)

// feedKey names a feed: the objects of one kind in one namespace ("" for
// a cluster-scoped kind).
type feedKey struct {
	gk        schema.GroupKind
	namespace string
}

type feedState uint8

const (
	feedResolving feedState = iota // looking up the resource
	feedAbsent                     // the API server does not serve it
	feedResolved                   // known; waiting for a Watch to grant it
	feedSyncing                    // subscribed; the snapshot is not complete
	feedSynced
)

// feed is one cache Subscription the Engine holds while some target needs
// it. Its goroutine resolves the resource, waits for a grant, subscribes
// and forwards the events to the loop; the loop owns the fields.
type feed struct {
	key    feedKey
	cancel context.CancelFunc
	// granted, set in feedResolved, is closed once a Watch may read gvr:
	// only then does the goroutine subscribe to it (which starts an
	// upstream informer). Each resolution brings a channel of its own, so
	// that a resource resolved again to another version (its CRD was
	// re-created) needs a grant of its own; nil once closed.
	granted    chan struct{}
	state      feedState
	gvr        schema.GroupVersionResource // set from feedResolved on
	sub        subscription                // set in feedSyncing and feedSynced
	targets    map[*target]struct{}        // objects of this kind
	dependents map[*target]struct{}        // objects that list this kind
	// objects are the feed's objects as its events left them, once a
	// snapshot started, if its kind is one the readers list (listed):
	// ListNamespaceScoped reads them. listers are the dependents' lists
	// of them: onEvents finds a change's dependents there.
	listed  bool
	objects objectIndex
	listers depIndex
	// podStatuses are the statuses of the generated Pods some target
	// listed (a feed of Pods), by name, at the resourceVersion they were
	// computed at (podStatuses, reader.go). An entry goes with its Pod's
	// deletion, and all with the subscription.
	podStatuses map[string]*podStatus
}

// known reports whether the objects' state is known: synced, or absent.
func (f *feed) known() bool { return f.state == feedAbsent || f.state == feedSynced }

func (f *feed) gvrKnown() bool { return f.state >= feedResolved }

// grant lets f's goroutine subscribe to f.gvr: call it only in
// feedResolved or later.
func (f *feed) grant() {
	if f.granted != nil {
		close(f.granted)
		f.granted = nil
	}
}

func (f *feed) setAbsent() {
	f.state, f.gvr, f.sub, f.granted, f.podStatuses = feedAbsent, schema.GroupVersionResource{}, nil, nil, nil
	f.objects.reset()
}

// acquire returns the feed for key, starting it if needed.
func (e *Engine) acquire(key feedKey) *feed {
	if f := e.feeds[key]; f != nil {
		return f
	}
	ctx, cancel := context.WithCancel(e.ctx)
	f := &feed{
		key: key, cancel: cancel, listed: listedKinds[key.gk],
		targets: map[*target]struct{}{}, dependents: map[*target]struct{}{},
	}
	e.feeds[key] = f
	e.metrics.feeds.Inc()
	e.feedWG.Add(1)
	go func() {
		defer e.feedWG.Done()
		e.runFeed(ctx, f)
	}()
	return f
}

// release stops f once no target needs it.
func (e *Engine) release(f *feed) {
	if len(f.targets) > 0 || len(f.dependents) > 0 {
		return
	}
	f.cancel()
	delete(e.feeds, f.key)
	e.metrics.feeds.Dec()
}

type feedMsgKind uint8

const (
	msgAbsent     feedMsgKind = iota // the resource is not served
	msgResolved                      // gvr is the resource; closing granted lets the feed subscribe to it
	msgSubscribed                    // sub reads it; a snapshot follows
	msgEvents                        // evs from sub
	msgLost                          // sub ended with err
	msgFailed                        // resolving or subscribing failed with err; retrying
)

type feedMsg struct {
	f       *feed
	kind    feedMsgKind
	gvr     schema.GroupVersionResource
	granted chan struct{}
	sub     subscription
	evs     []*cache.Event
	err     error
}

// feedBatch bounds the events a feed forwards at once.
const feedBatch = 256

// runFeed is a feed's goroutine; it returns when ctx ends (the feed was
// released, or the Engine closed) or the cache stops.
func (e *Engine) runFeed(ctx context.Context, f *feed) {
	send := func(m feedMsg) bool {
		m.f = f
		select {
		case e.feedCh <- m:
			return true
		case <-ctx.Done():
			return false
		}
	}
	req := cache.Request{GVR: schema.GroupVersionResource{Group: f.key.gk.Group}, Kind: f.key.gk.Kind, Namespace: f.key.namespace, Holder: holder, Owner: cache.OwnerInternal}
	retry := backoff.Backoff{Initial: time.Second, Max: 30 * time.Second}
	pause := func() bool { return retry.Wait(ctx) == nil }
	for ctx.Err() == nil {
		gvr, namespaced, err := e.src.ResolveResource(ctx, req)
		if errors.Is(err, cache.ErrUnknownResource) {
			if !send(feedMsg{kind: msgAbsent}) {
				return
			}
			wait := req
			wait.WaitForResource = true
			gvr, namespaced, err = e.src.ResolveResource(ctx, wait)
		}
		if err != nil {
			if ctx.Err() != nil || !send(feedMsg{kind: msgFailed, err: err}) || !pause() {
				return
			}
			continue
		}
		if !namespaced && f.key.namespace != "" {
			// An object of a cluster-scoped kind named in a namespace does
			// not exist, as the API server answers 404 for its path:
			// NotFound, with nothing read or authorized for it.
			if send(feedMsg{kind: msgAbsent}) {
				<-ctx.Done()
			}
			return
		}
		// The grant is of gvr, this resolution's: the subscription is of
		// that version, not whichever the API server prefers by then.
		granted := make(chan struct{})
		if !send(feedMsg{kind: msgResolved, gvr: gvr, granted: granted}) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-granted:
		}
		exact := req
		exact.GVR.Version = gvr.Version
		sub, err := e.src.Subscribe(ctx, exact)
		switch {
		case errors.Is(err, cache.ErrUnknownResource), errors.Is(err, cache.ErrResourceRemoved):
			// Gone again, or removed while discovery still lists it.
			if !send(feedMsg{kind: msgAbsent}) || !pause() {
				return
			}
			continue
		case err != nil:
			if ctx.Err() != nil || !send(feedMsg{kind: msgFailed, err: err}) || !pause() {
				return
			}
			continue
		}
		err = e.forward(ctx, sub, send)
		sub.Close()
		if ctx.Err() != nil || errors.Is(err, cache.ErrStopped) {
			return
		}
		retry.Reset() // it worked: the next failure starts over
	}
}

// forward sends sub's events to the loop until sub ends; the loop has been
// told (msgLost) when it returns, unless ctx ended.
func (e *Engine) forward(ctx context.Context, sub subscription, send func(feedMsg) bool) error {
	if !send(feedMsg{kind: msgSubscribed, sub: sub}) {
		return ctx.Err()
	}
	for {
		evs, err := sub.Next(ctx, feedBatch)
		if err != nil {
			if ctx.Err() == nil {
				send(feedMsg{kind: msgLost, err: err})
			}
			return err
		}
		if !send(feedMsg{kind: msgEvents, evs: evs}) {
			return ctx.Err()
		}
	}
}
