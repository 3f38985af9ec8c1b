package auth

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/informerd/informerd/internal/quote"
)

// Keys of the user.extra the API server sets for a token bound to a pod.
const (
	ExtraPodName  = "authentication.kubernetes.io/pod-name"
	ExtraNodeName = "authentication.kubernetes.io/node-name"
)

// DefaultAudience is the audience informerd's tokens are projected for.
const DefaultAudience = "informerd"

// User is an authenticated caller, as the API server's TokenReview
// described it. It is immutable.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
	// Pod and Node are the pod ("namespace/name") and node the token is
	// bound to, or "".
	Pod, Node string
}

// AuthenticatorOptions configure an Authenticator. Zero values take the
// documented defaults.
type AuthenticatorOptions struct {
	// Reviews creates TokenReviews. Required.
	Reviews authenticationv1client.TokenReviewInterface
	// Audience a token must be issued for. Default DefaultAudience.
	Audience string
	// NodeName is the node the daemon serves: a token bound to a pod on
	// another node is refused. Empty: no node check.
	NodeName string
	// CacheTTL bounds how long a verified token is remembered; never past
	// the token's own expiry. Default 1m.
	CacheTTL time.Duration
	// NegativeTTL is how long a rejected token is remembered. Default 10s.
	NegativeTTL time.Duration
	// CacheSize bounds the tokens remembered. Default 4096.
	CacheSize int
	// ReviewOptions bound the TokenReviews of tokens informerd has not
	// seen: ReviewsPerSecond and ReviewBurst are shared by all sources
	// together, each source (a peer: see Peer.Key) having at most
	// MaxPendingPerSource of them waiting or in flight. Re-checks of a
	// stream's token (see Grant) are never limited, and a new token of a
	// ServiceAccount whose token was accepted within the last knownTTL (a
	// rotated token) is limited per ServiceAccount instead.
	ReviewOptions
	// MaxPendingPerSource bounds the reviews of new tokens one source may
	// have waiting or in flight; more are refused with ErrThrottled.
	// Default 4.
	MaxPendingPerSource int
}

// Authenticator verifies bearer tokens with TokenReview. It is safe for
// concurrent use.
type Authenticator struct {
	opts   AuthenticatorOptions
	log    *slog.Logger
	cache  *expirable.LRU[tokenKey, tokenEntry]
	flight singleflight.Group // of review, by token key
	// strangers is the budget of reviews for tokens not seen before.
	strangers *sharedBudget
	// known holds the ServiceAccounts ("namespace/name") whose tokens
	// were accepted recently; rotated tokens of them are reviewed on the
	// per-ServiceAccount budget rotations.
	known     *expirable.LRU[string, struct{}]
	rotations *keyedLimiter
	metrics   *authnMetrics
	// carried answers tokens through an outage as the daemon this one
	// took over from would have (Import).
	carried graceMap[tokenKey, *User]

	grantsMu sync.Mutex
	grants   map[*Grant]struct{} // the live Grants, for Export
}

// reviewClass is who pays for a TokenReview.
type reviewClass uint8

const (
	// classNew: a caller presents a token; its source pays.
	classNew reviewClass = iota
	// classRecheck: a Grant re-checks the token of a stream it already
	// serves; nobody pays, as the number of streams bounds it.
	classRecheck
)

// Budgets of rotated tokens: how long a ServiceAccount whose token was
// accepted is known, and how many tokens of it may be reviewed as
// rotations (the kubelet rotates a projected token after 80% of its life,
// so a few pods of one ServiceAccount need a review every few minutes).
const (
	knownTTL       = time.Hour
	rotationsPerS  = 1
	rotationBurst  = 10
	maxPendingWait = 5 * time.Second // a new token waits at most this long for the budget
)

// tokenEntry is a remembered answer: a user or a rejection.
type tokenEntry struct {
	user    *User
	err     error
	expires time.Time
}

