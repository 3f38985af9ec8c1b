package status

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/engine"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/cache"
)

// source is where the Engine's feeds come from: a cache.Manager, or a fake
// in unit tests.
type source interface {
	// ResolveResource returns the resource req names and whether it is
	// namespaced, as cache.Manager.ResolveResource.
	ResolveResource(ctx context.Context, req cache.Request) (schema.GroupVersionResource, bool, error)
	Subscribe(ctx context.Context, req cache.Request) (subscription, error)
}

// subscription is the part of a cache.Subscription the Engine uses.
type subscription interface {
	Next(ctx context.Context, max int) ([]*cache.Event, error)
	Get(namespace, name string) (*cache.Object, bool)
	Close()
}

type managerSource struct{ m *cache.Manager }

func (s managerSource) ResolveResource(ctx context.Context, req cache.Request) (schema.GroupVersionResource, bool, error) {
	return s.m.ResolveResource(ctx, req)
}

func (s managerSource) Subscribe(ctx context.Context, req cache.Request) (subscription, error) {
	sub, err := s.m.Subscribe(ctx, req)
	if err != nil {
		return nil, err
	}
	return sub, nil
}

// holder names the Engine's subscriptions in the informers' introspection.
const holder = "informerd-status"

// Engine computes the status of the objects that Watches ask for. Create
// it with New; Close it after the last Watch's stream has ended and before
// the cache.Manager closes.
type Engine struct {
	src     source
	log     *slog.Logger
	metrics *metrics
	reader  engine.StatusReader
	ops     chan func()     // run on the loop
	feedCh  chan feedMsg    // from the feeds' goroutines
	ctx     context.Context // ended by Close; parent of every feed
	cancel  context.CancelFunc
	done    chan struct{}  // closed when the loop has returned
	feedWG  sync.WaitGroup // the feeds' goroutines

	// Owned by the loop:
	targets map[object.ObjMetadata]*target
	feeds   map[feedKey]*feed
	watches map[*Watch]struct{}
	// dirty targets are recomputed at the end of the loop's iteration; the
	// value is true when a change (not a timer) made them dirty.
	dirty map[*target]bool
	// timed targets have an unschedulable re-check due; held targets have
	// a change whose recomputation waits until the time given (coalesce);
	// timer fires at the earliest of both.
	timed       map[*target]struct{}
	held        map[*target]time.Time
	timer       *time.Timer
	timedChange bool
	// holdFor is how long after a computation that took cost a change
	// waits before its object is computed again: coalesce, or a fixed
	// interval in tests.
	holdFor func(cost time.Duration) time.Duration
}

// A change to an object whose status was computed less than
// coalesceFactor times that computation's duration ago (at most
// coalesceMax) is computed once that time has passed, together with every
// other change to it meanwhile: an object spends at most about
// 1/(coalesceFactor+1) of the loop's time, whatever its number of
// generated resources and however often they change (a 1,000-replica
// Deployment rolling out), and the objects that are cheap to compute (for
// which that time is microseconds) are computed at once.
const (
	coalesceFactor = 20
	coalesceMax    = 250 * time.Millisecond
)

func coalesce(cost time.Duration) time.Duration { return min(coalesceFactor*cost, coalesceMax) }

// target is one object some Watch asks for, with its shared status.
type target struct {
	id   object.ObjMetadata
	feed *feed   // the object's kind in its namespace
	gen  []*feed // the kinds generated from it, in its namespace
	// watches want its status; delivered once they may read all its feeds.
	watches map[*Watch]struct{}
	// status is nil until first computed; then shared, never modified.
	status *event.ResourceStatus
	// objects are what status was computed from (Status.Objects).
	objects map[object.ObjMetadata][]byte
	deps    []dep     // the lists status was computed from
	due     time.Time // unschedulable re-check, or zero
	// computed is when status was last computed, and cost how long that
	// took: a change waits until computed+holdFor(cost).
	computed time.Time
	cost     time.Duration
}

