package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeTokenReviews answers TokenReviews with review, counting them.
type fakeTokenReviews struct {
	calls  atomic.Int32
	review func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error)
}

func (f *fakeTokenReviews) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	f.calls.Add(1)
	st, err := f.review(tr)
	if err != nil {
		return nil, err
	}
	return &authenticationv1.TokenReview{Spec: tr.Spec, Status: *st}, nil
}

// clock is a settable clock for the caches' expiry checks.
type clock struct {
	mu  sync.Mutex // guards now
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newClock() *clock { return &clock{now: time.Now()} }

// authenticated answers every review: the ServiceAccount a/reader, with
// extra if given.
func authenticated(extra map[string]authenticationv1.ExtraValue) func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
	return func(tr *authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		return &authenticationv1.TokenReviewStatus{
			Authenticated: true, Audiences: tr.Spec.Audiences,
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:a:reader", UID: "u1", Groups: []string{"system:serviceaccounts"}, Extra: extra},
		}, nil
	}
}

func newTestAuthenticator(t *testing.T, f *fakeTokenReviews, c *clock, opts AuthenticatorOptions) *Authenticator {
	t.Helper()
	opts.Reviews, opts.Now, opts.Logger = f, c.Now, slog.New(slog.DiscardHandler)
	a, err := NewAuthenticator(opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func bearer(token string) []string { return []string{"Bearer " + token} }

func TestAuthenticateExplainsEachRejection(t *testing.T) {
	c := newClock()
	future := c.Now().Add(time.Hour).Unix()
	saClaims := func(extra map[string]any) map[string]any {
		m := map[string]any{"exp": future, "aud": "informerd", "kubernetes.io": map[string]any{
			"namespace": "a", "serviceaccount": map[string]string{"name": "reader", "uid": "u1"},
		}}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	boundTo := func(kind, name string) map[string]any {
		m := saClaims(nil)
		m["kubernetes.io"].(map[string]any)[kind] = map[string]string{"name": name, "uid": "u9"}
		return m
	}
	podClaims, nodeClaims := boundTo("pod", "p1"), boundTo("node", "node-1")
	rejected := func(msg string) func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		return func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
			return &authenticationv1.TokenReviewStatus{Error: msg}, nil
		}
	}
	tests := []struct {
		name    string
		values  []string
		review  func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error)
		reviews int32
		want    string
	}{
		{"no token", nil, nil, 0, `no token: send a projected ServiceAccount token with audience "informerd"`},
		{"garbage", bearer("garbage"), nil, 0, "malformed token: not a JWT"},
		{"expired", bearer(jwt(saClaims(map[string]any{"exp": c.Now().Add(-time.Minute).Unix()}))),
			rejected("[invalid bearer token, service account token has expired]"), 1, "the token expired at"},
		{"wrong audience", bearer(jwt(saClaims(map[string]any{"aud": []string{"vault"}}))),
			rejected("[invalid bearer token, token audiences [\"vault\"] is invalid for the target audiences [\"informerd\"]]"), 1, `wrong audience: the token is for ["vault"], not "informerd"`},
		// The kube-apiserver's words (v1.37): its loopback authenticator's,
		// then pkg/serviceaccount/claims.go's.
		{"deleted ServiceAccount", bearer(jwt(saClaims(nil))),
			rejected(`[invalid bearer token, serviceaccounts "reader" not found]`), 1, "the token's ServiceAccount a/reader has been deleted: mint a token"},
		{"ServiceAccount being deleted", bearer(jwt(saClaims(nil))),
			rejected(`[invalid bearer token, service account a/reader has been deleted]`), 1, "the token's ServiceAccount a/reader has been deleted: mint a token"},
		{"ServiceAccount replaced", bearer(jwt(saClaims(nil))),
			rejected(`[invalid bearer token, service account UID (u2) does not match claim (u1)]`), 1, "the token's ServiceAccount a/reader has been deleted (another of its name"},
		{"deleted ServiceAccount of a pod's token", bearer(jwt(podClaims)),
			rejected(`[invalid bearer token, serviceaccounts "reader" not found]`), 1, "the token's ServiceAccount a/reader has been deleted"},
		{"deleted pod", bearer(jwt(podClaims)),
			rejected(`[invalid bearer token, service account token has been invalidated]`), 1, "the pod a/p1 the token is bound to was deleted: "},
		{"pod replaced", bearer(jwt(podClaims)),
			rejected(`[invalid bearer token, pod UID (u8) does not match service account pod ref claim (u9)]`), 1, "the pod a/p1 the token is bound to was deleted (another pod of its name"},
		{"deleted node", bearer(jwt(nodeClaims)),
			rejected(`[invalid bearer token, service account token has been invalidated]`), 1, "the node node-1 the token is bound to was deleted"},
		{"deleted Secret", bearer(jwt(saClaims(nil))),
			rejected(`[invalid bearer token, service account token has been invalidated]`), 1, "the object the token is bound to was deleted"},
		{"another ServiceAccount's name in the words", bearer(jwt(saClaims(nil))),
			rejected(`[invalid bearer token, serviceaccounts "other" not found]`), 1, `the API server rejected the token: [invalid bearer token, serviceaccounts "other" not found]`},
		{"other", bearer(jwt(saClaims(nil))), rejected("[invalid bearer token, square-root of a banana]"), 1,
			"the API server rejected the token: [invalid bearer token, square-root of a banana]"},
		{"long words are cut", bearer(jwt(saClaims(nil))), rejected(strings.Repeat("w", 4096)), 1,
			"the API server rejected the token: " + strings.Repeat("w", 256) + "..."},
		{"another node", bearer(jwt(saClaims(nil))), authenticated(map[string]authenticationv1.ExtraValue{
			ExtraNodeName: {"node-2"}, ExtraPodName: {"p1"},
		}), 1, "the token is bound to pod a/p1 on node node-2, and this informerd serves node node-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeTokenReviews{review: tt.review}
			a := newTestAuthenticator(t, f, c, AuthenticatorOptions{NodeName: "node-1"})
			_, _, err := a.Authenticate(context.Background(), tt.values, "uid 1")
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Authenticate error = %v, want ErrUnauthenticated containing %q", err, tt.want)
			}
			if got := f.calls.Load(); got != tt.reviews {
				t.Fatalf("%d TokenReviews, want %d", got, tt.reviews)
			}
		})
	}
}

