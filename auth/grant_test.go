package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
)

// grantFixture is an Authenticator and an Authorizer over fakes whose
// answers a test switches, for Grants made inside a synctest bubble. They
// are made outside it: their caches' expiry goroutines never end, and run
// on the real clock (the caches' own expiry checks read the bubble's).
type grantFixture struct {
	authn   *Authenticator
	authz   *Authorizer
	tokens  *fakeTokenReviews
	access  *fakeAccessReviews
	expired atomic.Bool // the API server rejects the token
	denied  atomic.Bool // the API server denies every access
	down    atomic.Bool // the API server is unreachable
}

func newGrantFixture(t *testing.T, authn AuthenticatorOptions, authz AuthorizerOptions) *grantFixture {
	t.Helper()
	f := &grantFixture{}
	f.tokens = &fakeTokenReviews{review: func(tr *authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		switch {
		case f.down.Load():
			return nil, errors.New("connection refused")
		case f.expired.Load():
			return &authenticationv1.TokenReviewStatus{Error: "token has expired"}, nil
		}
		return authenticated(nil)(tr)
	}}
	f.access = &fakeAccessReviews{decide: func(authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
		if f.down.Load() {
			return authorizationv1.SubjectAccessReviewStatus{}, errors.New("connection refused")
		}
		return authorizationv1.SubjectAccessReviewStatus{Allowed: !f.denied.Load()}, nil
	}}
	authn.Reviews, authn.Logger = f.tokens, slog.New(slog.DiscardHandler)
	authz.Reviews, authz.Logger = f.access, slog.New(slog.DiscardHandler)
	var err error
	if f.authn, err = NewAuthenticator(authn); err != nil {
		t.Fatal(err)
	}
	if f.authz, err = NewAuthorizer(authz); err != nil {
		t.Fatal(err)
	}
	return f
}

// revocation records a Grant's revocation.
type revocation struct {
	mu  sync.Mutex // guards err and at
	err error
	at  time.Time
}

func (r *revocation) revoke(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		panic("revoked twice")
	}
	r.err, r.at = err, time.Now()
}

func (r *revocation) get() (error, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err, r.at
}

// grant authenticates a token that expires at exp (none if zero) and
// returns a Grant of it with the accesses.
func (f *grantFixture) grant(t *testing.T, ctx context.Context, exp time.Time, accesses ...Attributes) (*Grant, *revocation) {
	t.Helper()
	claims := map[string]any{"aud": "informerd", "jti": fmt.Sprint(time.Now().UnixNano())}
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	token := jwt(claims)
	u, until, err := f.authn.Authenticate(ctx, bearer(token), "uid 1")
	if err != nil {
		t.Fatal(err)
	}
	r := &revocation{}
	g, err := NewGrant(ctx, GrantOptions{Authenticator: f.authn, Authorizer: f.authz, Token: token, User: u, TokenUntil: until, Revoke: r.revoke})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Add(ctx, accesses...); err != nil {
		t.Fatal(err)
	}
	return g, r
}

var listConfigMaps = Attributes{Verb: "list", Resource: configMaps, Namespace: "a"}

// TestGrantWithNothingToCheckDoesNotSpin: a Grant of no access (a status
// stream that has learned no kind yet) checks its token once per token
// cache TTL, and nothing else: no timer fires in between.
func TestGrantWithNothingToCheckDoesNotSpin(t *testing.T) {
	f := newGrantFixture(t, AuthenticatorOptions{CacheTTL: time.Minute}, AuthorizerOptions{})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		f.grant(t, ctx, time.Time{})
		time.Sleep(time.Hour)
		if got := f.tokens.calls.Load(); got < 60 || got > 61 {
			t.Fatalf("%d TokenReviews in an hour with a 1m token cache, want 60 or 61", got)
		}
		if got := f.access.calls.Load(); got != 0 {
			t.Fatalf("%d SubjectAccessReviews for no access", got)
		}
	})
}

