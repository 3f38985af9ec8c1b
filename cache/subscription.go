package cache

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"k8s.io/apimachinery/pkg/labels"
)

// Subscription is a cursor into one Source's log, seen through a Filter.
// Next must be called from one goroutine at a time; Get, List and Close
// may be called from any goroutine, Close once or more.
type Subscription struct {
	// src is the Source read. It changes only when the subscription
	// moves to another Source (moves.go), on the reading goroutine.
	src    atomic.Pointer[Source]
	filter Filter
	// cursor is the log position of the last event read; guarded by
	// src's mu.
	cursor mark
	// phase is a snapshot or a catch-up being read before the log; owned
	// by the reading goroutine.
	phase   phase
	started bool // Subscribe started the Source for it

	// move is the Key of the Source the Manager asks the subscription to
	// move to (moves.go), or nil; target is that Source once held, with
	// targetRelease. mover acquires a Key for the subscription's holder
	// (nil: it never moves).
	move          atomic.Pointer[Key]
	target        *Source
	targetRelease func()
	mover         func(key Key, like *Source) (*Source, func(), error)

	mu      sync.Mutex // guards closed, release, target and targetRelease; held while the subscription moves
	closed  bool
	release func() // the hold on src
	onClose func() // if set, called once after Close released the holds
}

// source returns the Source the subscription reads now.
func (s *Subscription) source() *Source { return s.src.Load() }

// phase is a read of a frozen copy of a Source's store or history, done
// outside the Source's lock at the subscriber's pace: what a subscriber
// reads before the log. read returns up to about max events for f and
// reports when nothing is left; it visits at most scanChunk entries, so a
// caller can check its context between calls.
type phase interface {
	read(f Filter, max int) (evs []*Event, done bool)
}

// scanChunk bounds the entries a phase visits per read.
const scanChunk = 4096

// freshnessWait bounds how long a subscriber that asks for a
// resourceVersion the Source has not reached waits for it, as the API
// server's watch cache does.
const freshnessWait = 3 * time.Second

// start positions the subscription: after resume (a resourceVersion) if
// the log still holds it, else with a compacted catch-up, else with a
// Reset and a snapshot. An empty resume starts with a snapshot. It waits
// until the Source has synced and, bounded by freshnessWait, until it has
// reached both resume and notOlderThan, so that a client never receives a
// state older than one it has seen.
func (s *Subscription) start(ctx context.Context, resume, notOlderThan string) error {
	src := s.source()
	src.mu.Lock()
	defer src.mu.Unlock()
	if err := src.waitSyncedLocked(ctx); err != nil {
		return err
	}
	resumeRV, numeric := parseRV(resume)
	if err := src.waitFreshLocked(ctx, resumeRV, notOlderThan); err != nil {
		return err
	}
	l := src.events
	s.cursor = l.last
	src.subs[s] = struct{}{}
	switch {
	case resume == "":
		s.phase = newSnapshot(l, s.filter, false)
	case !numeric || src.opaque:
		// Not comparable: only a snapshot, which the client diffs, is safe.
		s.phase = newSnapshot(l, s.filter, true)
	default:
		if at, ok := l.resumeAt(resumeRV); ok {
			s.cursor = at
		} else if from := atRV(resumeRV); l.canCatchUp(from) {
			s.phase = newCatchUp(l, from)
		} else {
			s.phase = newSnapshot(l, s.filter, true)
		}
	}
	return nil
}

// Resets reports whether the subscription starts with a Reset (its resume
// point is lost): read it before the first Next, from the reading
// goroutine.
func (s *Subscription) Resets() bool {
	r, ok := s.phase.(*snapshot)
	return ok && r.reset
}

// StartedSource reports whether Subscribe started the Source for this
// subscription (none ran or lingered for its Key): a Reset then says only
// that the new informer began after the resume point.
func (s *Subscription) StartedSource() bool { return s.started }