// NewAuthenticator returns an Authenticator.
func NewAuthenticator(opts AuthenticatorOptions) (*Authenticator, error) {
	if opts.Reviews == nil {
		return nil, errors.New("auth: AuthenticatorOptions.Reviews is required")
	}
	if opts.Audience == "" {
		opts.Audience = DefaultAudience
	}
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = time.Minute
	}
	if opts.NegativeTTL <= 0 {
		opts.NegativeTTL = 10 * time.Second
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 4096
	}
	if opts.MaxPendingPerSource <= 0 {
		opts.MaxPendingPerSource = 4
	}
	opts.setDefaults()
	m, err := newAuthnMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &Authenticator{
		opts:      opts,
		log:       opts.Logger,
		cache:     expirable.NewLRU[tokenKey, tokenEntry](opts.CacheSize, nil, max(opts.CacheTTL, opts.NegativeTTL)),
		strangers: newSharedBudget(opts.ReviewsPerSecond, opts.ReviewBurst, opts.MaxPendingPerSource, min(maxPendingWait, opts.ReviewTimeout)),
		known:     expirable.NewLRU[string, struct{}](opts.CacheSize, nil, knownTTL),
		rotations: newKeyedLimiter(rotationsPerS, rotationBurst),
		metrics:   m,
	}, nil
}

// Audience returns the audience tokens must be issued for.
func (a *Authenticator) Audience() string { return a.opts.Audience }

