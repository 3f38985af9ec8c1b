package daemon

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestCallerBudgets: each caller spends its own bucket and slots; a
// request whose token comes within maxWait waits for it, a later one is
// refused with the delay until it comes; a caller at its calls in flight
// is refused until one ends; another caller is never affected.
func TestCallerBudgets(t *testing.T) {
	type step struct {
		name      string
		caller    string
		at        time.Duration // since the start
		wantWait  time.Duration
		wantRetry time.Duration // > 0: refused with this delay
		done      bool          // give the slot back at once
	}
	// 10/s (a token every 100 ms), burst 2, 2 in flight, wait up to 50 ms.
	for _, tt := range []struct {
		name  string
		steps []step
	}{
		{"burst, then refused with the delay to the next token", []step{
			{name: "1st", caller: "a", done: true},
			{name: "2nd", caller: "a", done: true},
			{name: "3rd", caller: "a", wantRetry: 100 * time.Millisecond},
			{name: "another caller", caller: "b", done: true},
			{name: "a token later", caller: "a", at: 100 * time.Millisecond, done: true},
		}},
		{"a token within maxWait is waited for", []step{
			{name: "1st", caller: "a", done: true},
			{name: "2nd", caller: "a", done: true},
			{name: "60 ms on", caller: "a", at: 60 * time.Millisecond, wantWait: 40 * time.Millisecond, done: true},
		}},
		{"calls in flight", []step{
			{name: "1st held", caller: "a"},
			{name: "2nd held", caller: "a", at: time.Second},
			{name: "3rd", caller: "a", at: time.Second, wantRetry: inFlightRetry},
			{name: "another caller", caller: "b", at: time.Second, done: true},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newCallerBudgets(10, 2, 2, 50*time.Millisecond)
			start := time.Now()
			for _, s := range tt.steps {
				wait, _, done, retry := b.reserve(s.caller, start.Add(s.at))
				if (done == nil) != (s.wantRetry > 0) || retry != s.wantRetry || wait != s.wantWait {
					t.Fatalf("%s: wait %s, retry %s, admitted %t; want wait %s, retry %s", s.name, wait, retry, done != nil, s.wantWait, s.wantRetry)
				}
				if done != nil && s.done {
					done()
					done() // idempotent
				}
			}
		})
	}
}

// TestCallerBudgetsAdmit: admit waits for a token within maxWait, gives
// the slot back when its context ends while it waits, and refuses beyond
// with a retryLater that wraps errLimit.
func TestCallerBudgetsAdmit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCallerBudgets(10, 1, 1, time.Second)
		done, err := b.admit(t.Context(), "a", "calls")
		if err != nil {
			t.Fatal(err)
		}
		done()
		start := time.Now()
		done, err = b.admit(t.Context(), "a", "calls")
		if err != nil || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("the 2nd call: %v after %s; want admitted after 100ms", err, time.Since(start))
		}
		// Holding the one slot: the next is refused, for its calls in flight.
		_, err = b.admit(t.Context(), "a", "calls")
		if d, ok := retryDelay(err); !ok || d != inFlightRetry || !errors.Is(err, errLimit) {
			t.Fatalf("beyond the calls in flight: %v; want a retryLater of %s wrapping errLimit", err, inFlightRetry)
		}
		done()
		ctx, cancel := context.WithCancel(t.Context())
		go func() { time.Sleep(10 * time.Millisecond); cancel() }()
		if _, err := b.admit(ctx, "a", "calls"); !errors.Is(err, context.Canceled) {
			t.Fatalf("ended while waiting: %v", err)
		}
		// The slot came back, and the cancelled reservation's token too.
		time.Sleep(90 * time.Millisecond)
		if done, err = b.admit(t.Context(), "a", "calls"); err != nil || time.Since(start) != 200*time.Millisecond {
			t.Fatalf("after a cancelled wait: %v at %s", err, time.Since(start))
		}
		done()
	})
}

// TestCallerBudgetsAllow: allow spends a token or says when one comes,
// spending none.
func TestCallerBudgetsAllow(t *testing.T) {
	b := newCallerBudgets(1, 2, 0, 0) // a token a second, burst 2
	now := time.Now()
	for i, want := range []time.Duration{0, 0, time.Second, time.Second} {
		if got := b.allow("a", now); got != want {
			t.Fatalf("request %d: %s, want %s", i+1, got, want)
		}
	}
	if got := b.allow("b", now); got != 0 {
		t.Fatalf("another caller: %s, want 0", got)
	}
	if got := b.allow("a", now.Add(time.Second)); got != 0 {
		t.Fatalf("a second later: %s, want 0", got)
	}
}