func TestAuthenticateReturnsTheUser(t *testing.T) {
	c := newClock()
	f := &fakeTokenReviews{review: authenticated(map[string]authenticationv1.ExtraValue{ExtraNodeName: {"node-1"}, ExtraPodName: {"p1"}})}
	a := newTestAuthenticator(t, f, c, AuthenticatorOptions{NodeName: "node-1", Audience: "custom"})
	var gotAudiences []string
	f.review = func(tr *authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		gotAudiences = tr.Spec.Audiences
		return authenticated(map[string]authenticationv1.ExtraValue{ExtraNodeName: {"node-1"}, ExtraPodName: {"p1"}})(tr)
	}
	u, _, err := a.Authenticate(context.Background(), bearer(jwt(map[string]any{"aud": "custom"})), "uid 1")
	if err != nil {
		t.Fatal(err)
	}
	if u.Name != "system:serviceaccount:a:reader" || u.Pod != "a/p1" || u.Node != "node-1" || len(u.Groups) != 1 {
		t.Fatalf("user = %+v", u)
	}
	if len(gotAudiences) != 1 || gotAudiences[0] != "custom" {
		t.Fatalf("the TokenReview asked for audiences %q, want [custom]", gotAudiences)
	}
}

func TestAuthenticateCachesUntilTheTokenOrTheCacheExpires(t *testing.T) {
	c := newClock()
	f := &fakeTokenReviews{review: authenticated(nil)}
	a := newTestAuthenticator(t, f, c, AuthenticatorOptions{CacheTTL: time.Minute})
	ctx := context.Background()
	long := jwt(map[string]any{"exp": c.Now().Add(time.Hour).Unix()})
	short := jwt(map[string]any{"exp": c.Now().Add(20 * time.Second).Unix()})
	check := func(token string, want int32) time.Time {
		t.Helper()
		_, until, err := a.Authenticate(ctx, bearer(token), "uid 1")
		if err != nil {
			t.Fatal(err)
		}
		if got := f.calls.Load(); got != want {
			t.Fatalf("%d TokenReviews, want %d", got, want)
		}
		return until
	}
	if until := check(long, 1); !until.Equal(c.Now().Add(time.Minute)) {
		t.Fatalf("a token valid for an hour is trusted until %v, want the cache TTL (%v)", until, c.Now().Add(time.Minute))
	}
	check(long, 1)
	if until := check(short, 2); until.Unix() != c.Now().Add(20*time.Second).Unix() {
		t.Fatalf("a token expiring in 20s is trusted until %v, want its expiry", until)
	}
	c.advance(30 * time.Second) // past the short token's expiry
	check(long, 2)
	check(short, 3)
	c.advance(31 * time.Second) // past the cache TTL
	check(long, 4)
}

