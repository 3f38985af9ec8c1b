package auth

import (
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// maxLimiterKeys bounds the sources a keyedLimiter remembers; the least
// recently seen is forgotten first (and starts with a full burst again).
const maxLimiterKeys = 4096

// keyedLimiter is a token bucket per key (a peer, a user), for the reviews
// that questions missing the caches cause.
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

// allow takes one token from key's bucket, if it has one.
func (k *keyedLimiter) allow(key string) bool {
	k.mu.Lock()
	l, ok := k.lims.Get(key)
	if !ok {
		l = rate.NewLimiter(k.limit, k.burst)
		k.lims.Add(key, l)
	}
	k.mu.Unlock()
	return l.Allow()
}
