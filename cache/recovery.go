package cache

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/informerd/informerd/internal/backoff"
)

// recovery tells the Sources waiting to retry the API server that it is
// back (Manager.UpstreamRecovered), so that they retry within window,
// each after a random delay in [0, window): after an outage every
// informer comes back within the window instead of up to its grown
// backoff (30 s) later, and the node's re-lists, like the fleet's, are
// spread evenly over the window instead of arriving at once.
//
// It also records when an informer last heard from the API server
// (Manager.UpstreamHeard), so that the readiness prober need not ask it
// while watches show it is there.
type recovery struct {
	window time.Duration
	heard  atomic.Int64 // unix nanoseconds; 0: never
	mu     sync.Mutex
	back   chan struct{} // closed at the next recovery, then replaced
}

// mark records that a Source heard from the API server now; a nil
// recovery records nothing.
func (r *recovery) mark() {
	if r != nil {
		r.heard.Store(time.Now().UnixNano())
	}
}

func newRecovery(window time.Duration) *recovery {
	return &recovery{window: window, back: make(chan struct{})}
}

// next returns a channel that is closed when the API server is next
// reported back; nil for a nil recovery.
func (r *recovery) next() <-chan struct{} {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.back
}

// signal reports the API server back to every Source waiting.
func (r *recovery) signal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.back)
	r.back = make(chan struct{})
}

// delay draws a Source's delay after a recovery.
func (r *recovery) delay() time.Duration {
	if r.window <= 0 {
		return 0
	}
	return rand.N(r.window)
}

// pause waits out bo's next delay before a retry of the API server. If
// the API server is reported back meanwhile, it waits instead a delay
// drawn from the recovery window, from then, and bo starts over.
// Errors: ctx.Err().
func (s *Source) pause(ctx context.Context, bo *backoff.Backoff) error {
	back := s.cfg.recovery.next()
	t := time.NewTimer(bo.Next())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-back:
			back = nil
			bo.Reset()
			t.Reset(s.cfg.recovery.delay())
		}
	}
}

// UpstreamRecovered reports that the API server answers again after
// failing (the daemon's readiness probe saw it come back): every informer
// waiting to retry it does so within Options.RecoveryWindow.
func (m *Manager) UpstreamRecovered() {
	m.log.Info("the API server is back: informers waiting to retry it do so within the recovery window", "window", m.opts.RecoveryWindow)
	m.recovery.signal()
}

// UpstreamHeard returns when an informer last received anything from the
// API server: a list, a watch event or a bookmark; the zero time if none
// has.
func (m *Manager) UpstreamHeard() time.Time {
	if n := m.recovery.heard.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}