// TestGrantRevokedAtTheNextDeadline: a denial after the access decision
// expires revokes the Grant at that expiry; a rejected token at the token
// cache's; a token that expires ends the Grant at its expiry, before the
// caches would.
func TestGrantRevokedAtTheNextDeadline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		exp   time.Duration // the token's lifetime, or 0 for none
		after func(*grantFixture)
		want  error
		by    time.Duration // revoked this long after the grant
	}{
		{"access denied", 0, func(f *grantFixture) { f.denied.Store(true) }, ErrDenied, 3 * time.Minute},
		{"token rejected (ServiceAccount deleted)", 0, func(f *grantFixture) { f.expired.Store(true) }, ErrUnauthenticated, time.Minute},
		{"token expired", 30 * time.Second, func(f *grantFixture) {}, ErrUnauthenticated, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGrantFixture(t, AuthenticatorOptions{CacheTTL: time.Minute}, AuthorizerOptions{AllowTTL: 3 * time.Minute})
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				start := time.Now()
				var exp time.Time
				if tc.exp > 0 {
					exp = start.Add(tc.exp)
					f.expired.Store(false)
				}
				_, r := f.grant(t, ctx, exp, listConfigMaps)
				tc.after(f)
				if tc.exp > 0 {
					f.expired.Store(true) // what the API server says of it once it expired
				}
				time.Sleep(time.Hour)
				err, at := r.get()
				if !errors.Is(err, tc.want) {
					t.Fatalf("revoked with %v, want %v", err, tc.want)
				}
				if d := at.Sub(start); d > tc.by+time.Second {
					t.Fatalf("revoked %s after the grant, want by %s", d, tc.by)
				}
			})
		})
	}
}

// TestGrantRechecksDrawOnNoBudget: a caller that has spent its own
// budget of reviews (by asking many new questions) is still re-checked,
// and revoked when its access is.
func TestGrantRechecksDrawOnNoBudget(t *testing.T) {
	f := newGrantFixture(t, AuthenticatorOptions{CacheTTL: time.Hour}, AuthorizerOptions{AllowTTL: 3 * time.Second,
		ReviewOptions: ReviewOptions{ReviewsPerSecond: 0.001, ReviewBurst: 2}})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		g, r := f.grant(t, ctx, time.Time{}, listConfigMaps) // one review of the budget
		err := g.Add(ctx, Attributes{Verb: "list", Resource: configMaps, Namespace: "a", LabelSelector: "x=1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Add(ctx, Attributes{Verb: "list", Resource: configMaps, Namespace: "a", LabelSelector: "x=2"}); !errors.Is(err, ErrThrottled) {
			t.Fatalf("the caller's budget is not spent: %v", err)
		}
		f.denied.Store(true)
		time.Sleep(time.Minute)
		if err, _ := r.get(); !errors.Is(err, ErrDenied) {
			t.Fatalf("after revocation, with the caller's budget spent: %v, want ErrDenied", err)
		}
	})
}

// TestGrantFailsOpenForTheGraceOnly: while the API server is unreachable a
// Grant serves on for its grace (the allow TTL by default), then is
// revoked with ErrUnavailable; when the API server is back within it, it
// serves on.
func TestGrantFailsOpenForTheGraceOnly(t *testing.T) {
	f := newGrantFixture(t, AuthenticatorOptions{CacheTTL: time.Hour}, AuthorizerOptions{AllowTTL: time.Minute})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		_, back := f.grant(t, ctx, time.Time{}, listConfigMaps)
		_, gone := f.grant(t, ctx, time.Time{}, Attributes{Verb: "watch", Resource: configMaps, Namespace: "a"})
		f.down.Store(true)
		time.Sleep(90 * time.Second) // the first re-check failed at 1m; within the grace
		if err, _ := back.get(); err != nil {
			t.Fatalf("revoked within the grace: %v", err)
		}
		f.down.Store(false)
		time.Sleep(20 * time.Second) // a retry succeeds
		f.down.Store(true)
		time.Sleep(time.Hour)
		err, at := gone.get()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("revoked with %v, want ErrUnavailable after the grace", err)
		}
		if d := at.Sub(start); d < 2*time.Minute || d > 5*time.Minute {
			t.Fatalf("revoked %s after the grant, want about 1m (the decision) + 1m (the grace) + a retry after the recovery", d)
		}
	})
}
