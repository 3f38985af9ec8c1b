package auth

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// authnMetrics are the Authenticator's metrics.
type authnMetrics struct {
	reviews   *prometheus.CounterVec
	cacheHits prometheus.Counter
	throttled prometheus.Counter
}

func newAuthnMetrics(reg prometheus.Registerer) (*authnMetrics, error) {
	m := &authnMetrics{
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "informerd_token_reviews_total", Help: "TokenReviews sent to the API server, by result: authenticated, rejected or error.",
		}, []string{"result"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_token_cache_hits_total", Help: "Tokens answered from the token cache, without a TokenReview.",
		}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_token_reviews_throttled_total", Help: "Tokens refused because their source exceeded its rate of TokenReviews.",
		}),
	}
	return m, register(reg, m.reviews, m.cacheHits, m.throttled)
}

// authzMetrics are the Authorizer's metrics.
type authzMetrics struct {
	reviews   *prometheus.CounterVec
	cacheHits *prometheus.CounterVec
	throttled prometheus.Counter
}

func newAuthzMetrics(reg prometheus.Registerer) (*authzMetrics, error) {
	m := &authzMetrics{
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "informerd_access_reviews_total", Help: "SubjectAccessReviews sent to the API server, by result: allowed, denied or error.",
		}, []string{"result"}),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "informerd_access_cache_hits_total", Help: "Access decisions answered from a cache, by decision: allowed or denied.",
		}, []string{"decision"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_access_reviews_throttled_total", Help: "Access checks refused because their caller exceeded its rate of SubjectAccessReviews.",
		}),
	}
	return m, register(reg, m.reviews, m.cacheHits, m.throttled)
}

func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("auth: registering metrics: %w", err)
		}
	}
	return nil
}
