// Package backoff is the jittered exponential backoff that informerd's
// upstream informers and its client library both use between retries.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff doubles a delay from Initial up to Max, waiting a random time in
// [d/2, d] each time (so that many waiters spread out), and starts over
// after Reset. The zero value is not usable; set Initial and Max. A
// Backoff is not safe for concurrent use.
type Backoff struct {
	// Initial is the first delay.
	Initial time.Duration
	// Max caps the delay.
	Max time.Duration

	next time.Duration // 0: Initial
}

// Next returns the delay to wait now and doubles the next one.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.Initial
	}
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, b.Max)
	return d
}

// Wait waits for Next's delay, or returns ctx.Err() when ctx ends first.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Reset makes the next delay Initial again: call it after a success.
func (b *Backoff) Reset() { b.next = 0 }