func (t *target) feeds() []*feed { return append([]*feed{t.feed}, t.gen...) }

func (t *target) genFeed(gk schema.GroupKind) *feed {
	for _, f := range t.gen {
		if f.key.gk == gk {
			return f
		}
	}
	return nil
}

// lists reports whether a change to o in f can change t's status: o is in
// a list t's status came from, or matches one.
func (t *target) lists(f *feed, o *cache.Object) bool {
	for _, d := range t.deps {
		if d.feed != f {
			continue
		}
		if _, ok := d.names[o.Name]; ok || d.sel.Matches(o.Labels) {
			return true
		}
	}
	return false
}

// New starts an Engine.
func New(opts Options) (*Engine, error) {
	if opts.Cache == nil {
		return nil, errors.New("status: Options.Cache is required")
	}
	return newEngine(opts, managerSource{opts.Cache}), nil
}

func newEngine(opts Options, src source) *Engine {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	e := &Engine{
		src: src, log: opts.Logger, metrics: newMetrics(opts.Registerer), reader: newReader(),
		ops: make(chan func()), feedCh: make(chan feedMsg), done: make(chan struct{}),
		targets: map[object.ObjMetadata]*target{}, feeds: map[feedKey]*feed{}, watches: map[*Watch]struct{}{},
		dirty: map[*target]bool{}, timed: map[*target]struct{}{}, held: map[*target]time.Time{},
		holdFor: coalesce,
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	go e.run()
	return e
}

// Close stops the Engine: every Watch ends with ErrStopped and every feed
// releases its subscription. It waits for the Engine's goroutines.
func (e *Engine) Close() {
	e.cancel()
	<-e.done
}

// Watch starts a Watch of req. The caller must Close it.
func (e *Engine) Watch(ctx context.Context, req Request) (*Watch, error) {
	w := &Watch{
		e: e, req: req, strategy: resolveStrategy(req.Strategy, req.IDs),
		access:  map[Access]bool{},
		sent:    map[*target]*event.ResourceStatus{},
		pending: map[object.ObjMetadata]Status{},
		wake:    make(chan struct{}, 1),
	}
	if err := e.send(ctx, func() { e.register(w) }); err != nil {
		return nil, err
	}
	return w, nil
}

// send runs op on the loop.
func (e *Engine) send(ctx context.Context, op func()) error {
	select {
	case e.ops <- op:
		return nil
	case <-e.ctx.Done():
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run is the loop: it owns targets, feeds and watches.
func (e *Engine) run() {
	defer close(e.done)
	defer e.stop()
	for {
		var timerC <-chan time.Time
		if e.timer != nil {
			timerC = e.timer.C
		}
		select {
		case <-e.ctx.Done():
			return
		case op := <-e.ops:
			op()
		case m := <-e.feedCh:
			e.onFeed(m)
		case <-timerC:
			e.timer = nil
			e.onTimer()
		}
		e.flush()
	}
}

// stop ends every Watch and feed.
func (e *Engine) stop() {
	for w := range e.watches {
		w.fail(ErrStopped)
	}
	for _, f := range e.feeds {
		f.cancel()
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	e.feedWG.Wait()
}

// register adds w's objects, starting the feeds they need.
func (e *Engine) register(w *Watch) {
	e.watches[w] = struct{}{}
	seen := make(map[object.ObjMetadata]bool, len(w.req.IDs))
	for _, id := range w.req.IDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		t := e.targets[id]
		if t == nil {
			t = e.addTarget(id)
		}
		t.watches[w] = struct{}{}
		w.targets = append(w.targets, t)
	}
	for _, t := range w.targets {
		e.needAccess(w, t.feed, false)
		for _, f := range t.gen {
			e.needAccess(w, f, true)
		}
		e.deliver(w, t)
	}
	e.checkSynced(w)
}

func (e *Engine) addTarget(id object.ObjMetadata) *target {
	t := &target{id: id, watches: map[*Watch]struct{}{}}
	t.feed = e.acquire(feedKey{id.GroupKind, id.Namespace})
	t.feed.targets[t] = struct{}{}
	for _, gk := range generated[id.GroupKind] {
		f := e.acquire(feedKey{gk, id.Namespace})
		f.dependents[t] = struct{}{}
		t.gen = append(t.gen, f)
	}
	e.targets[id] = t
	e.metrics.objects.Inc()
	if t.feed.known() {
		e.dirty[t] = true
	}
	return t
}

// unregister removes w, and the objects and feeds only it needed.
func (e *Engine) unregister(w *Watch) {
	if _, ok := e.watches[w]; !ok {
		return
	}
	delete(e.watches, w)
	for _, t := range w.targets {
		delete(t.watches, w)
		delete(w.sent, t)
		if len(t.watches) > 0 {
			continue
		}
		delete(e.targets, t.id)
		delete(e.dirty, t)
		if _, ok := e.timed[t]; ok {
			delete(e.timed, t)
			e.timedChange = true
		}
		if _, ok := e.held[t]; ok {
			delete(e.held, t)
			e.timedChange = true
		}
		e.metrics.objects.Dec()
		setDeps(t, nil)
		delete(t.feed.targets, t)
		e.release(t.feed)
		for _, f := range t.gen {
			delete(f.dependents, t)
			e.release(f)
		}
	}
	w.targets = nil
}

// grant records that w's caller may read access, lets feeds waiting for it
// start, and delivers what it unblocks.
func (e *Engine) grant(w *Watch, access []Access) {
	if _, ok := e.watches[w]; !ok {
		return
	}
	for _, a := range access {
		if _, ok := w.access[a]; ok {
			w.access[a] = true
		}
	}
	for _, t := range w.targets {
		for i, f := range t.feeds() {
			if f.gvrKnown() && w.access[w.accessOf(f, i > 0)] {
				f.grant()
			}
		}
		e.deliver(w, t)
	}
	e.checkSynced(w)
}

// needAccess reports f's Access to w if f's resource is known and w has not
// been told yet; if w has granted it already, f may start.
func (e *Engine) needAccess(w *Watch, f *feed, generated bool) {
	if !f.gvrKnown() {
		return
	}
	a := w.accessOf(f, generated)
	granted, reported := w.access[a]
	switch {
	case !reported:
		w.access[a] = false
		w.reportAccess(a)
	case granted:
		f.grant()
	}
}

// deliverable reports whether w may receive t's status: w's caller may read
// every feed of t whose resource exists.
func (e *Engine) deliverable(w *Watch, t *target) bool {
	for i, f := range t.feeds() {
		if f.state == feedAbsent {
			continue
		}
		if !f.gvrKnown() || !w.access[w.accessOf(f, i > 0)] {
			return false
		}
	}
	return true
}

// deliver pushes t's status to w if it is known, w may see it and w was
// not given it already.
func (e *Engine) deliver(w *Watch, t *target) {
	if t.status != nil && w.sent[t] != t.status && e.deliverable(w, t) {
		w.sent[t] = t.status
		w.push(Status{ResourceStatus: t.status, Objects: t.objects})
	}
}

// checkSynced marks w synced once every object's status was delivered.
func (e *Engine) checkSynced(w *Watch) {
	if w.syncedLoop {
		return
	}
	for ; w.ready < len(w.targets); w.ready++ {
		t := w.targets[w.ready]
		if t.status == nil || w.sent[t] == nil {
			return
		}
	}
	w.syncedLoop = true
	w.setSynced()
}

// flush recomputes the dirty targets, except those whose change waits
// (holdFor), and re-arms the timer.
func (e *Engine) flush() {
	var touched map[*Watch]struct{}
	if len(e.dirty) > 0 {
		touched = map[*Watch]struct{}{}
	}
	now := time.Now()
	for t, changed := range e.dirty {
		delete(e.dirty, t)
		if !t.feed.known() || (t.feed.state == feedSynced && !allKnown(t.gen)) {
			continue // recomputed when its feeds are
		}
		if _, ok := e.held[t]; ok {
			if changed {
				continue // computed when its hold ends, with this change
			}
			// An unschedulable re-check: computed now, with the held change.
			delete(e.held, t)
			e.timedChange, changed = true, true
		} else if changed && t.status != nil {
			if until := t.computed.Add(e.holdFor(t.cost)); until.After(now) {
				e.held[t] = until
				e.timedChange = true
				continue
			}
		}
		if e.compute(t, changed) {
			for w := range t.watches {
				touched[w] = struct{}{}
			}
		}
	}
	for w := range touched {
		e.checkSynced(w)
	}
	if e.timedChange {
		e.timedChange = false
		e.armTimer()
	}
}

func allKnown(fs []*feed) bool {
	for _, f := range fs {
		if !f.known() {
			return false
		}
	}
	return true
}

// compute recomputes t's status and delivers it if it changed; it reports
// whether it did. A change restarts the unschedulable timer.
func (e *Engine) compute(t *target, changed bool) bool {
	e.metrics.computations.Inc()
	t.computed = time.Now()
	rs, objects, unsched := e.read(t)
	t.cost = time.Since(t.computed)
	if changed || !unsched {
		if !t.due.IsZero() {
			t.due = time.Time{}
			delete(e.timed, t)
			e.timedChange = true
		}
	}
	if unsched && t.due.IsZero() {
		t.due = time.Now().Add(kstatus.ScheduleWindow)
		e.timed[t] = struct{}{}
		e.timedChange = true
	}
	if t.status != nil && equal(t.status, rs) {
		return false
	}
	t.status, t.objects = rs, objects
	e.metrics.changes.Inc()
	for w := range t.watches {
		e.deliver(w, t)
	}
	return true
}

// read computes t's status from the feeds with cli-utils' status readers,
// and returns it with the objects it was computed from (the cache's bytes).
func (e *Engine) read(t *target) (*event.ResourceStatus, map[object.ObjMetadata][]byte, bool) {
	if t.feed.state != feedSynced {
		setDeps(t, nil)
		return notFound(t.id), nil, false
	}
	o, ok := t.feed.sub.Get(t.id.Namespace, t.id.Name)
	if !ok {
		setDeps(t, nil)
		return notFound(t.id), nil, false
	}
	objects := map[object.ObjMetadata][]byte{t.id: o.Bytes()}
	u, err := decode(o.Data)
	if err != nil {
		return &event.ResourceStatus{Identifier: t.id, Status: kstatus.UnknownStatus, Error: err}, nil, false
	}
	cr := &clusterReader{t: t, objects: objects}
	rs, err := e.reader.ReadStatusForObject(e.ctx, cr, u)
	setDeps(t, cr.deps)
	if err != nil {
		return &event.ResourceStatus{Identifier: t.id, Status: kstatus.UnknownStatus, Resource: identity(u), Error: err}, objects, false
	}
	return summarize(rs), objects, unschedulable(rs)
}

// onTimer marks the targets whose unschedulable re-check is due, or whose
// hold has ended.
func (e *Engine) onTimer() {
	now := time.Now()
	for t, until := range e.held {
		if !until.After(now) {
			delete(e.held, t)
			e.dirty[t] = true
		}
	}
	for t := range e.timed {
		if !t.due.After(now) {
			t.due = time.Time{}
			delete(e.timed, t)
			if _, pending := e.dirty[t]; !pending {
				e.dirty[t] = false // a re-check, not a change
			}
		}
	}
	e.timedChange = true
}

func (e *Engine) armTimer() {
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	var next time.Time
	for t := range e.timed {
		if next.IsZero() || t.due.Before(next) {
			next = t.due
		}
	}
	for _, until := range e.held {
		if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	if !next.IsZero() {
		e.timer = time.NewTimer(time.Until(next))
	}
}

// onFeed handles a message from a feed's goroutine.
func (e *Engine) onFeed(m feedMsg) {
	f := m.f
	if e.feeds[f.key] != f {
		return // released since
	}
	switch m.kind {
	case msgAbsent:
		f.setAbsent()
		e.dirtyAll(f)
	case msgResolved:
		f.gvr, f.state, f.granted = m.gvr, feedResolved, m.granted
		for t := range f.targets {
			for w := range t.watches {
				e.needAccess(w, f, false)
			}
		}
		for t := range f.dependents {
			for w := range t.watches {
				e.needAccess(w, f, true)
			}
		}
	case msgSubscribed:
		f.sub, f.state, f.podStatuses = m.sub, feedSyncing, nil
		f.objects.reset() // a snapshot follows
	case msgEvents:
		e.onEvents(f, m.evs)
	case msgLost:
		f.sub = nil
		f.objects.reset()
		if errors.Is(m.err, cache.ErrResourceRemoved) {
			e.log.Info("resource removed: its objects are NotFound until it is served again", "kind", f.key.gk, "err", m.err)
			f.setAbsent()
			e.dirtyAll(f)
			return
		}
		f.state = feedResolving
		e.failWatches(f, m.err)
	case msgFailed:
		switch {
		case apierrors.IsForbidden(m.err):
			e.failWatches(f, fmt.Errorf("%w: %s in namespace %q: %w", ErrForbidden, f.key.gk, f.key.namespace, m.err))
			return
		case errors.Is(m.err, cache.ErrLimit), errors.Is(m.err, cache.ErrRejected):
			e.failWatches(f, m.err) // retrying would not help these Watches
			return
		}
		e.log.Info("status feed failed: retrying", "kind", f.key.gk, "namespace", f.key.namespace, "err", m.err)
	}
}

// onEvents applies a batch of a feed's events: a change to a watched
// object, or to an object a target's status listed, makes it dirty.
func (e *Engine) onEvents(f *feed, evs []*cache.Event) {
	for _, ev := range evs {
		switch ev.Type {
		case cache.Reset:
			f.state, f.podStatuses = feedSyncing, nil
			f.objects.reset()
		case cache.Synced:
			f.state = feedSynced
			e.dirtyAll(f)
		case cache.Added, cache.Modified, cache.Deleted:
			o := ev.Object
			switch {
			case !f.listed:
			case ev.Type == cache.Deleted:
				f.objects.remove(o)
			default:
				f.objects.put(o)
			}
			if f.state != feedSynced {
				continue // a snapshot: Synced follows
			}
			if ev.Type == cache.Deleted {
				delete(f.podStatuses, o.Name)
			}
			if t := e.targets[object.ObjMetadata{GroupKind: f.key.gk, Namespace: o.Namespace, Name: o.Name}]; t != nil && t.feed == f {
				e.dirty[t] = true
			}
			f.listers.listers(f, o, func(t *target) { e.dirty[t] = true })
		}
	}
}

func (e *Engine) dirtyAll(f *feed) {
	for t := range f.targets {
		e.dirty[t] = true
	}
	for t := range f.dependents {
		e.dirty[t] = true
	}
}

// watchesOf returns the Watches that read f.
func (e *Engine) watchesOf(f *feed) map[*Watch]struct{} {
	ws := map[*Watch]struct{}{}
	for _, ts := range []map[*target]struct{}{f.targets, f.dependents} {
		for t := range ts {
			for w := range t.watches {
				ws[w] = struct{}{}
			}
		}
	}
	return ws
}

func (e *Engine) failWatches(f *feed, err error) {
	for w := range e.watchesOf(f) {
		w.fail(err)
	}
}
