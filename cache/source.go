package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/informerd/informerd/internal/backoff"
	"github.com/informerd/informerd/internal/quote"
	"github.com/informerd/informerd/internal/snapdiff"
)

// SourceState is a Source's sync state.
type SourceState string

// Source states.
const (
	StateSyncing SourceState = "syncing"
	StateSynced  SourceState = "synced"
	// StateStale: synced once, but the upstream watch is failing; the
	// store is served as it is.
	StateStale   SourceState = "stale"
	StateStopped SourceState = "stopped"
)

// Source is one upstream list+watch with its event log. It is created and
// stopped by a Manager; subscribers read it through Subscriptions.
type Source struct {
	key Key
	// apiVersion and kind of the resource, for markers.
	apiVersion, kind string
	cfg              sourceConfig
	up               upstream
	log              *slog.Logger
	hooks            *metrics
	// cancel ends run; a cause that is ErrResourceRemoved becomes the
	// terminal error its subscribers get (else ErrStopped).
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run returns

	mu     sync.Mutex // guards the fields below
	events *eventLog
	synced bool
	state  SourceState
	// opaque is set once the API server sent a resourceVersion that is not
	// a number (an aggregated API may): positions are then not compared,
	// and every resume is a snapshot.
	opaque bool
	// lastErr is the latest upstream error (nil after a success).
	lastErr error
	// refused names the last object refused for its size, for status.
	refused string
	// terminal is set when the Source will publish nothing more.
	terminal error
	// eventsIn counts the events received from the API server, as the
	// informerd_events_in_total metric does.
	eventsIn uint64
	// notify is closed and replaced whenever anything above changes.
	notify chan struct{}
	// subs are the open subscriptions, whose cursors give the lag.
	subs map[*Subscription]struct{}
	// seed is the state a handoff gave the Source, which its first list
	// takes (nil: none, or taken).
	seed *seed
	// frozen is closed by thaw; while it is not nil the Source is frozen
	// and run parks (handoff.go). parked is closed by run once parked.
	// opCancel ends run's current request.
	frozen, parked chan struct{}
	opCancel       context.CancelFunc
}

// sourceConfig is what a Manager gives each of its Sources.
type sourceConfig struct {
	limits LogLimits
	budget *logBudget // may be nil
	// idleTimeout bounds how long a watch may bring nothing.
	idleTimeout time.Duration
	// maxObjectBytes refuses larger objects; 0: no limit.
	maxObjectBytes int
	log            *slog.Logger
	metrics        *metrics
	// recovery, if not nil, cuts a backoff short when the API server is
	// reported back, and is told whenever the Source hears from it.
	recovery *recovery
}

func newSource(key Key, up upstream, cfg sourceConfig) *Source {
	return &Source{
		key: key, cfg: cfg, up: up, log: cfg.log.With("informer", key.String()), hooks: cfg.metrics,
		done:   make(chan struct{}),
		events: newEventLog(cfg.limits, cfg.budget, time.Now),
		state:  StateSyncing,
		notify: make(chan struct{}),
		subs:   map[*Subscription]struct{}{},
	}
}

// start runs the list+watch loop until stop.
func (s *Source) start(parent context.Context) {
	ctx, cancel := context.WithCancelCause(parent)
	s.cancel = cancel
	go func() {
		defer close(s.done)
		err := s.run(ctx)
		if err == nil || ctx.Err() != nil {
			err = ErrStopped
			if cause := context.Cause(ctx); errors.Is(cause, ErrResourceRemoved) {
				err = cause
			}
		}
		s.mu.Lock()
		s.terminal = err
		s.state = StateStopped
		s.hooks.objects.Sub(float64(s.events.len()))
		s.events.release()
		s.broadcastLocked()
		s.mu.Unlock()
	}()
}

// stopped reports whether the Source will publish nothing more.
func (s *Source) stopped() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// stop ends the loop and waits for it. Subscribers get ErrStopped.
func (s *Source) stop() {
	s.cancel(nil)
	<-s.done
}

// removed ends the loop without waiting for it: its resource is gone
// (err, an ErrResourceRemoved), which its subscribers get once they have
// read what was published before. It takes no lock.
func (s *Source) removed(err error) { s.cancel(err) }

func (s *Source) broadcastLocked() {
	close(s.notify)
	s.notify = make(chan struct{})
}