func TestAuthenticateRemembersRejectionsBriefly(t *testing.T) {
	c := newClock()
	f := &fakeTokenReviews{review: func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		return &authenticationv1.TokenReviewStatus{Error: "nope"}, nil
	}}
	a := newTestAuthenticator(t, f, c, AuthenticatorOptions{NegativeTTL: 10 * time.Second})
	token := bearer(jwt(map[string]any{"aud": "informerd"}))
	for range 5 {
		if _, _, err := a.Authenticate(context.Background(), token, "uid 1"); !errors.Is(err, ErrUnauthenticated) {
			t.Fatal(err)
		}
	}
	if got := f.calls.Load(); got != 1 {
		t.Fatalf("5 attempts with one rejected token made %d TokenReviews, want 1", got)
	}
	c.advance(11 * time.Second)
	_, _, _ = a.Authenticate(context.Background(), token, "uid 1")
	if got := f.calls.Load(); got != 2 {
		t.Fatalf("after the negative TTL: %d TokenReviews, want 2", got)
	}
}

func TestAuthenticateDoesNotRememberFailedReviews(t *testing.T) {
	c := newClock()
	f := &fakeTokenReviews{review: func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		return nil, errors.New("connection refused")
	}}
	a := newTestAuthenticator(t, f, c, AuthenticatorOptions{})
	token := bearer(jwt(map[string]any{}))
	for i := range 2 {
		_, _, err := a.Authenticate(context.Background(), token, "uid 1")
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("error = %v, want ErrUnavailable with the cause", err)
		}
		if got := f.calls.Load(); got != int32(i+1) {
			t.Fatalf("%d TokenReviews after %d attempts", got, i+1)
		}
	}
}

func TestAuthenticateSharesOneReviewAmongConcurrentCallers(t *testing.T) {
	c := newClock()
	release := make(chan struct{})
	f := &fakeTokenReviews{}
	f.review = func(tr *authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		<-release
		return authenticated(nil)(tr)
	}
	a := newTestAuthenticator(t, f, c, AuthenticatorOptions{})
	token := bearer(jwt(map[string]any{}))
	concurrently(t, 50, release, func() error {
		_, _, err := a.Authenticate(context.Background(), token, "uid 1")
		return err
	})
	if got := f.calls.Load(); got != 1 {
		t.Fatalf("50 concurrent callers with one token made %d TokenReviews, want 1", got)
	}
}

// TestNewTokensShareOneBudgetFairly: reviews of tokens informerd has not
// seen come from one budget for all sources, each source with at most
// MaxPendingPerSource waiting or in flight: a source that floods is
// refused beyond its share at once, and another source's token is still
// reviewed; a cached token costs nothing whatever the budget.
func TestNewTokensShareOneBudgetFairly(t *testing.T) {
	started, release := make(chan struct{}, 4), make(chan struct{})
	f := &fakeTokenReviews{review: func(tr *authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
		started <- struct{}{} // admitted: the budget does not make it wait
		<-release
		return authenticated(nil)(tr)
	}}
	a := newTestAuthenticator(t, f, newClock(), AuthenticatorOptions{MaxPendingPerSource: 2, ReviewOptions: ReviewOptions{ReviewsPerSecond: 1000, ReviewBurst: 1000}})
	ctx := context.Background()
	token := func(i int) []string { return bearer(jwt(map[string]any{"jti": fmt.Sprint(i), "aud": "informerd"})) }

	flood := make(chan error, 2)
	for i := range 2 {
		go func() { _, _, err := a.Authenticate(ctx, token(i), "loopback"); flood <- err }()
	}
	<-started
	<-started // the source's two reviews are in flight
	_, _, err := a.Authenticate(ctx, token(2), "loopback")
	if !errors.Is(err, ErrThrottled) || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("a 3rd pending new token from one source: %v, want ErrThrottled naming the source", err)
	}
	other := make(chan error, 1)
	go func() { _, _, err := a.Authenticate(ctx, token(3), "uid 1000"); other <- err }()
	<-started // another source's token is reviewed while the first's are pending
	close(release)
	for range 2 {
		if err := <-flood; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-other; err != nil {
		t.Fatalf("another source's token: %v", err)
	}
	if _, _, err := a.Authenticate(ctx, token(0), "loopback"); err != nil {
		t.Fatalf("a cached token is answered whatever the budget: %v", err)
	}
	if got := f.calls.Load(); got != 3 {
		t.Fatalf("%d TokenReviews, want 3", got)
	}
}

