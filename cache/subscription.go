package cache

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
)

// Subscription is a cursor into one Source's log, seen through a Filter.
// Next must be called from one goroutine at a time; Close may be called
// from any goroutine, once or more.
type Subscription struct {
	src    *Source
	filter Filter
	// cursor is the seq of the last log event read; guarded by src.mu.
	cursor uint64
	// pending are materialized events (a snapshot or a catch-up) that are
	// delivered before the log; owned by the reading goroutine.
	pending   []*Event
	closeOnce sync.Once
	release   func()
}

// start positions the subscription: after resume (a resourceVersion) if
// the log still holds it, else with a compacted catch-up, else with a Reset
// and a snapshot. An empty resume starts with a snapshot. It waits until
// the Source has synced.
func (s *Subscription) start(ctx context.Context, resume string) error {
	src := s.src
	src.mu.Lock()
	for !src.synced {
		switch {
		case src.terminal != nil:
			err := src.terminal
			src.mu.Unlock()
			return err
		case src.lastErr != nil:
			err := src.lastErr
			src.mu.Unlock()
			return fmt.Errorf("%w: %s: %w", ErrNotSynced, src.key, err)
		}
		ch := src.notify
		src.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
		src.mu.Lock()
	}
	defer src.mu.Unlock()
	l := src.events
	s.cursor = l.lastSeq
	src.subs[s] = struct{}{}
	if resume == "" {
		s.pending = s.snapshotLocked(false)
		return nil
	}
	rv, _ := parseRV(resume) // the daemon validated it
	if rv == l.lastRV {
		return nil
	}
	if seq, ok := l.seqForRV(rv); ok {
		s.cursor = seq
		return nil
	}
	if evs, ok := l.catchUp(rv, true); ok && rv < l.lastRV {
		s.pending = s.catchUpLocked(evs)
		return nil
	}
	s.pending = s.snapshotLocked(true)
	return nil
}

// snapshotLocked returns the matching objects as Added events, then
// Synced, preceded by Reset if reset.
func (s *Subscription) snapshotLocked(reset bool) []*Event {
	l := s.src.events
	all := l.snapshot()
	out := make([]*Event, 0, len(all)+2)
	if reset {
		out = append(out, &Event{Type: Reset})
	}
	for _, e := range all {
		if e = s.filter.apply(e); e != nil {
			out = append(out, e)
		}
	}
	return append(out, &Event{Type: Synced, ResourceVersion: strconv.FormatUint(l.lastRV, 10)})
}

// catchUpLocked filters a compacted catch-up and ends it with a Bookmark
// at the log's position.
func (s *Subscription) catchUpLocked(evs []*Event) []*Event {
	out := evs[:0]
	for _, e := range evs {
		if e = s.filter.applyCatchUp(e); e != nil {
			out = append(out, e)
		}
	}
	return append(out, &Event{Type: Bookmark, ResourceVersion: strconv.FormatUint(s.src.events.lastRV, 10)})
}

// Next blocks until at least one event is ready and returns up to max of
// them, in order. After the Source ends it returns what is left and then
// the Source's terminal error (wrapping ErrResourceRemoved or ErrStopped);
// when ctx ends it returns ctx.Err(). The events are shared: do not modify
// them.
func (s *Subscription) Next(ctx context.Context, max int) ([]*Event, error) {
	src := s.src
	for {
		if len(s.pending) > 0 {
			n := min(max, len(s.pending))
			out := s.pending[:n:n]
			s.pending = s.pending[n:]
			if len(s.pending) == 0 {
				s.pending = nil
			}
			return out, nil
		}
		src.mu.Lock()
		evs, last, ok := src.events.since(s.cursor, max)
		if !ok {
			// Fell out of the log: catch up from the store.
			s.src.hooks.catchUps.Inc()
			if c, ok := src.events.catchUp(s.cursor, false); ok {
				s.pending = s.catchUpLocked(c)
			} else {
				s.pending = s.snapshotLocked(true)
			}
			s.cursor = src.events.lastSeq
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

// TypeMeta returns the apiVersion and kind of the subscription's resource,
// for the objects that carry markers (as the API server's bookmarks do).
func (s *Subscription) TypeMeta() (apiVersion, kind string) { return s.src.apiVersion, s.src.kind }

// Key returns the Key of the Source the subscription reads.
func (s *Subscription) Key() Key { return s.src.key }

// Close releases the subscription's hold on its Source. It is idempotent.
func (s *Subscription) Close() {
	s.closeOnce.Do(func() {
		s.src.mu.Lock()
		delete(s.src.subs, s)
		s.src.mu.Unlock()
		s.release()
	})
}

// Get returns the object namespace/name as the Source stores it now, if
// its filter admits it. It does not move the cursor and is safe to call
// from any goroutine while the subscription is open.
func (s *Subscription) Get(namespace, name string) (*Object, bool) {
	if s.filter.Namespace != "" && namespace != s.filter.Namespace {
		return nil, false
	}
	k := (&Object{Namespace: namespace, Name: name}).key()
	s.src.mu.Lock()
	st := s.src.events.store[k]
	s.src.mu.Unlock()
	if st == nil || !s.filter.matches(st.ev.Object.Namespace, st.ev.Object.Labels) {
		return nil, false
	}
	return st.ev.Object, true
}

// List returns the objects the Source stores now in namespace ("" for
// every namespace) that both its filter and sel (nil for everything)
// admit, sorted by namespace and name. It does not move the cursor and is
// safe to call from any goroutine while the subscription is open. The
// objects are shared: do not modify them.
func (s *Subscription) List(namespace string, sel labels.Selector) []*Object {
	if s.filter.Namespace != "" && namespace != "" && namespace != s.filter.Namespace {
		return nil
	}
	f := Filter{Namespace: namespace, Labels: sel}
	s.src.mu.Lock()
	var out []*Object
	for _, st := range s.src.events.store {
		o := st.ev.Object
		if f.matches(o.Namespace, o.Labels) && s.filter.matches(o.Namespace, o.Labels) {
			out = append(out, o)
		}
	}
	s.src.mu.Unlock()
	slices.SortFunc(out, func(a, b *Object) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}
