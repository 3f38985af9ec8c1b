package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// idleTimeout bounds how long a watch may bring nothing.
	idleTimeout time.Duration
	up          upstream
	log         *slog.Logger
	hooks       *metrics
	cancel      context.CancelFunc
	done        chan struct{} // closed when run returns

	mu     sync.Mutex // guards the fields below
	events *eventLog
	synced bool
	state  SourceState
	// lastErr is the latest upstream error (nil after a success).
	lastErr error
	// terminal is set when the Source will publish nothing more.
	terminal error
	// notify is closed and replaced whenever anything above changes.
	notify chan struct{}
	// subs are the open subscriptions, whose cursors give the lag.
	subs map[*Subscription]struct{}
}

func newSource(key Key, up upstream, limits LogLimits, idleTimeout time.Duration, log *slog.Logger, m *metrics) *Source {
	return &Source{
		idleTimeout: idleTimeout,
		key:         key, up: up, log: log.With("informer", key.String()), hooks: m,
		done:   make(chan struct{}),
		events: newEventLog(limits, time.Now),
		state:  StateSyncing,
		notify: make(chan struct{}),
		subs:   map[*Subscription]struct{}{},
	}
}

// start runs the list+watch loop until stop.
func (s *Source) start(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	go func() {
		defer close(s.done)
		err := s.run(ctx)
		if err == nil || ctx.Err() != nil {
			err = ErrStopped
		}
		s.mu.Lock()
		s.terminal = err
		s.state = StateStopped
		s.hooks.objects.Sub(float64(len(s.events.store)))
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
	s.cancel()
	<-s.done
}

func (s *Source) broadcastLocked() {
	close(s.notify)
	s.notify = make(chan struct{})
}

// backoff is the reflector's: 800ms doubling to 30s, full jitter, reset
// after a success.
type backoff struct{ next time.Duration }

func (b *backoff) wait(ctx context.Context) error {
	if b.next == 0 {
		b.next = 800 * time.Millisecond
	}
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, 30*time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (b *backoff) reset() { b.next = 0 }

// action is what the loop does after an upstream error.
type action int

const (
	retryWatch action = iota // back off, watch again from the same resourceVersion
	relist                   // list again and publish the difference
	giveUp                   // terminal: tell subscribers and stop
)

// classify sorts upstream errors, in one place:
//   - 410 Gone / Expired, and "too large resource version": the position is
//     unusable; relist and publish the difference.
//   - 404 NotFound on the collection: the resource is gone (its CRD was
//     deleted): terminal.
//   - 405 MethodNotAllowed: the resource cannot be listed or watched:
//     terminal.
//   - everything else (network errors, 429, 5xx, 403 while RBAC catches
//     up): back off and retry; the Source is stale meanwhile.
func classify(err error) action {
	switch {
	case apierrors.IsResourceExpired(err), apierrors.IsGone(err),
		apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge):
		return relist
	case apierrors.IsNotFound(err), apierrors.IsMethodNotSupported(err):
		return giveUp
	}
	return retryWatch
}

// run lists, then watches; it returns only with a terminal error or when
// ctx ends.
func (s *Source) run(ctx context.Context) error {
	var bo backoff
	rv := ""
	needList := true
	for ctx.Err() == nil {
		if needList {
			s.hooks.upstreamLists.Inc()
			objs, listRV, err := s.up.list(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if classify(err) == giveUp {
					return fmt.Errorf("%w: %s is not served by the API server (%w)", ErrResourceRemoved, s.key, err)
				}
				s.setErr(err)
				if bo.wait(ctx) != nil {
					return nil
				}
				continue
			}
			s.publishList(objs, listRV)
			rv, needList = listRV, false
			bo.reset()
		}
		s.hooks.upstreamWatches.Inc()
		err := s.watch(ctx, rv, &rv)
		if ctx.Err() != nil {
			return nil
		}
		switch classify(err) {
		case relist:
			s.log.Info("resourceVersion too old: relisting", "resourceVersion", rv, "err", err)
			s.hooks.upstreamRelists.Inc()
			needList = true
		case giveUp:
			return fmt.Errorf("%w: %s is no longer served by the API server; was its CustomResourceDefinition deleted? (%w)", ErrResourceRemoved, s.key, err)
		default:
			if err != nil {
				s.log.Info("watch failed: retrying", "err", err)
				s.setErr(err)
				if bo.wait(ctx) != nil {
					return nil
				}
			}
		}
	}
	return nil
}

// watch consumes one watch until it ends; *rv tracks the position. A clean
// end (server timeout) returns nil.
//
// A watch that brings nothing (no event, no bookmark; the API server sends
// a bookmark about every minute) for the idle timeout is abandoned, so that
// a hung connection costs at most that long.
func (s *Source) watch(ctx context.Context, from string, rv *string) error {
	ctx, touch, idle, stop := idleContext(ctx, s.idleTimeout)
	defer stop()
	w, err := s.up.watch(ctx, from)
	if err != nil {
		return idleErr(err, idle)
	}
	defer w.close()
	s.setErr(nil) // the API server answers again: no longer stale
	for {
		t, obj, evRV, err := w.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return idleErr(err, idle)
		}
		touch()
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

// publishList installs the result of a list. The first one becomes the
// snapshot; later ones (relists) publish only the difference from the
// store: Added for new objects, Modified for changed resourceVersions,
// Deleted for vanished objects, then a Bookmark at the list's position.
func (s *Source) publishList(objs []*Object, listRV string) {
	rv, _ := parseRV(listRV)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = nil
	if !s.synced {
		s.events.reset(objs, rv, listRV)
		s.synced, s.state = true, StateSynced
		s.hooks.objects.Add(float64(len(objs)))
		s.broadcastLocked()
		return
	}
	s.state = StateSynced
	before := len(s.events.store)
	seen := make(map[string]struct{}, len(objs))
	changed := 0
	// Every event but the last carries no position: a client that resumes
	// mid-difference replays all of it.
	for _, o := range objs {
		k := o.key()
		seen[k] = struct{}{}
		if cur := s.events.store[k]; cur != nil && cur.ev.Object.ResourceVersion == o.ResourceVersion {
			continue
		}
		s.events.append(Modified, o, rv, "")
		changed++
	}
	var gone []*Object
	for k, st := range s.events.store {
		if _, ok := seen[k]; !ok {
			gone = append(gone, st.ev.Object)
		}
	}
	for _, o := range gone {
		s.events.append(Deleted, o, rv, "")
		changed++
	}
	s.events.bookmark(rv, listRV)
	s.hooks.eventsIn.Add(float64(changed))
	s.hooks.objects.Add(float64(len(s.events.store) - before))
	s.broadcastLocked()
}

func (s *Source) publishEvent(t EventType, obj *Object, rvStr string) {
	rv, _ := parseRV(rvStr)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = nil
	s.state = StateSynced
	switch t {
	case Bookmark:
		s.events.bookmark(rv, rvStr)
	case Added, Modified:
		before := len(s.events.store)
		s.events.append(t, obj, rv, rvStr)
		s.hooks.objects.Add(float64(len(s.events.store) - before))
	case Deleted:
		if s.events.append(t, obj, rv, rvStr) != nil {
			s.hooks.objects.Dec()
		}
	}
	s.hooks.eventsIn.Inc()
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
}

func (s *Source) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{
		Key: s.key, State: s.state, Objects: len(s.events.store), LogEvents: len(s.events.entries) - s.events.start,
		ResourceVersion: strconv.FormatUint(s.events.lastRV, 10),
	}
	for sub := range s.subs {
		if sub.cursor < s.events.lastSeq {
			st.MaxLagEvents = max(st.MaxLagEvents, s.events.lastSeq-sub.cursor)
		}
	}
	switch {
	case s.terminal != nil:
		st.Message = s.terminal.Error()
	case s.lastErr != nil:
		st.Message = s.lastErr.Error()
	}
	return st
}