// TestNewTokenBudgetIsBounded: past the shared budget (more than its
// longest wait away), new tokens are refused: strangers cannot spend the
// review client's capacity that re-checks and known callers need.
func TestNewTokenBudgetIsBounded(t *testing.T) {
	f := &fakeTokenReviews{review: authenticated(nil)}
	a := newTestAuthenticator(t, f, newClock(), AuthenticatorOptions{MaxPendingPerSource: 100, ReviewOptions: ReviewOptions{ReviewsPerSecond: 0.001, ReviewBurst: 3}})
	ctx := context.Background()
	for i := range 3 {
		if _, _, err := a.Authenticate(ctx, bearer(jwt(map[string]any{"jti": fmt.Sprint(i)})), fmt.Sprint("source ", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := a.Authenticate(ctx, bearer(jwt(map[string]any{"jti": "x"})), "source x"); !errors.Is(err, ErrThrottled) {
		t.Fatalf("a new token past the shared budget: %v, want ErrThrottled", err)
	}
	if got := f.calls.Load(); got != 3 {
		t.Fatalf("%d TokenReviews, want 3", got)
	}
}

// TestKnownTokensAreServedAheadOfStrangers: with the budget of new tokens
// spent, a Grant's re-check of its token is still made (it pays nothing),
// and so is a rotated token of a ServiceAccount whose token was accepted
// (on that ServiceAccount's own budget).
func TestKnownTokensAreServedAheadOfStrangers(t *testing.T) {
	f := &fakeTokenReviews{review: authenticated(nil)}
	c := newClock()
	a := newTestAuthenticator(t, f, c, AuthenticatorOptions{CacheTTL: time.Minute, ReviewOptions: ReviewOptions{ReviewsPerSecond: 0.001, ReviewBurst: 1}})
	ctx := context.Background()
	sa := func(jti string) string {
		return jwt(map[string]any{"jti": jti, "aud": "informerd", "exp": c.Now().Add(time.Hour).Unix(), "kubernetes.io": map[string]any{
			"namespace": "a", "serviceaccount": map[string]string{"name": "reader", "uid": "u1"},
		}})
	}
	first := sa("1")
	if _, _, err := a.Authenticate(ctx, bearer(first), "uid 1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Authenticate(ctx, bearer(jwt(map[string]any{"jti": "stranger"})), "uid 2"); !errors.Is(err, ErrThrottled) {
		t.Fatalf("the budget is not spent: %v", err)
	}
	c.advance(2 * time.Minute) // the first token's cache entry runs out
	if _, _, err := a.authenticate(ctx, first, "", classRecheck); err != nil {
		t.Fatalf("a re-check with the budget spent: %v", err)
	}
	if _, _, err := a.Authenticate(ctx, bearer(sa("rotated")), "uid 1"); err != nil {
		t.Fatalf("a rotated token of a known ServiceAccount with the budget spent: %v", err)
	}
	if got := f.calls.Load(); got != 3 {
		t.Fatalf("%d TokenReviews, want 3", got)
	}
}

// TestTokenChecksFailClosed: a review that accepts a token without saying
// which audiences it checked is a rejection; with a node name set, a token
// bound to a pod is accepted only when the review says the pod's node and
// it is this one; a token bound to no pod is accepted on any node.
func TestTokenChecksFailClosed(t *testing.T) {
	podExtra := map[string]authenticationv1.ExtraValue{ExtraPodName: {"p"}}
	for _, tc := range []struct {
		name      string
		audiences []string
		extra     map[string]authenticationv1.ExtraValue
		want      string // in the error, or "" to accept
	}{
		{"audience confirmed", []string{"informerd"}, nil, ""},
		{"no audience in the review", nil, nil, "without confirming its audience"},
		{"another audience", []string{"api"}, nil, "wrong audience"},
		{"bound to a pod on this node", []string{"informerd"}, map[string]authenticationv1.ExtraValue{ExtraPodName: {"p"}, ExtraNodeName: {"n1"}}, ""},
		{"bound to a pod on another node", []string{"informerd"}, map[string]authenticationv1.ExtraValue{ExtraPodName: {"p"}, ExtraNodeName: {"n2"}}, "on node n2"},
		{"bound to a pod, node not said", []string{"informerd"}, podExtra, "did not say on which node"},
		{"bound to no pod", []string{"informerd"}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTokenReviews{review: func(*authenticationv1.TokenReview) (*authenticationv1.TokenReviewStatus, error) {
				return &authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tc.audiences,
					User: authenticationv1.UserInfo{Username: "system:serviceaccount:a:reader", Extra: tc.extra}}, nil
			}}
			a := newTestAuthenticator(t, f, newClock(), AuthenticatorOptions{NodeName: "n1"})
			_, _, err := a.Authenticate(context.Background(), bearer(jwt(map[string]any{"aud": "informerd"})), "uid 1")
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("%v, want ErrUnauthenticated saying %q", err, tc.want)
			}
		})
	}
}
