package backoff

import (
	"context"
	"testing"
	"time"
)

func TestBackoffDoublesWithJitterAndResets(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: 400 * time.Millisecond}
	// Each delay is in [d/2, d] for d = 100, 200, 400, 400 ms.
	for i, d := range []time.Duration{100, 200, 400, 400} {
		d *= time.Millisecond
		if got := b.Next(); got < d/2 || got > d {
			t.Fatalf("delay %d = %s, want within [%s, %s]", i, got, d/2, d)
		}
	}
	b.Reset()
	if got := b.Next(); got > 100*time.Millisecond {
		t.Fatalf("after Reset the delay is %s, want at most Initial", got)
	}
}

func TestWaitEndsWithTheContext(t *testing.T) {
	b := Backoff{Initial: time.Hour, Max: time.Hour}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.Wait(ctx); err == nil {
		t.Fatal("Wait on an ended context returned nil")
	}
}
