package cache

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// downUpstream fails every list while down, and reports each list.
type downUpstream struct {
	mu     sync.Mutex
	down   bool
	lists  int
	onList func(n int, down bool)
}

func (u *downUpstream) list(ctx context.Context) ([]*Object, string, error) {
	u.mu.Lock()
	u.lists++
	n, down := u.lists, u.down
	u.mu.Unlock()
	u.onList(n, down)
	if down {
		return nil, "", apierrors.NewServiceUnavailable("down")
	}
	return nil, "1", nil
}

func (u *downUpstream) watch(ctx context.Context, _ string) (watchStream, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (u *downUpstream) setDown(down bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.down = down
}

// TestRecoveryCutsTheBackoffShortAndSpreadsRetries (issue 19): informers
// whose backoff grew in an outage retry, once the API server is reported
// back, within the recovery window and spread over it, not up to 30 s
// later nor all at once.
func TestRecoveryCutsTheBackoffShortAndSpreadsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sources, window = 100, 10 * time.Second
		rec := newRecovery(window)
		grown := make(chan struct{}, sources) // a Source's 7th failed list: its backoff is 15 s or more
		var (
			mu       sync.Mutex
			backAt   time.Time
			retried  []time.Duration
			upstream []*downUpstream
		)
		for range sources {
			up := &downUpstream{down: true}
			up.onList = func(n int, down bool) {
				if n == 7 {
					grown <- struct{}{}
				}
				mu.Lock()
				defer mu.Unlock()
				if !down && !backAt.IsZero() {
					retried = append(retried, time.Since(backAt))
				}
			}
			upstream = append(upstream, up)
			cfg := testSourceConfig(LogLimits{}, time.Hour)
			cfg.recovery = rec
			s := newSource(Key{}, up, cfg)
			s.start(t.Context())
			defer s.stop()
		}
		for range sources {
			<-grown
		}
		synctest.Wait() // every Source waits on its backoff
		mu.Lock()
		backAt = time.Now()
		mu.Unlock()
		for _, up := range upstream {
			up.setDown(false)
		}
		rec.signal()
		time.Sleep(window)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(retried) != sources {
			t.Fatalf("%d of %d Sources retried within the window (%s) after the recovery, want all", len(retried), sources, window)
		}
		var buckets [10]int
		for _, d := range retried {
			buckets[d*10/window]++
		}
		for i, n := range buckets {
			if n > 30 {
				t.Fatalf("%d of %d Sources retried in tenth %d of the window, want them spread over it: %v", n, sources, i, buckets)
			}
		}
	})
}

// TestNoRecoveryWaitsOutTheBackoff: without a report of recovery, a
// Source waits out its grown backoff, as the reflector does.
func TestNoRecoveryWaitsOutTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		listed := make(chan time.Time, 16)
		up := &downUpstream{down: true}
		up.onList = func(n int, _ bool) {
			if n == 7 {
				up.down = false // the 8th list works (list reads down before it calls onList)
			}
			listed <- time.Now()
		}
		cfg := testSourceConfig(LogLimits{}, time.Hour)
		cfg.recovery = newRecovery(10 * time.Second)
		s := newSource(Key{}, up, cfg)
		s.start(t.Context())
		defer s.stop()
		var at []time.Time
		for range 8 {
			at = append(at, <-listed)
		}
		if last := at[7].Sub(at[6]); last < 15*time.Second {
			t.Fatalf("the retry after the 7th failure came %s later, want the grown backoff (at least 15 s)", last)
		}
	})
}

// TestHeardOnlyFromAnswers: the time an informer last heard from the API
// server (what spares the readiness prober its request) moves with a list
// that succeeds, never with one that fails.
func TestHeardOnlyFromAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		listed := make(chan bool, 16)
		up := &downUpstream{down: true}
		up.onList = func(_ int, down bool) { listed <- down }
		cfg := testSourceConfig(LogLimits{}, time.Hour)
		r := newRecovery(10 * time.Second)
		cfg.recovery = r
		s := newSource(Key{}, up, cfg)
		s.start(t.Context())
		defer s.stop()
		m := &Manager{recovery: r}
		<-listed
		synctest.Wait()
		if h := m.UpstreamHeard(); !h.IsZero() {
			t.Fatalf("heard from the API server at %v after a failed list, want never", h)
		}
		up.setDown(false)
		for <-listed {
		}
		synctest.Wait()
		if h := m.UpstreamHeard(); !h.Equal(time.Now()) {
			t.Fatalf("heard from the API server at %v, want now (%v), when its list succeeded", h, time.Now())
		}
	})
}