// newUpstreamBackoff is the reflector's backoff: 800ms doubling to 30s,
// jittered, reset after a list, or a watch, that delivered something.
func newUpstreamBackoff() *backoff.Backoff {
	return &backoff.Backoff{Initial: 800 * time.Millisecond, Max: 30 * time.Second}
}

// action is what the loop does after an upstream error.
type action int

const (
	retryWatch action = iota // back off, watch again from the same resourceVersion
	relist                   // list again and publish the difference
	giveUp                   // terminal: tell subscribers and stop
	reject                   // terminal: the request itself is invalid
)

// classify sorts upstream errors, in one place:
//   - 410 Gone / Expired, and "too large resource version": the position is
//     unusable; relist and publish the difference.
//   - 404 NotFound on the collection: the resource is gone (its CRD was
//     deleted): terminal.
//   - 405 MethodNotAllowed: the resource cannot be listed or watched:
//     terminal.
//   - 400 BadRequest and 422 Invalid: the API server rejects the request
//     itself (a field selector it does not support): terminal, with its
//     message. (A 400 to WatchList's parameters never gets here: list
//     falls back to LIST first.)
//   - everything else (network errors, 429, 5xx, 403 while RBAC catches
//     up): back off and retry; the Source is stale meanwhile.
func classify(err error) action {
	switch {
	case apierrors.IsResourceExpired(err), apierrors.IsGone(err),
		apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge):
		return relist
	case apierrors.IsNotFound(err), apierrors.IsMethodNotSupported(err):
		return giveUp
	case apierrors.IsBadRequest(err), apierrors.IsInvalid(err):
		return reject
	}
	return retryWatch
}

// run lists, then watches; it returns only with a terminal error or when
// ctx ends. A Source restored from a handoff (seed) starts at the state
// handed off instead of a list: it watches from its position at once,
// and lists only if the API server answers 410. While the Source is
// frozen (handoff.go) it parks between requests.
func (s *Source) run(ctx context.Context) error {
	bo := newUpstreamBackoff()
	rv := ""
	needList := true
	for ctx.Err() == nil {
		if !s.parkWhileFrozen(ctx) {
			return nil
		}
		// op is the context of one request, and of the wait after it
		// fails: a freeze ends it (and then the loop parks, nothing
		// recorded of the cut).
		op, done := s.opContext(ctx)
		if needList {
			objs, listRV, seeded := s.takeSeed()
			var err error
			if !seeded {
				s.hooks.upstreamLists.Inc()
				objs, listRV, err = s.up.list(op)
			}
			if err != nil {
				if op.Err() != nil {
					done()
					continue // ctx ended, or a freeze
				}
				switch classify(err) {
				case giveUp:
					done()
					return fmt.Errorf("%w: %s is not served by the API server (%w)", ErrResourceRemoved, s.key, err)
				case reject:
					done()
					return rejected(s.key, err)
				}
				s.setErr(err)
				_ = s.pause(op, bo)
				done()
				continue
			}
			if !seeded {
				s.cfg.recovery.mark()
			}
			s.publishList(objs, listRV)
			rv, needList = listRV, false
			bo.Reset()
		}
		s.hooks.upstreamWatches.Inc()
		delivered, err := s.watch(op, rv, &rv)
		if op.Err() != nil {
			done()
			continue
		}
		if delivered {
			// A watch that worked ends the outage: the next error starts
			// the backoff over, as the reflector's does.
			bo.Reset()
		}
		switch classify(err) {
		case relist:
			s.log.Info("resourceVersion too old: relisting", "resourceVersion", rv, "err", err)
			s.hooks.upstreamRelists.Inc()
			needList = true
		case giveUp:
			done()
			return fmt.Errorf("%w: %s is no longer served by the API server; was its CustomResourceDefinition deleted? (%w)", ErrResourceRemoved, s.key, err)
		case reject:
			done()
			return rejected(s.key, err)
		default:
			if err != nil {
				s.log.Info("watch failed: retrying", "err", err)
				s.setErr(err)
				_ = s.pause(op, bo)
			}
		}
		done()
	}
	return nil
}

