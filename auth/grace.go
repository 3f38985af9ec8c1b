package auth

import (
	"fmt"
	"sync"
	"time"
)

// graceMap holds what a hot handoff said the daemon before this one was
// serving through an API server outage (Import): for each token or access
// key, its value and when that daemon's grace (see Grant) would have
// ended. It answers only questions that the API server cannot answer now,
// and each answer for at most recheckRetry, so that a Grant built on one
// asks the API server again as soon as it is back, as the old daemon's
// Grant would have. It holds at most the entries Import put in it.
type graceMap[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]graceEntry[V]
}

type graceEntry[V any] struct {
	v     V
	until time.Time
}

// put remembers v for k until until, keeping the later of two, unless the
// map holds limit keys already; it reports whether it took it.
func (g *graceMap[K, V]) put(k K, v V, until time.Time, limit int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[K]graceEntry[V]{}
	}
	old, ok := g.m[k]
	if !ok && len(g.m) >= limit {
		return false
	}
	if !ok || until.After(old.until) {
		g.m[k] = graceEntry[V]{v: v, until: until}
	}
	return true
}

// answer answers a question about k that failed with unavailable (an
// ErrUnavailable) from the grace carried for it, never past notAfter (if
// set): the value and until when it holds. Without an entry it returns
// unavailable; with one whose grace ended, an error that is both
// ErrUnavailable and errGraceSpent, so that a Grant does not start a grace
// of its own on top.
func (g *graceMap[K, V]) answer(k K, now, notAfter time.Time, unavailable error) (v V, until time.Time, err error) {
	g.mu.Lock()
	e, ok := g.m[k]
	if ok && !now.Before(e.until) {
		delete(g.m, k)
	}
	g.mu.Unlock()
	if !ok {
		return v, time.Time{}, unavailable
	}
	end := e.until
	if !notAfter.IsZero() && notAfter.Before(end) {
		end = notAfter
	}
	if !now.Before(end) {
		return v, time.Time{}, fmt.Errorf("%w; the grace the daemon this one took over from gave it through the outage ended at %s: %w",
			unavailable, end.UTC().Format(time.RFC3339), errGraceSpent)
	}
	if retry := now.Add(recheckRetry); retry.Before(end) {
		end = retry
	}
	return e.v, end, nil
}
