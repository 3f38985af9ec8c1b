package auth

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"

	"github.com/informerd/informerd/internal/quote"
)

// Attributes are one thing a caller wants to do: a verb on a resource in a
// namespace (with the selectors it reads through), or a verb on a
// non-resource path.
type Attributes struct {
	Verb string
	// Resource; empty for a non-resource check.
	Resource schema.GroupVersionResource
	// Namespace, "" for all namespaces or a cluster-scoped resource.
	Namespace string
	// LabelSelector and FieldSelector, in their canonical string form, are
	// passed to authorizers that decide with selectors (RBAC ignores them).
	LabelSelector, FieldSelector string
	// Path of a non-resource check, for example "/metrics".
	Path string
}

// String describes a: "list configmaps in namespace a", "watch nodes
// cluster-wide", "get /metrics".
func (a Attributes) String() string {
	if a.Path != "" {
		return a.Verb + " " + a.Path
	}
	s := a.Verb + " " + a.Resource.GroupResource().String()
	if a.Namespace == "" {
		s += " cluster-wide"
	} else {
		s += " in namespace " + a.Namespace
	}
	if a.LabelSelector != "" {
		s += " with labels " + quote.String(a.LabelSelector)
	}
	if a.FieldSelector != "" {
		s += " with fields " + quote.String(a.FieldSelector)
	}
	return s
}

// AuthorizerOptions configure an Authorizer. Zero values take the
// documented defaults.
type AuthorizerOptions struct {
	// Reviews creates SubjectAccessReviews. Required.
	Reviews authorizationv1client.SubjectAccessReviewInterface
	// AllowTTL is how long an allowed access is remembered: an open stream
	// is checked again when it ends. Default 5m.
	AllowTTL time.Duration
	// DenyTTL is how long a denied access is remembered. Default 30s.
	DenyTTL time.Duration
	// CacheSize bounds each of the allow and deny caches. Default 16384.
	CacheSize int
	// ReviewOptions bound the SubjectAccessReviews of new checks, per
	// user.
	ReviewOptions
}

