package daemon

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// seatResult is what one acquire returned.
type seatResult struct {
	who     string
	release func()
	err     error
}

// acquireAsync starts an acquire for who and reports it on out; it
// returns once the call waits in who's queue (or returned).
func acquireAsync(ctx context.Context, s *seats, who string, out chan<- seatResult) {
	go func() {
		release, err := s.acquire(ctx, who, "test calls")
		out <- seatResult{who, release, err}
	}()
	synctest.Wait()
}

// TestSeatsAreServedInTurn: with every seat taken by one caller's flood,
// another caller's call gets the next seat but one at most (callers with
// waiters take turns), a caller never holds more than its share while
// others wait or seats are free, and a call that waits past maxWait is
// refused with a retry delay and leaves no waiter behind.
func TestSeatsAreServedInTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := newSeats(2, 2, time.Second)
		var flood []func()
		for range 2 {
			release, err := s.acquire(ctx, "flood", "test calls")
			if err != nil {
				t.Fatal(err)
			}
			flood = append(flood, release)
		}
		got := make(chan seatResult, 8)
		for range 3 {
			acquireAsync(ctx, s, "flood", got)
		}
		acquireAsync(ctx, s, "bystander", got)
		select {
		case r := <-got:
			t.Fatalf("%s got a seat while every seat was taken", r.who)
		default:
		}

		flood[0]() // the flood queued first: its turn
		flood[0]() // idempotent
		synctest.Wait()
		if r := <-got; r.who != "flood" || r.err != nil {
			t.Fatalf("first free seat went to %s (%v), want the flood's first waiter", r.who, r.err)
		} else {
			flood[0] = r.release
		}
		flood[1]() // then the bystander's, though the flood has 2 more waiting
		synctest.Wait()
		r := <-got
		if r.who != "bystander" || r.err != nil {
			t.Fatalf("second free seat went to %s (%v), want the bystander", r.who, r.err)
		}
		r.release()
		synctest.Wait()
		if r := <-got; r.who != "flood" {
			t.Fatalf("the bystander's seat went to %s, want the flood's next waiter", r.who)
		} else {
			flood[1] = r.release
		}

		// The last flood waiter is refused after maxWait, and its queue is
		// empty: seats given back go unused, to nobody.
		time.Sleep(time.Second)
		synctest.Wait()
		r = <-got
		var rl *retryLater
		if !errors.As(r.err, &rl) || !errors.Is(r.err, errLimit) || r.release != nil {
			t.Fatalf("a call waiting past maxWait: %v, want a retryLater wrapping errLimit", r.err)
		}
		flood[0]()
		flood[1]()
		s.mu.Lock()
		used, queued, turn := s.used, len(s.queue), len(s.turn)
		s.mu.Unlock()
		if used != 0 || queued != 0 || turn != 0 {
			t.Fatalf("after every call: %d seats used, %d callers queued, %d in turn; want none", used, queued, turn)
		}
	})
}

// TestSeatsShareOfACaller: a caller holds at most its share even with
// seats free, waiting in its queue for one of its own to come back, while
// another caller takes a free seat at once; a waiter whose context ends
// leaves the queue.
func TestSeatsShareOfACaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := newSeats(4, 1, time.Minute)
		release, err := s.acquire(ctx, "a", "test calls")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan seatResult, 2)
		acquireAsync(ctx, s, "a", got)
		if _, err := s.acquire(ctx, "b", "test calls"); err != nil {
			t.Fatalf("b with 3 seats free: %v", err)
		}
		select {
		case r := <-got:
			t.Fatalf("a got a second seat (%v), over its share of 1", r.err)
		default:
		}
		release()
		synctest.Wait()
		if r := <-got; r.who != "a" || r.err != nil {
			t.Fatalf("a's seat came back to %s (%v), want a's waiter", r.who, r.err)
		}

		cctx, cancel := context.WithCancel(ctx)
		acquireAsync(cctx, s, "a", got)
		cancel()
		if r := <-got; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("a waiter whose context ended: %v", r.err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.queue) != 0 || len(s.turn) != 0 {
			t.Fatalf("%d callers queued, %d in turn after the waiter left; want none", len(s.queue), len(s.turn))
		}
	})
}