// rejected returns the terminal error of a Source whose request the API
// server rejected as invalid: ErrRejected and err, the API server's. Its
// message quotes at most quote.Max bytes of the field selector (which a
// client sent) in one place, wherever the key or the API server's message
// repeats it, whole or a field of it.
func rejected(key Key, err error) error {
	fs := key.FieldSelector
	return &rejectedError{
		msg: fmt.Sprintf("%s: %s: %s", ErrRejected, quote.Message(key.String(), fs), quote.Message(err.Error(), fs)),
		err: err,
	}
}

// rejectedError is what rejected returns.
type rejectedError struct {
	msg string
	err error
}

func (e *rejectedError) Error() string   { return e.msg }
func (e *rejectedError) Unwrap() []error { return []error{ErrRejected, e.err} }

// watch consumes one watch until it ends; *rv tracks the position and
// delivered reports whether it brought any event or bookmark. A clean end
// (server timeout) returns a nil error.
//
// A watch that brings nothing (no event, no bookmark; the API server sends
// a bookmark about every minute) for the idle timeout is abandoned, so that
// a hung connection costs at most that long.
func (s *Source) watch(ctx context.Context, from string, rv *string) (delivered bool, err error) {
	ctx, touch, idle, stop := idleContext(ctx, s.cfg.idleTimeout)
	defer stop()
	w, err := s.up.watch(ctx, from)
	if err != nil {
		return false, idleErr(err, idle)
	}
	defer w.close()
	s.setErr(nil) // the API server answers again: no longer stale
	for {
		t, obj, evRV, err := w.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return delivered, nil
			}
			return delivered, idleErr(err, idle)
		}
		touch()
		s.cfg.recovery.mark()
		delivered = true
		s.publishEvent(t, obj, evRV)
		*rv = evRV
	}
}

// errUpstreamIdle: the API server sent nothing within the idle timeout.
var errUpstreamIdle = errors.New("no data from the API server within the idle timeout")

// idleContext returns a context that is cancelled once touch has not been
// called for d, a func that reports whether that happened, and a func that
// releases it.
func idleContext(parent context.Context, d time.Duration) (ctx context.Context, touch func(), idle func() bool, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	t := time.AfterFunc(d, func() { cancel(errUpstreamIdle) })
	return ctx, func() { t.Reset(d) },
		func() bool { return errors.Is(context.Cause(ctx), errUpstreamIdle) },
		func() { t.Stop(); cancel(nil) }
}

// idleErr names the idle timeout as the cause of err when it was.
func idleErr(err error, idle func() bool) error {
	if idle() {
		return fmt.Errorf("%w (%w)", errUpstreamIdle, err)
	}
	return err
}

// setErr records the latest upstream error, or a success (nil): a synced
// Source is stale while its upstream fails.
func (s *Source) setErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.lastErr == nil {
		return
	}
	s.lastErr = err
	if s.synced {
		s.state = StateStale
		if err == nil {
			s.state = StateSynced
		}
	}
	s.broadcastLocked()
}

// position parses an upstream resourceVersion for the log, noting one
// that is not a number (the Source becomes opaque). s.mu must be held.
func (s *Source) positionLocked(rv string) uint64 {
	n, ok := parseRV(rv)
	if !ok && rv != "" && !s.opaque {
		s.opaque = true
		s.log.Info("the API server sends resourceVersions that are not numbers: every resume of this informer is a snapshot", "resourceVersion", rv)
	}
	return n
}

// admitLocked reports whether o is within the size limit. A larger object
// is refused, visibly: logged, counted, and named in the Source's status.
func (s *Source) admitLocked(o *Object) bool {
	if s.cfg.maxObjectBytes <= 0 || len(o.Data) <= s.cfg.maxObjectBytes {
		return true
	}
	s.hooks.objectsRefused.Inc()
	s.refused = fmt.Sprintf("refused %s/%s: %d bytes, over the limit of %d (-max-object-bytes)", o.Namespace, o.Name, len(o.Data), s.cfg.maxObjectBytes)
	s.log.Warn("object too large: not served", "namespace", o.Namespace, "name", o.Name, "bytes", len(o.Data), "limit", s.cfg.maxObjectBytes)
	return false
}

