package auth

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
)

// unreachable fails every review, as an API server that is down does.
func unreachable() (*fakeTokenReviews, *fakeAccessReviews) {
	down := errors.New("connection refused")
	return &fakeTokenReviews{review: func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) { return nil, down }},
		&fakeAccessReviews{decide: func(authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
			return authorizationv1.SubjectAccessReviewStatus{}, down
		}}
}

// What one daemon verified, another daemon answers from it (here, its
// reviews all failing) with the same user and the same expiries, after a
// round trip through JSON as the handoff carries it; what was denied or
// never asked still needs a review.
func TestImportAnswersWhatExportRemembered(t *testing.T) {
	c := newClock()
	ctx := context.Background()
	a := newTestAuthenticator(t, &fakeTokenReviews{review: authenticated(nil)}, c, AuthenticatorOptions{NodeName: "n1"})
	z := newTestAuthorizer(t, &fakeAccessReviews{decide: inNamespaceA}, c, AuthorizerOptions{})
	token := bearer(jwt(map[string]any{"exp": c.Now().Add(time.Hour).Unix()}))
	u, userUntil, err := a.Authenticate(ctx, token, "uid 1")
	if err != nil {
		t.Fatal(err)
	}
	inA := Attributes{Verb: "watch", Resource: configMaps, Namespace: "a"}
	inB := Attributes{Verb: "watch", Resource: configMaps, Namespace: "b"}
	accessUntil, err := z.Authorize(ctx, u, inA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := z.Authorize(ctx, u, inB); !errors.Is(err, ErrDenied) {
		t.Fatalf("namespace b: %v, want ErrDenied", err)
	}
	data, err := json.Marshal(Export(a, z))
	if err != nil {
		t.Fatal(err)
	}
	var r Remembered
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}

	c.advance(10 * time.Second)
	ft, fz := unreachable()
	a2 := newTestAuthenticator(t, ft, c, AuthenticatorOptions{NodeName: "n1"})
	z2 := newTestAuthorizer(t, fz, c, AuthorizerOptions{})
	if tokens, allowed := Import(r, a2, z2); tokens != 1 || allowed != 1 {
		t.Fatalf("imported %d tokens and %d accesses, want 1 and 1", tokens, allowed)
	}
	u2, until, err := a2.Authenticate(ctx, token, "uid 2")
	if err != nil || !reflect.DeepEqual(u2, u) || !until.Equal(userUntil) {
		t.Fatalf("the token on the new daemon: %+v until %v (%v); want %+v until %v", u2, until, err, u, userUntil)
	}
	if until, err := z2.Authorize(ctx, u2, inA); err != nil || !until.Equal(accessUntil) {
		t.Fatalf("the access allowed: until %v (%v), want until %v", until, err, accessUntil)
	}
	if _, err := z2.Authorize(ctx, u2, inB); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the access denied before: %v, want ErrUnavailable (a review, which fails)", err)
	}
	if _, _, err := a2.Authenticate(ctx, bearer(jwt(map[string]any{"sub": "another"})), "uid 2"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a token never seen: %v, want ErrUnavailable", err)
	}
	if ft.calls.Load() != 1 || fz.calls.Load() != 1 {
		t.Fatalf("%d TokenReviews and %d SubjectAccessReviews, want 1 each (the questions not handed off)", ft.calls.Load(), fz.calls.Load())
	}

	// Past their expiry they are asked again.
	c.advance(accessUntil.Sub(c.Now()) + time.Second)
	if _, _, err := a2.Authenticate(ctx, token, "uid 2"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("past its expiry, the token: %v, want ErrUnavailable", err)
	}
	if _, err := z2.Authorize(ctx, u2, inA); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("past its expiry, the access: %v, want ErrUnavailable", err)
	}
}

// Import never widens: an Authenticator of another audience or node takes
// no token, shorter TTLs shorten the expiries, and expired or malformed
// entries are left out.
func TestImportNeverWidens(t *testing.T) {
	c := newClock()
	now := c.Now()
	u := &User{Name: "system:serviceaccount:a:reader"}
	key := make([]byte, 32)
	r := Remembered{
		Audience: DefaultAudience, NodeName: "n1",
		Tokens: []RememberedToken{
			{Key: key, User: u, Expires: now.Add(time.Hour)},
			{Key: key[:31], User: u, Expires: now.Add(time.Hour)},
			{Key: key, Expires: now.Add(time.Hour)},
			{Key: key, User: u, Expires: now.Add(-time.Second)},
		},
		Allowed: []RememberedAccess{
			{Key: key, Expires: now.Add(time.Hour)},
			{Key: key[:8], Expires: now.Add(time.Hour)},
			{Key: key, Expires: now},
		},
	}
	ft, fz := unreachable()
	for name, tc := range map[string]struct {
		opts       AuthenticatorOptions
		wantTokens int
	}{
		"same audience and node":  {AuthenticatorOptions{NodeName: "n1"}, 1},
		"another audience":        {AuthenticatorOptions{NodeName: "n1", Audience: "other"}, 0},
		"another node":            {AuthenticatorOptions{NodeName: "n2"}, 0},
		"no node check, where n1": {AuthenticatorOptions{}, 0},
	} {
		a := newTestAuthenticator(t, ft, c, tc.opts)
		if got, _ := Import(r, a, nil); got != tc.wantTokens {
			t.Errorf("%s: imported %d tokens, want %d", name, got, tc.wantTokens)
		}
	}
	a := newTestAuthenticator(t, ft, c, AuthenticatorOptions{NodeName: "n1", CacheTTL: time.Minute})
	z := newTestAuthorizer(t, fz, c, AuthorizerOptions{AllowTTL: 2 * time.Minute})
	if tokens, allowed := Import(r, a, z); tokens != 1 || allowed != 1 {
		t.Fatalf("imported %d tokens and %d accesses, want 1 and 1", tokens, allowed)
	}
	var k tokenKey
	if e, _ := a.cache.Peek(k); !e.expires.Equal(now.Add(time.Minute)) {
		t.Errorf("a token verified for an hour, under a CacheTTL of 1m: expires %v, want %v", e.expires, now.Add(time.Minute))
	}
	var ak accessKey
	if exp, _ := z.allowed.Peek(ak); !exp.Equal(now.Add(2 * time.Minute)) {
		t.Errorf("an access allowed for an hour, under an AllowTTL of 2m: expires %v, want %v", exp, now.Add(2*time.Minute))
	}
}

