package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// seats are the daemon's unary calls in execution, shared between
// callers as the API server's Priority and Fairness shares its seats
// between flows: a call that finds every seat taken, or its caller
// holding its share of them (perCaller), waits in its caller's queue; a
// seat that frees goes to the callers with waiters in turn (round robin),
// so that however many calls one caller makes, another's next call waits
// for at most one call of each busy caller, never behind the whole flood.
// A call waits at most maxWait for its seat, then is refused with a retry
// delay. The per-caller token buckets (callerBudgets) bound each caller's
// rate and waiters before it gets here.
type seats struct {
	total, perCaller int
	maxWait          time.Duration

	mu    sync.Mutex // guards the fields below
	used  int
	held  map[string]int       // seats per caller, for the callers holding any
	queue map[string][]*waiter // waiters per caller, oldest first
	turn  []string             // the callers with waiters, next first
}

// waiter is one call waiting for a seat: granted is closed when it gets
// one (with seats.mu held, after which the seat is the waiter's).
type waiter struct {
	granted chan struct{}
	done    bool // granted, or gave up; guarded by seats.mu
}

func newSeats(total, perCaller int, maxWait time.Duration) *seats {
	return &seats{total: total, perCaller: min(max(perCaller, 1), total), maxWait: maxWait,
		held: map[string]int{}, queue: map[string][]*waiter{}}
}

// acquire takes a seat for name, waiting in name's queue (at most maxWait,
// or until ctx ends) while none is free to it. It returns the func that
// gives the seat back (idempotent), or a retryLater naming what when the
// wait ran out, or ctx's error.
func (s *seats) acquire(ctx context.Context, name, what string) (func(), error) {
	s.mu.Lock()
	if s.used < s.total && s.held[name] < s.perCaller && len(s.queue[name]) == 0 {
		s.takeLocked(name)
		s.mu.Unlock()
		return s.releaser(name), nil
	}
	w := &waiter{granted: make(chan struct{})}
	if len(s.queue[name]) == 0 {
		s.turn = append(s.turn, name)
	}
	s.queue[name] = append(s.queue[name], w)
	s.mu.Unlock()

	t := time.NewTimer(s.maxWait)
	defer t.Stop()
	var err error
	select {
	case <-w.granted:
		return s.releaser(name), nil
	case <-t.C:
		err = retryAfter(inFlightRetry, fmt.Errorf("%w: the daemon's %d seats for %s are busy (-unary-calls-in-flight, %d a caller at most) and none came to %s within %s: retry after %s",
			errLimit, s.total, what, s.perCaller, name, s.maxWait, inFlightRetry))
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.done { // granted as it gave up: the seat is its to give back
		s.releaseLocked(name)
		return nil, err
	}
	w.done = true
	q := s.queue[name]
	for i, x := range q {
		if x == w {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	s.setQueueLocked(name, q)
	return nil, err
}

// releaser returns the idempotent func that gives name's seat back.
func (s *seats) releaser(name string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.releaseLocked(name)
			s.mu.Unlock()
		})
	}
}

func (s *seats) takeLocked(name string) {
	s.used++
	s.held[name]++
}

// releaseLocked gives one of name's seats back and hands the free seats
// to the waiters whose turn it is.
func (s *seats) releaseLocked(name string) {
	s.used--
	if s.held[name]--; s.held[name] == 0 {
		delete(s.held, name)
	}
	s.grantLocked()
}

// grantLocked gives free seats to waiting callers in turn, skipping (and
// keeping in turn) those that hold their share.
func (s *seats) grantLocked() {
	for s.used < s.total {
		i := 0
		for i < len(s.turn) && s.held[s.turn[i]] >= s.perCaller {
			i++
		}
		if i == len(s.turn) {
			return // nobody waits, or every waiter's caller holds its share
		}
		name := s.turn[i]
		s.turn = append(s.turn[:i:i], s.turn[i+1:]...)
		q := s.queue[name]
		w := q[0]
		w.done = true
		close(w.granted)
		s.takeLocked(name)
		s.setQueueLocked(name, q[1:])
	}
}

// setQueueLocked sets name's queue to q, keeping name at the back of the
// turn while it has waiters and out of it when it has none.
func (s *seats) setQueueLocked(name string, q []*waiter) {
	for i, n := range s.turn {
		if n == name {
			s.turn = append(s.turn[:i:i], s.turn[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(s.queue, name)
		return
	}
	s.queue[name] = q
	s.turn = append(s.turn, name)
}