// ReviewOptions bound the reviews an Authenticator or an Authorizer makes.
// Zero values take the documented defaults.
type ReviewOptions struct {
	// ReviewTimeout bounds one review. Default 10s.
	ReviewTimeout time.Duration
	// ReviewsPerSecond and ReviewBurst limit the reviews that new
	// questions missing the caches cause (per user for an Authorizer; see
	// AuthenticatorOptions for an Authenticator). A Grant's re-checks are
	// not limited. Defaults 20 and 100.
	ReviewsPerSecond float64
	ReviewBurst      int
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics. Default: none are registered.
	Registerer prometheus.Registerer
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (o *ReviewOptions) setDefaults() {
	if o.ReviewTimeout <= 0 {
		o.ReviewTimeout = 10 * time.Second
	}
	if o.ReviewsPerSecond <= 0 {
		o.ReviewsPerSecond = 20
	}
	if o.ReviewBurst <= 0 {
		o.ReviewBurst = 100
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Authorizer checks accesses as the caller with SubjectAccessReview. It
// is safe for concurrent use.
type Authorizer struct {
	opts    AuthorizerOptions
	log     *slog.Logger
	allowed *expirable.LRU[accessKey, time.Time] // -> when the decision expires
	denied  *expirable.LRU[accessKey, decision]
	flight  singleflight.Group // of review, by access key
	limit   *keyedLimiter
	metrics *authzMetrics
	// carried answers accesses through an outage as the daemon this one
	// took over from would have (Import).
	carried graceMap[accessKey, struct{}]
}

// decision is the outcome of one review.
type decision struct {
	allowed bool
	reason  string
	expires time.Time
	err     error // the review failed: nothing is known
}

type accessKey [sha256.Size]byte

// NewAuthorizer returns an Authorizer.
func NewAuthorizer(opts AuthorizerOptions) (*Authorizer, error) {
	if opts.Reviews == nil {
		return nil, errors.New("auth: AuthorizerOptions.Reviews is required")
	}
	if opts.AllowTTL <= 0 {
		opts.AllowTTL = 5 * time.Minute
	}
	if opts.DenyTTL <= 0 {
		opts.DenyTTL = 30 * time.Second
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 16384
	}
	opts.setDefaults()
	m, err := newAuthzMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &Authorizer{
		opts:    opts,
		log:     opts.Logger,
		allowed: expirable.NewLRU[accessKey, time.Time](opts.CacheSize, nil, opts.AllowTTL),
		denied:  expirable.NewLRU[accessKey, decision](opts.CacheSize, nil, opts.DenyTTL),
		limit:   newKeyedLimiter(opts.ReviewsPerSecond, opts.ReviewBurst),
		metrics: m,
	}, nil
}

// Authorize returns nil and the time the decision expires if u may do a;
// the caller checks again after that to learn of a revoked permission (a
// Grant does). A question the caches cannot answer costs a review from
// u's budget. Errors wrap ErrDenied (naming the user and a), ErrThrottled
// or ErrUnavailable.
func (z *Authorizer) Authorize(ctx context.Context, u *User, a Attributes) (time.Time, error) {
	return z.authorize(ctx, u, a, classNew)
}

// AllowTTL returns how long an allowed access is remembered.
func (z *Authorizer) AllowTTL() time.Duration { return z.opts.AllowTTL }

// authorize is Authorize, with who pays for a review: a Grant's re-check
// pays nothing, so that a caller cannot dodge its re-checks by spending
// its own budget.
func (z *Authorizer) authorize(ctx context.Context, u *User, a Attributes, class reviewClass) (time.Time, error) {
	key := keyOfAccess(u, a)
	if d, ok := z.cached(key); ok {
		if d.allowed {
			z.metrics.cacheHits.WithLabelValues("allowed").Inc()
			return d.expires, nil
		}
		z.metrics.cacheHits.WithLabelValues("denied").Inc()
		return time.Time{}, z.deny(u, a, d.reason)
	}
	// Concurrent identical checks share one review, which outlives a
	// caller that leaves (it is bounded by ReviewTimeout), and which is
	// paid for as the caller that started it pays.
	ch := z.flight.DoChan(hex.EncodeToString(key[:]), func() (any, error) {
		// A review that ended between our look-up and this flight has
		// filled a cache: look again.
		if d, ok := z.cached(key); ok {
			return d, nil
		}
		if class == classNew && !z.limit.allow(u.Name, z.opts.Now()) {
			z.metrics.throttled.Inc()
			return decision{err: errorf(ErrThrottled, "too many new access checks by %s: at most %g SubjectAccessReviews per second (burst %d) for checks informerd has not cached; retry later",
				u.Name, z.opts.ReviewsPerSecond, z.opts.ReviewBurst)}, nil
		}
		d := z.review(u, a)
		switch {
		case d.err != nil:
		case d.allowed:
			z.allowed.Add(key, d.expires)
		default:
			z.denied.Add(key, d)
		}
		return d, nil
	})
	var d decision
	select {
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	case r := <-ch:
		d = r.Val.(decision)
	}
	switch {
	case errors.Is(d.err, ErrUnavailable):
		_, until, err := z.carried.answer(key, z.opts.Now(), time.Time{}, d.err)
		return until, err
	case d.err != nil:
		return time.Time{}, d.err
	case !d.allowed:
		return time.Time{}, z.deny(u, a, d.reason)
	}
	return d.expires, nil
}

// cached returns the unexpired decision the caches hold for key.
func (z *Authorizer) cached(key accessKey) (decision, bool) {
	now := z.opts.Now()
	if exp, ok := z.allowed.Get(key); ok && now.Before(exp) {
		return decision{allowed: true, expires: exp}, true
	}
	if d, ok := z.denied.Get(key); ok && now.Before(d.expires) {
		return d, true
	}
	return decision{}, false
}

func (z *Authorizer) deny(u *User, a Attributes, reason string) error {
	msg := fmt.Sprintf("%s may not %s", u.Name, a)
	if reason != "" {
		msg += ": " + quote.Message(reason, a.LabelSelector, a.FieldSelector)
	}
	return &Error{Kind: ErrDenied, Msg: msg, User: u.Name}
}

// review asks the API server whether u may do a.
func (z *Authorizer) review(u *User, a Attributes) decision {
	ctx, cancel := context.WithTimeout(context.Background(), z.opts.ReviewTimeout)
	defer cancel()
	spec := authorizationv1.SubjectAccessReviewSpec{User: u.Name, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		spec.Extra = make(map[string]authorizationv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			spec.Extra[k] = v
		}
	}
	if a.Path != "" {
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: a.Path, Verb: a.Verb}
	} else {
		ra := &authorizationv1.ResourceAttributes{
			Namespace: a.Namespace, Verb: a.Verb,
			Group: a.Resource.Group, Version: a.Resource.Version, Resource: a.Resource.Resource,
		}
		if a.LabelSelector != "" {
			ra.LabelSelector = &authorizationv1.LabelSelectorAttributes{RawSelector: a.LabelSelector}
		}
		if a.FieldSelector != "" {
			ra.FieldSelector = &authorizationv1.FieldSelectorAttributes{RawSelector: a.FieldSelector}
		}
		spec.ResourceAttributes = ra
	}
	r, err := z.opts.Reviews.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	now := z.opts.Now()
	if err != nil {
		z.metrics.reviews.WithLabelValues("error").Inc()
		z.log.Warn("SubjectAccessReview failed", "user", u.Name, "access", a.String(), "err", err)
		return decision{err: errorf(ErrUnavailable, "cannot check whether %s may %s now: SubjectAccessReview failed: %v", u.Name, a, err)}
	}
	if r.Status.Allowed {
		z.metrics.reviews.WithLabelValues("allowed").Inc()
		return decision{allowed: true, expires: now.Add(z.opts.AllowTTL)}
	}
	z.metrics.reviews.WithLabelValues("denied").Inc()
	reason := r.Status.Reason
	if reason == "" {
		reason = r.Status.EvaluationError
	}
	return decision{reason: reason, expires: now.Add(z.opts.DenyTTL)}
}

// keyOfAccess hashes everything a review depends on: the user as the
// authenticator described it and the attributes, each field length-prefixed
// so that no two questions share a key.
func keyOfAccess(u *User, a Attributes) accessKey {
	h := sha256.New()
	write := func(s string) { writeField(h, s) }
	count := func(n int) { writeField(h, strconv.Itoa(n)) }
	write(u.Name)
	write(u.UID)
	count(len(u.Groups))
	for _, g := range slices.Sorted(slices.Values(u.Groups)) {
		write(g)
	}
	count(len(u.Extra))
	for _, k := range slices.Sorted(maps.Keys(u.Extra)) {
		write(k)
		count(len(u.Extra[k]))
		for _, v := range u.Extra[k] {
			write(v)
		}
	}
	for _, s := range []string{a.Verb, a.Resource.Group, a.Resource.Version, a.Resource.Resource, a.Namespace, a.LabelSelector, a.FieldSelector, a.Path} {
		write(s)
	}
	var k accessKey
	h.Sum(k[:0])
	return k
}

func writeField(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}