// publishList installs the result of a list. The first one becomes the
// snapshot; later ones (relists) publish only the difference from the
// store, as snapdiff computes it and a watch would have told it: Deleted
// for vanished objects, Deleted then Added for an object deleted and
// created again under its name (another UID), then Added and Modified in
// ascending order of their resourceVersions, then a Bookmark at the list's
// position L. Every event of the difference is logged at L without a
// position of its own, so that a client resuming from the position before
// it, H, or from any resourceVersion in (H, L), replays all of it. A
// deletion carries H in its object (the API server stamps a deleted object
// with its deletion's resourceVersion, which a list does not tell): a
// client that resumes from an object's resourceVersion (client-go's
// reflector) then replays the whole difference after any deletion or any
// object older than L, and resumes after it only from the one object the
// list wrote last (at L), which comes last. No client's position moves
// backwards: H is the newest position any client may have seen.
func (s *Source) publishList(objs []*Object, listRV string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv := s.positionLocked(listRV)
	s.lastErr = nil
	admitted := objs[:0:0]
	for _, o := range objs {
		if s.admitLocked(o) {
			admitted = append(admitted, o)
		}
	}
	if !s.synced {
		s.events.reset(admitted, rv, listRV)
		s.synced, s.state = true, StateSynced
		s.hooks.objects.Add(float64(s.events.len()))
		s.broadcastLocked()
		return
	}
	s.state = StateSynced
	before := s.events.len()
	deletedAt := s.events.lastPos
	if deletedAt == "" {
		deletedAt = listRV
	}
	snapdiff.Sort(admitted, compareObjects)
	changes := snapdiff.Diff(s.events.objects(), admitted, objectAccessors)
	for _, c := range changes {
		if c.Type == snapdiff.Deleted {
			s.events.append(Deleted, c.Object.withResourceVersion(deletedAt), rv, "")
			continue
		}
		s.events.append(Modified, c.Object, rv, "") // Added if new
	}
	s.events.bookmark(rv, listRV)
	s.hooks.eventsIn.Add(float64(len(changes)))
	s.eventsIn += uint64(len(changes))
	s.hooks.objects.Add(float64(s.events.len() - before))
	s.broadcastLocked()
}

// objectAccessors are what snapdiff reads of a stored object.
var objectAccessors = snapdiff.Accessors[*Object]{
	Compare:         compareObjects,
	ResourceVersion: func(o *Object) string { return o.ResourceVersion },
	UID:             uidOf,
}

// compareObjects orders objects as the store does (CompareKeys).
func compareObjects(a, b *Object) int { return CompareKeys(a.Namespace, a.Name, b.Namespace, b.Name) }

func (s *Source) publishEvent(t EventType, obj *Object, rvStr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv := s.positionLocked(rvStr)
	s.lastErr = nil
	s.state = StateSynced
	if obj != nil && t != Deleted && !s.admitLocked(obj) {
		// Not served: a client must not keep an older state either.
		cur := s.events.get(obj.Namespace, obj.Name)
		if cur == nil {
			s.events.bookmark(rv, rvStr)
			s.broadcastLocked()
			return
		}
		t, obj = Deleted, cur.ev.Object.withResourceVersion(rvStr)
	}
	before := s.events.len()
	switch t {
	case Bookmark:
		s.events.bookmark(rv, rvStr)
	case Added, Modified, Deleted:
		s.events.append(t, obj, rv, rvStr)
	}
	s.hooks.objects.Add(float64(s.events.len() - before))
	s.hooks.eventsIn.Inc()
	s.eventsIn++
	s.broadcastLocked()
}

// Status is a snapshot of a Source for introspection.
type Status struct {
	Key             Key
	State           SourceState
	Objects         int
	LogEvents       int
	ResourceVersion string
	MaxLagEvents    uint64
	Message         string
	// EventsIn is how many events the Source has received from the API
	// server since its first list, which is not counted (a relist counts
	// the changes it found).
	EventsIn uint64
}

func (s *Source) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.events
	st := Status{
		Key: s.key, State: s.state, Objects: l.len(), LogEvents: len(l.entries) - l.start,
		ResourceVersion: l.lastPos, EventsIn: s.eventsIn,
	}
	for sub := range s.subs {
		if sub.cursor.seq < l.last.seq {
			st.MaxLagEvents = max(st.MaxLagEvents, l.last.seq-sub.cursor.seq)
		}
	}
	var msgs []string
	switch {
	case s.terminal != nil:
		msgs = append(msgs, s.terminal.Error())
	case s.lastErr != nil:
		msgs = append(msgs, s.lastErr.Error())
	}
	if s.refused != "" {
		msgs = append(msgs, s.refused)
	}
	st.Message = strings.Join(msgs, "; ")
	return st
}
