package auth

import (
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// maxLimiterKeys bounds the sources a keyedLimiter remembers; the least
// recently seen is forgotten first (and starts with a full burst again).
const maxLimiterKeys = 4096

// keyedLimiter is a token bucket per key (a user, a ServiceAccount), for
// the reviews that questions missing the caches cause.
type keyedLimiter struct {
	limit rate.Limit
	burst int

	mu   sync.Mutex // guards lims: a Get and its Add are one step
	lims *lru.Cache[string, *rate.Limiter]
}

func newKeyedLimiter(perSecond float64, burst int) *keyedLimiter {
	lims, _ := lru.New[string, *rate.Limiter](maxLimiterKeys) // size > 0: cannot fail
	return &keyedLimiter{limit: rate.Limit(perSecond), burst: burst, lims: lims}
}

// allow takes one token from key's bucket at now, if it has one.
func (k *keyedLimiter) allow(key string, now time.Time) bool {
	k.mu.Lock()
	l, ok := k.lims.Get(key)
	if !ok {
		l = rate.NewLimiter(k.limit, k.burst)
		k.lims.Add(key, l)
	}
	k.mu.Unlock()
	return l.AllowN(now, 1)
}

// sharedBudget is one budget of reviews for all sources together, shared
// fairly: each source has at most perSource reviews waiting or in flight,
// and reviews are served in the order they were admitted. A source that
// floods therefore delays another source's review by at most perSource
// review slots (times the number of sources flooding), and no number of
// requests from strangers spends more than the budget.
type sharedBudget struct {
	lim       *rate.Limiter
	perSource int
	maxWait   time.Duration

	mu   sync.Mutex     // guards busy
	busy map[string]int // reviews waiting or in flight, by source; no zero entries
}

func newSharedBudget(perSecond float64, burst, perSource int, maxWait time.Duration) *sharedBudget {
	return &sharedBudget{lim: rate.NewLimiter(rate.Limit(perSecond), burst), perSource: perSource, maxWait: maxWait, busy: map[string]int{}}
}

// admit reserves a review for source at now. It returns how long to wait
// before making it and the func to call once it is made; ok is false when
// source already has perSource reviews pending, or when the budget is
// spent for longer than maxWait.
func (b *sharedBudget) admit(source string, now time.Time) (wait time.Duration, done func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.busy[source] >= b.perSource {
		return 0, nil, false
	}
	r := b.lim.ReserveN(now, 1)
	if wait = r.DelayFrom(now); !r.OK() || wait > b.maxWait {
		r.CancelAt(now)
		return 0, nil, false
	}
	b.busy[source]++
	var once sync.Once
	return wait, func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.busy[source]--; b.busy[source] <= 0 {
				delete(b.busy, source)
			}
		})
	}, true
}