// A stream the old daemon serves through an outage (its re-checks fail,
// within the grace) is served by the daemon that takes it over until the
// old one's grace would have ended, and no longer: the new daemon's Grant
// does not start a grace of its own. Once the API server answers again it
// is asked at once (within a retry), as the old daemon would have asked
// it: a token revoked meanwhile ends the stream.
func TestImportCarriesTheGraceOfAnOutage(t *testing.T) {
	fixture := func() *grantFixture {
		return newGrantFixture(t, AuthenticatorOptions{CacheTTL: time.Minute}, AuthorizerOptions{AllowTTL: 5 * time.Minute})
	}
	old, nu, again := fixture(), fixture(), fixture()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		token := jwt(map[string]any{"aud": "informerd", "jti": "graced"})
		u, until, err := old.authn.Authenticate(ctx, bearer(token), "uid 1")
		if err != nil {
			t.Fatal(err)
		}
		r := &revocation{}
		g, err := NewGrant(ctx, GrantOptions{Authenticator: old.authn, Authorizer: old.authz, Token: token, User: u, TokenUntil: until, Revoke: r.revoke})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Add(ctx, listConfigMaps); err != nil {
			t.Fatal(err)
		}
		old.down.Store(true)
		nu.down.Store(true)
		again.down.Store(true)
		time.Sleep(90 * time.Second) // the token's re-check failed at 1m: in the grace until 6m
		if err, _ := r.get(); err != nil {
			t.Fatalf("revoked within the grace: %v", err)
		}
		rem := Export(old.authn, old.authz)
		if len(rem.Graced) != 1 || !rem.Graced[0].Until.Equal(start.Add(6*time.Minute)) {
			t.Fatalf("exported the graces %+v, want one ending at %v", rem.Graced, start.Add(6*time.Minute))
		}
		data, err := json.Marshal(rem)
		if err != nil {
			t.Fatal(err)
		}
		var carried Remembered
		if err := json.Unmarshal(data, &carried); err != nil {
			t.Fatal(err)
		}

		// takeOver is what the new daemon does for the resumed stream.
		takeOver := func(f *grantFixture) *revocation {
			t.Helper()
			// The token through its grace only (its verification expired);
			// the access through its grace and its decision, still cached.
			if tokens, allowed := Import(carried, f.authn, f.authz); tokens != 1 || allowed != 2 {
				t.Fatalf("imported %d tokens and %d accesses, want 1 and 2", tokens, allowed)
			}
			u2, until, err := f.authn.Authenticate(ctx, bearer(token), "uid 2")
			if err != nil || u2.Name != u.Name {
				t.Fatalf("the token on the new daemon: %v, %v", u2, err)
			}
			if d := until.Sub(time.Now()); d > recheckRetry {
				t.Fatalf("answered for %s, want at most %s (asked again soon)", d, recheckRetry)
			}
			if _, err := f.authz.Authorize(ctx, u2, Attributes{Verb: "list", Resource: configMaps, Namespace: "b"}); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("an access the stream did not have: %v, want ErrUnavailable", err)
			}
			r2 := &revocation{}
			g2, err := NewGrant(ctx, GrantOptions{Authenticator: f.authn, Authorizer: f.authz, Token: token, User: u2, TokenUntil: until, Revoke: r2.revoke})
			if err != nil {
				t.Fatal(err)
			}
			if err := g2.Add(ctx, listConfigMaps); err != nil {
				t.Fatalf("the stream's access on the new daemon: %v", err)
			}
			return r2
		}
		through, revoked := takeOver(nu), takeOver(again)

		// The API server answers again, and says the token is revoked.
		again.expired.Store(true)
		again.down.Store(false)
		time.Sleep(recheckRetry + 2*time.Second)
		if err, _ := revoked.get(); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("the API server back, the revoked token's stream: %v, want ErrUnauthenticated within a retry", err)
		}

		time.Sleep(time.Hour) // still down for nu
		err, at := through.get()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("revoked with %v, want ErrUnavailable at the end of the old daemon's grace", err)
		}
		if d := at.Sub(start); d < 6*time.Minute || d > 6*time.Minute+2*recheckRetry {
			t.Fatalf("revoked %s after the old daemon's grant, want at its grace's end (6m): not a grace of its own on top", d)
		}
	})
}
