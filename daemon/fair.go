package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/time/rate"
)

// maxBudgetCallers bounds the callers whose budgets the daemon remembers;
// the least recently seen is forgotten first and starts again with a full
// burst. Forgetting one needs this many other identities (ServiceAccounts
// a caller can authenticate as) in between, each with its own budget.
const maxBudgetCallers = 4096

// inFlightRetry is the retry delay a call refused for its caller's calls
// in flight suggests: one of them ends about that soon.
const inFlightRetry = 100 * time.Millisecond

// retryLater is a refusal that may succeed later: RESOURCE_EXHAUSTED with
// after as the RetryInfo delay (see toStatus), which clients wait before
// they retry.
type retryLater struct {
	err   error // wraps errLimit
	after time.Duration
}

func (e *retryLater) Error() string { return e.err.Error() }
func (e *retryLater) Unwrap() error { return e.err }

// retryAfter returns err (which wraps errLimit) as a retryLater.
func retryAfter(after time.Duration, err error) error {
	return &retryLater{err: err, after: max(after, time.Millisecond)}
}

// retryDelay returns the retry delay err carries, if any.
func retryDelay(err error) (time.Duration, bool) {
	var rl *retryLater
	if errors.As(err, &rl) {
		return rl.after, true
	}
	return 0, false
}

// callerBudgets are each caller's share of one thing the daemon does for
// callers (unary calls, new informers): a token bucket per caller (rate,
// burst) and, if inFlight > 0, a cap on what a caller has in flight. A
// caller's share is its own: however much one caller asks, it spends only
// its own bucket and slots, so every caller is served in proportion to
// what it asks up to the same share (what the API server's APF does with
// a queue per flow). A request whose token comes within maxWait waits for
// it, holding one of its caller's slots; beyond that it is refused with
// the delay at which a token comes, so that no wait is longer than
// maxWait and no number of waiters is more than inFlight per caller.
type callerBudgets struct {
	limit    rate.Limit
	burst    int
	inFlight int // 0: not capped
	maxWait  time.Duration

	mu      sync.Mutex // guards callers and every budget's inFlight
	callers *simplelru.LRU[string, *budget]
}

// budget is one caller's.
type budget struct {
	tokens   *rate.Limiter
	inFlight int // guarded by callerBudgets.mu
}

func newCallerBudgets(perSecond float64, burst, inFlight int, maxWait time.Duration) *callerBudgets {
	callers, _ := simplelru.NewLRU[string, *budget](maxBudgetCallers, nil) // size > 0: cannot fail
	return &callerBudgets{limit: rate.Limit(perSecond), burst: burst, inFlight: inFlight, maxWait: maxWait, callers: callers}
}

// reserve takes one of name's tokens and, if capped, one of its slots at
// now. It returns how long to wait before going on, the token's
// reservation (to cancel if the request gives up waiting) and the func
// that gives the slot back (idempotent; nil when refused), or, when the
// caller has inFlight requests in flight or its next token comes later
// than maxWait, the delay after which to retry.
func (b *callerBudgets) reserve(name string, now time.Time) (wait time.Duration, token *rate.Reservation, done func(), retry time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	bu, ok := b.callers.Get(name)
	if !ok {
		bu = &budget{tokens: rate.NewLimiter(b.limit, b.burst)}
		b.callers.Add(name, bu)
	}
	if b.inFlight > 0 && bu.inFlight >= b.inFlight {
		return 0, nil, nil, inFlightRetry
	}
	r := bu.tokens.ReserveN(now, 1)
	if wait = r.DelayFrom(now); !r.OK() || wait > b.maxWait {
		r.CancelAt(now)
		return 0, nil, nil, wait
	}
	bu.inFlight++
	var once sync.Once
	return wait, r, func() {
		once.Do(func() {
			b.mu.Lock()
			bu.inFlight-- // bu may have been forgotten meanwhile: then no one counts on it
			b.mu.Unlock()
		})
	}, 0
}

// admit reserves for name as reserve does and waits out the reservation's
// delay. It returns the func that gives the slot back, or a retryLater
// (wrapping errLimit, its message naming what) when refused, or ctx's
// error if ctx ends while it waits.
func (b *callerBudgets) admit(ctx context.Context, name, what string) (func(), error) {
	wait, token, done, retry := b.reserve(name, time.Now())
	if done == nil {
		return nil, retryAfter(retry, fmt.Errorf("%w: %s is over its share of %s: retry after %s", errLimit, name, what, retry.Round(time.Millisecond)))
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			token.Cancel() // for the caller's next request
			done()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return done, nil
}

// allow takes one of name's tokens at now if one is there, and returns 0;
// else it takes none and returns the delay until one comes.
func (b *callerBudgets) allow(name string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	bu, ok := b.callers.Get(name)
	if !ok {
		bu = &budget{tokens: rate.NewLimiter(b.limit, b.burst)}
		b.callers.Add(name, bu)
	}
	r := bu.tokens.ReserveN(now, 1)
	if d := r.DelayFrom(now); !r.OK() || d > 0 {
		r.CancelAt(now)
		return max(d, time.Millisecond)
	}
	return 0
}