// Next blocks until at least one event is ready and returns up to about
// max of them, in order. After the Source ends it returns what is left and
// then the Source's terminal error (wrapping ErrResourceRemoved,
// ErrRejected or ErrStopped); when ctx ends it returns ctx.Err(). The
// events are shared: do not modify them.
//
// Snapshots and catch-ups are read from frozen copies of the store, and
// every filter runs, outside the Source's lock: a subscriber never holds
// the lock for work proportional to the store.
func (s *Subscription) Next(ctx context.Context, max int) ([]*Event, error) {
	for {
		if s.phase != nil {
			evs, done := s.phase.read(s.filter, max)
			if done {
				s.phase = nil
			}
			if len(evs) > 0 {
				return evs, nil
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			continue
		}
		var targetChanged <-chan struct{} // a move waits for its target to reach the cursor
		if key := s.move.Load(); key != nil {
			var moved bool
			if moved, targetChanged = s.tryMove(key); moved {
				continue
			}
		}
		src := s.source()
		src.mu.Lock()
		l := src.events
		evs, last, ok := l.since(s.cursor, max)
		if !ok {
			// Fell out of the log: catch up from the compacted history,
			// or, past its horizon, start over.
			src.hooks.catchUps.Inc()
			if l.canCatchUp(s.cursor) {
				s.phase = newCatchUp(l, s.cursor)
			} else {
				s.phase = newSnapshot(l, s.filter, true)
			}
			s.cursor = l.last
			src.mu.Unlock()
			continue
		}
		if len(evs) == 0 {
			if err := src.terminal; err != nil {
				src.mu.Unlock()
				return nil, err
			}
			ch := src.notify
			src.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-ch:
			case <-targetChanged:
			}
			continue
		}
		s.cursor = last
		src.mu.Unlock()
		out := evs[:0]
		for _, e := range evs {
			if e = s.filter.apply(e); e != nil {
				out = append(out, e)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
}

// snapshot reads a frozen copy of the store in key order: every object
// the filter admits as Added, then Synced; a Reset first if reset.
type snapshot struct {
	objs  *btree.BTreeG[objItem]
	next  objItem // the first entry not read yet
	ns    string  // "" for every namespace
	name  string  // within ns, the one object to read; "" for every one
	reset bool    // Reset not sent yet
	pos   string  // the position Synced carries
}

func newSnapshot(l *eventLog, f Filter, reset bool) *snapshot {
	r := &snapshot{objs: l.frozenObjects(), ns: f.Namespace, reset: reset, pos: l.lastPos}
	if f.Namespace != "" {
		r.name = f.Name // one namespace is one range, and its names are in order
	}
	r.next = objAt(r.ns, r.name)
	return r
}

func (r *snapshot) read(f Filter, max int) ([]*Event, bool) {
	var evs []*Event
	if r.reset {
		evs, r.reset = append(evs, &Event{Type: Reset}), false
	}
	done, scanned := true, 0
	r.objs.AscendGreaterOrEqual(r.next, func(it objItem) bool {
		if o := it.object(); (r.ns != "" && o.Namespace != r.ns) || (r.name != "" && o.Name != r.name) {
			return false
		}
		if len(evs) >= max || scanned == scanChunk {
			r.next, done = it, false
			return false
		}
		scanned++
		if o := it.object(); f.matches(o, o.Labels) {
			evs = append(evs, it.st.ev.copyAs(Added))
		}
		return true
	})
	if done {
		r.objs = nil // let the frozen copy go
		evs = append(evs, &Event{Type: Synced, ResourceVersion: r.pos})
	}
	return evs, done
}

// catchUp reads a frozen copy of the compacted history after a position
// the subscriber has seen everything up to: the latest state of each
// object changed since, and the deletions it needs, in the order they
// happened, then a Bookmark at the end of the copy.
type catchUp struct {
	changes *btree.BTreeG[change]
	from    mark // the subscriber has seen every change up to from
	next    mark // the first change not read yet is at or after next
	end     mark // the newest change the copy holds
	pos     string
}

func newCatchUp(l *eventLog, from mark) *catchUp {
	return &catchUp{changes: l.frozenHistory(), from: from, next: from.succ(), end: l.last, pos: l.lastPos}
}

func (r *catchUp) read(f Filter, max int) ([]*Event, bool) {
	var evs []*Event
	done, scanned := true, 0
	r.changes.AscendGreaterOrEqual(changeAt(r.next), func(c change) bool {
		if c.st.changed.after(r.end) {
			return false
		}
		if len(evs) >= max || scanned == scanChunk {
			r.next, done = c.st.changed, false
			return false
		}
		scanned++
		if e := f.catchUp(c, r.from); e != nil {
			evs = append(evs, e)
		}
		return true
	})
	if done {
		r.changes = nil
		evs = append(evs, &Event{Type: Bookmark, ResourceVersion: r.pos})
	}
	return evs, done
}

// TypeMeta returns the apiVersion and kind of the subscription's resource,
// for the objects that carry markers (as the API server's bookmarks do).
func (s *Subscription) TypeMeta() (apiVersion, kind string) {
	src := s.source()
	return src.apiVersion, src.kind
}

// Key returns the Key of the Source the subscription reads now (it may
// move to another: moves.go).
func (s *Subscription) Key() Key { return s.source().key }

// Get returns the object namespace/name as the Source stores it now, if
// its filter admits it. It does not move the cursor and is safe to call
// from any goroutine while the subscription is open; it costs O(log n).
func (s *Subscription) Get(namespace, name string) (*Object, bool) {
	if s.filter.Namespace != "" && namespace != s.filter.Namespace {
		return nil, false
	}
	src := s.source()
	src.mu.Lock()
	st := src.events.get(namespace, name)
	src.mu.Unlock()
	if st == nil || !s.filter.matches(st.ev.Object, st.ev.Object.Labels) {
		return nil, false
	}
	return st.ev.Object, true
}

// List returns the objects the Source stores now in namespace ("" for
// every namespace) that both its filter and sel (nil for everything)
// admit, in storage-key order (CompareKeys). It does not move the cursor and is
// safe to call from any goroutine while the subscription is open; it
// reads a frozen copy outside the Source's lock, visiting only namespace
// when one is given. The objects are shared: do not modify them.
func (s *Subscription) List(namespace string, sel labels.Selector) []*Object {
	if s.filter.Namespace != "" {
		if namespace != "" && namespace != s.filter.Namespace {
			return nil
		}
		namespace = s.filter.Namespace
	}
	src := s.source()
	src.mu.Lock()
	objs := src.events.frozenObjects()
	src.mu.Unlock()
	f := Filter{Namespace: namespace, Labels: sel}
	var out []*Object
	objs.AscendGreaterOrEqual(objAt(namespace, ""), func(it objItem) bool {
		if namespace != "" && it.object().Namespace != namespace {
			return false
		}
		if o := it.object(); f.matches(o, o.Labels) && s.filter.matches(o, o.Labels) {
			out = append(out, o)
		}
		return true
	})
	return out
}

// Close releases the subscription's hold on its Source (and on the one it
// was moving to). It is idempotent, and safe to call while Next runs.
func (s *Subscription) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	src, release := s.source(), s.release
	s.mu.Unlock()
	src.mu.Lock()
	delete(src.subs, s)
	src.mu.Unlock()
	release()
	s.dropTarget()
	if s.onClose != nil {
		s.onClose()
	}
}

// waitSyncedLocked waits, with s.mu held (and released while it waits),
// until the Source has synced. It fails at once with the terminal error,
// or with ErrNotSynced wrapping the last upstream error while the first
// list fails.
func (s *Source) waitSyncedLocked(ctx context.Context) error {
	for !s.synced {
		switch {
		case s.terminal != nil:
			return s.terminal
		case s.lastErr != nil:
			return fmt.Errorf("%w: %s: %w", ErrNotSynced, s.key, s.lastErr)
		}
		if err := s.waitLocked(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

// waitFreshLocked waits, with s.mu held (and released while it waits), up
// to freshnessWait until the Source has reached resourceVersion rv and
// notOlderThan (numeric resourceVersions only; others are opaque and not
// waited for). It fails with ErrTooNew.
func (s *Source) waitFreshLocked(ctx context.Context, rv uint64, notOlderThan string) error {
	if n, ok := parseRV(notOlderThan); ok {
		rv = max(rv, n)
	}
	if rv <= s.events.last.rv || s.opaque {
		return nil
	}
	timeout := time.NewTimer(freshnessWait)
	defer timeout.Stop()
	for rv > s.events.last.rv {
		if s.terminal != nil {
			return s.terminal
		}
		if err := s.waitLocked(ctx, timeout.C); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return &TooNewError{Key: s.key, Want: rv, Current: s.events.last.rv}
		}
	}
	return nil
}

// waitLocked waits, with s.mu held and released meanwhile, until the
// Source changes, ctx ends (ctx.Err()), or timeout fires
// (context.DeadlineExceeded).
func (s *Source) waitLocked(ctx context.Context, timeout <-chan time.Time) error {
	ch := s.notify
	s.mu.Unlock()
	defer s.mu.Lock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timeout:
		return context.DeadlineExceeded
	case <-ch:
		return nil
	}
}