// Authenticate returns the caller of an authorization header's values
// (see ParseBearer) and the time until which that answer holds (the
// token's expiry or the cache's, whichever is first). source names where
// the request came from (a peer), for the limit on TokenReviews.
//
// Errors wrap ErrUnauthenticated (with the reason: no token, malformed,
// expired, wrong audience, ServiceAccount or pod deleted, bound to another
// node), ErrThrottled or ErrUnavailable.
func (a *Authenticator) Authenticate(ctx context.Context, authorization []string, source string) (*User, time.Time, error) {
	token, err := ParseBearer(authorization)
	if errors.Is(err, errNoToken) {
		err = errorf(ErrUnauthenticated, "no token: send a projected ServiceAccount token with audience %q as the authorization \"Bearer <token>\" (the client library reads it from a token file)", a.opts.Audience)
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	return a.authenticate(ctx, token, source, classNew)
}

// authenticate is Authenticate for a token already extracted, with who
// pays for a review.
func (a *Authenticator) authenticate(ctx context.Context, token, source string, class reviewClass) (*User, time.Time, error) {
	key := keyOf(token)
	if e, ok := a.cache.Get(key); ok && a.opts.Now().Before(e.expires) {
		a.metrics.cacheHits.Inc()
		return e.user, e.expires, e.err
	}
	c, err := parseClaims(token)
	if err != nil {
		// Only JWTs can carry an audience other than the API server's:
		// nothing else could pass the review, so nothing else costs one.
		return nil, time.Time{}, errorf(ErrUnauthenticated, "malformed token: %v", err)
	}
	// Concurrent callers with one token share one review, which outlives a
	// caller that leaves (it is bounded by ReviewTimeout), and which is
	// paid for as the caller that started it pays.
	ch := a.flight.DoChan(hex.EncodeToString(key[:]), func() (any, error) {
		// A review that ended between our look-up and this flight has
		// filled the cache: look again.
		if e, ok := a.cache.Get(key); ok && a.opts.Now().Before(e.expires) {
			return e, nil
		}
		if class == classNew && !a.admitRotation(c) {
			wait, done, ok := a.strangers.admit(source, a.opts.Now())
			if !ok {
				a.metrics.throttled.Inc()
				return tokenEntry{err: errorf(ErrThrottled, "too many new tokens: informerd reviews at most %g tokens it has not seen per second (burst %d) for all callers, and %d at once from %s; retry in a second",
					a.opts.ReviewsPerSecond, a.opts.ReviewBurst, a.opts.MaxPendingPerSource, source)}, nil
			}
			defer done()
			if wait > 0 {
				t := time.NewTimer(wait) // at most maxPendingWait
				<-t.C
			}
		}
		e := a.review(token, c)
		if e.expires.After(a.opts.Now()) {
			a.cache.Add(key, e)
		}
		return e, nil
	})
	select {
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	case r := <-ch:
		e := r.Val.(tokenEntry)
		if errors.Is(e.err, ErrUnavailable) {
			return a.carried.answer(key, a.opts.Now(), c.expiry(), e.err)
		}
		return e.user, e.expires, e.err
	}
}

// admitRotation reports whether a new token may be reviewed as a rotated
// token of a known ServiceAccount, on that ServiceAccount's budget. Its
// claims are unverified: a forged claim spends only that ServiceAccount's
// rotations, after which its tokens are reviewed as strangers'.
func (a *Authenticator) admitRotation(c claims) bool {
	sa := c.serviceAccount()
	if sa == "" || !a.known.Contains(sa) {
		return false
	}
	return a.rotations.allow(sa, a.opts.Now())
}

// review asks the API server about token.
func (a *Authenticator) review(token string, c claims) tokenEntry {
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.ReviewTimeout)
	defer cancel()
	tr, err := a.opts.Reviews.Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{a.opts.Audience}},
	}, metav1.CreateOptions{})
	now := a.opts.Now()
	if err != nil {
		a.metrics.reviews.WithLabelValues("error").Inc()
		a.log.Warn("TokenReview failed", "err", err)
		return tokenEntry{err: errorf(ErrUnavailable, "cannot verify the token now: TokenReview failed: %v", err)}
	}
	reject := func(format string, args ...any) tokenEntry {
		a.metrics.reviews.WithLabelValues("rejected").Inc()
		e := tokenEntry{err: errorf(ErrUnauthenticated, format, args...), expires: now.Add(a.opts.NegativeTTL)}
		a.log.Info("token rejected", "serviceAccount", c.serviceAccount(), "reason", e.err)
		return e
	}
	st := tr.Status
	if !st.Authenticated {
		return reject("%s", a.explain(c, st.Error, now))
	}
	// Fail closed: an authenticator that does not say which audiences it
	// checked (a webhook, an old API server) has not checked ours.
	if !slices.Contains(st.Audiences, a.opts.Audience) {
		if len(st.Audiences) == 0 {
			return reject("the API server accepted the token without confirming its audience %q (status.audiences is empty): informerd needs an authenticator that checks audiences, as the API server's ServiceAccount token authenticator does", a.opts.Audience)
		}
		return reject("wrong audience: the API server accepted the token for %q, not %q", st.Audiences, a.opts.Audience)
	}
	u := userOf(st.User)
	if a.opts.NodeName != "" && u.Pod != "" {
		// A token bound to a pod is good only on that pod's node. One bound
		// to no pod (a TokenRequest without a bound object) is good where
		// the API server accepts it, on any node.
		switch {
		case u.Node == "":
			return reject("the token is bound to pod %s, and the API server did not say on which node (no %s in the review: Kubernetes before 1.30): this informerd serves node %s only and cannot check it",
				u.Pod, ExtraNodeName, a.opts.NodeName)
		case u.Node != a.opts.NodeName:
			return reject("the token is bound to pod %s on node %s, and this informerd serves node %s: connect to the informerd of your own node", u.Pod, u.Node, a.opts.NodeName)
		}
	}
	if sa := c.serviceAccount(); sa != "" {
		a.known.Add(sa, struct{}{})
	}
	a.metrics.reviews.WithLabelValues("authenticated").Inc()
	expires := now.Add(a.opts.CacheTTL)
	if exp := c.expiry(); !exp.IsZero() && exp.Before(expires) {
		// Not past now even if the clocks disagree: the API server has
		// just accepted the token.
		expires = exp
		if floor := now.Add(time.Second); expires.Before(floor) {
			expires = floor
		}
	}
	return tokenEntry{user: u, expires: expires}
}

// explain says why the API server rejected a token, in words a person can
// act on, from the token's unverified claims and the review's error. The
// kube-apiserver (v1.37, pkg/serviceaccount/claims.go) checks the
// ServiceAccount first, then the object the token is bound to, and says
// (after "[invalid bearer token, ", its loopback authenticator's):
//
//   - serviceaccounts "<name>" not found: the ServiceAccount was deleted;
//   - service account <ns>/<name> has been deleted: its deletion is pending;
//   - service account UID (<uid>) does not match claim (<uid>): it was
//     deleted and another of its name created;
//   - service account token has been invalidated: the pod (node, Secret)
//     it is bound to was deleted, or its deletion is pending;
//   - pod UID (<uid>) does not match service account pod ref claim
//     (<uid>): the pod was deleted and another of its name created (node
//     UID ... node ref claim, for a node).
func (a *Authenticator) explain(c claims, reviewErr string, now time.Time) string {
	sa := c.serviceAccount()
	var pod, node string
	if k := c.K8s; k != nil && k.Pod != nil {
		pod = k.Namespace + "/" + k.Pod.Name
	}
	if k := c.K8s; k != nil && k.Node != nil {
		node = k.Node.Name
	}
	says := func(s string) bool { return strings.Contains(reviewErr, s) }
	invalidated := says("service account token has been invalidated")
	switch {
	case !c.expiry().IsZero() && !now.Before(c.expiry()):
		return fmt.Sprintf("the token expired at %s: read the token file again (the kubelet rotates projected tokens)", c.expiry().UTC().Format(time.RFC3339))
	case !slices.Contains(c.Audience, a.opts.Audience):
		return fmt.Sprintf("wrong audience: the token is for %q, not %q: project a ServiceAccount token with audience %q", []string(c.Audience), a.opts.Audience, a.opts.Audience)
	case sa != "" && (says(fmt.Sprintf("serviceaccounts %q not found", c.K8s.ServiceAccount.Name)) || says("service account "+sa+" has been deleted")):
		return fmt.Sprintf("the token's ServiceAccount %s has been deleted: mint a token for an existing ServiceAccount", sa)
	case sa != "" && says("service account UID ("):
		return fmt.Sprintf("the token's ServiceAccount %s has been deleted (another of its name was created since): mint a new token for it", sa)
	case pod != "" && invalidated:
		return fmt.Sprintf("the pod %s the token is bound to was deleted: a pod's token is valid only while that pod exists; use the token projected into a running pod", pod)
	case pod != "" && says("pod UID ("):
		return fmt.Sprintf("the pod %s the token is bound to was deleted (another pod of its name was created since): use the token projected into the running pod", pod)
	case node != "" && (invalidated || says("node UID (")):
		return fmt.Sprintf("the node %s the token is bound to was deleted (or replaced): mint a token bound to an existing node", node)
	case invalidated:
		return "the object the token is bound to was deleted: mint a token bound to an existing object"
	}
	return "the API server rejected the token: " + quote.Message(reviewErr)
}

func userOf(u authenticationv1.UserInfo) *User {
	out := &User{Name: u.Username, UID: u.UID, Groups: slices.Clone(u.Groups), Extra: map[string][]string{}}
	for k, v := range u.Extra {
		out.Extra[k] = slices.Clone([]string(v))
	}
	if v := out.Extra[ExtraNodeName]; len(v) == 1 {
		out.Node = v[0]
	}
	if v := out.Extra[ExtraPodName]; len(v) == 1 {
		ns := ""
		if parts := strings.Split(u.Username, ":"); len(parts) == 4 && parts[0] == "system" && parts[1] == "serviceaccount" {
			ns = parts[2] + "/"
		}
		out.Pod = ns + v[0]
	}
	return out
}
