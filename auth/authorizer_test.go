package auth

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fakeAccessReviews answers SubjectAccessReviews with decide, counting
// them and keeping the last.
type fakeAccessReviews struct {
	calls  atomic.Int32
	mu     sync.Mutex // guards last
	last   authorizationv1.SubjectAccessReviewSpec
	decide func(authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error)
}

func (f *fakeAccessReviews) Create(_ context.Context, r *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	f.calls.Add(1)
	f.mu.Lock()
	f.last = r.Spec
	f.mu.Unlock()
	st, err := f.decide(r.Spec)
	if err != nil {
		return nil, err
	}
	return &authorizationv1.SubjectAccessReview{Spec: r.Spec, Status: st}, nil
}

// inNamespaceA allows anything in namespace a.
func inNamespaceA(spec authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
	return authorizationv1.SubjectAccessReviewStatus{Allowed: spec.ResourceAttributes != nil && spec.ResourceAttributes.Namespace == "a"}, nil
}

var (
	reader     = &User{Name: "system:serviceaccount:a:reader", UID: "u1", Groups: []string{"system:serviceaccounts", "system:authenticated"}, Extra: map[string][]string{"authentication.kubernetes.io/credential-id": {"JTI=1"}}}
	configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

func newTestAuthorizer(t *testing.T, f *fakeAccessReviews, c *clock, opts AuthorizerOptions) *Authorizer {
	t.Helper()
	opts.Reviews, opts.Now, opts.Logger = f, c.Now, slog.New(slog.DiscardHandler)
	z, err := NewAuthorizer(opts)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

func TestAuthorizeAsksAsTheCaller(t *testing.T) {
	f := &fakeAccessReviews{decide: inNamespaceA}
	z := newTestAuthorizer(t, f, newClock(), AuthorizerOptions{})
	ctx := context.Background()
	a := Attributes{Verb: "watch", Resource: configMaps, Namespace: "a", LabelSelector: "app=x", FieldSelector: "metadata.name=y"}
	if _, err := z.Authorize(ctx, reader, a); err != nil {
		t.Fatal(err)
	}
	s := f.last
	ra := s.ResourceAttributes
	if s.User != reader.Name || s.UID != "u1" || len(s.Groups) != 2 || s.Extra["authentication.kubernetes.io/credential-id"][0] != "JTI=1" ||
		ra.Verb != "watch" || ra.Resource != "configmaps" || ra.Version != "v1" || ra.Namespace != "a" ||
		ra.LabelSelector.RawSelector != "app=x" || ra.FieldSelector.RawSelector != "metadata.name=y" {
		t.Fatalf("SubjectAccessReview spec = %+v, resource %+v", s, ra)
	}
	f.decide = func(spec authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
		return authorizationv1.SubjectAccessReviewStatus{Allowed: spec.NonResourceAttributes != nil && spec.NonResourceAttributes.Path == "/metrics"}, nil
	}
	if _, err := z.Authorize(ctx, reader, Attributes{Verb: "get", Path: "/metrics"}); err != nil {
		t.Fatal(err)
	}
	if f.last.NonResourceAttributes.Verb != "get" || f.last.ResourceAttributes != nil {
		t.Fatalf("non-resource review spec = %+v", f.last)
	}
}

func TestAuthorizeDenialNamesVerbResourceAndNamespace(t *testing.T) {
	f := &fakeAccessReviews{decide: inNamespaceA}
	z := newTestAuthorizer(t, f, newClock(), AuthorizerOptions{})
	for _, tt := range []struct {
		a    Attributes
		want string
	}{
		{Attributes{Verb: "list", Resource: configMaps, Namespace: "b"}, reader.Name + " may not list configmaps in namespace b"},
		{Attributes{Verb: "watch", Resource: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}}, "may not watch deployments.apps cluster-wide"},
		{Attributes{Verb: "get", Path: "/informerd/informers"}, "may not get /informerd/informers"},
	} {
		_, err := z.Authorize(context.Background(), reader, tt.a)
		if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Authorize(%s) = %v, want ErrDenied containing %q", tt.a, err, tt.want)
		}
	}
}

func TestAuthorizeCachesAllowAndDenyForTheirOwnTTLs(t *testing.T) {
	c := newClock()
	f := &fakeAccessReviews{decide: inNamespaceA}
	z := newTestAuthorizer(t, f, c, AuthorizerOptions{AllowTTL: 5 * time.Minute, DenyTTL: 30 * time.Second})
	ctx := context.Background()
	allow := Attributes{Verb: "list", Resource: configMaps, Namespace: "a"}
	deny := Attributes{Verb: "list", Resource: configMaps, Namespace: "b"}
	check := func(a Attributes, wantAllowed bool, wantCalls int32) time.Time {
		t.Helper()
		until, err := z.Authorize(ctx, reader, a)
		if (err == nil) != wantAllowed {
			t.Fatalf("Authorize(%s) = %v, want allowed %v", a, err, wantAllowed)
		}
		if got := f.calls.Load(); got != wantCalls {
			t.Fatalf("after Authorize(%s): %d reviews, want %d", a, got, wantCalls)
		}
		return until
	}
	if until := check(allow, true, 1); !until.Equal(c.Now().Add(5 * time.Minute)) {
		t.Fatalf("allowed until %v, want the allow TTL", until)
	}
	check(deny, false, 2)
	check(allow, true, 2)
	check(deny, false, 2)
	c.advance(31 * time.Second)
	check(allow, true, 2) // still inside the allow TTL
	check(deny, false, 3) // the deny TTL has passed
	c.advance(5 * time.Minute)
	check(allow, true, 4)
	// A different user, verb, namespace or selector is another question.
	other := *reader
	other.Name = "system:serviceaccount:a:other"
	if _, err := z.Authorize(ctx, &other, allow); err != nil {
		t.Fatal(err)
	}
	for _, a := range []Attributes{
		{Verb: "watch", Resource: configMaps, Namespace: "a"},
		{Verb: "list", Resource: configMaps, Namespace: "a", LabelSelector: "x=y"},
		{Verb: "list", Resource: configMaps, Namespace: "a", FieldSelector: "metadata.name=y"},
	} {
		_, _ = z.Authorize(ctx, reader, a)
	}
	if got := f.calls.Load(); got != 8 {
		t.Fatalf("%d reviews, want 8: every distinct question costs one", got)
	}
}

func TestAuthorizeSharesOneReviewAmongConcurrentChecks(t *testing.T) {
	release := make(chan struct{})
	f := &fakeAccessReviews{decide: func(spec authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
		<-release
		return inNamespaceA(spec)
	}}
	z := newTestAuthorizer(t, f, newClock(), AuthorizerOptions{})
	concurrently(t, 50, release, func() error {
		_, err := z.Authorize(context.Background(), reader, Attributes{Verb: "list", Resource: configMaps, Namespace: "a"})
		return err
	})
	if got := f.calls.Load(); got != 1 {
		t.Fatalf("50 concurrent identical checks made %d reviews, want 1", got)
	}
}

func TestAuthorizeLimitsNewChecksPerUser(t *testing.T) {
	f := &fakeAccessReviews{decide: inNamespaceA}
	z := newTestAuthorizer(t, f, newClock(), AuthorizerOptions{ReviewOptions: ReviewOptions{ReviewsPerSecond: 0.001, ReviewBurst: 2}})
	ctx := context.Background()
	sel := func(s string) Attributes {
		return Attributes{Verb: "list", Resource: configMaps, Namespace: "a", FieldSelector: "metadata.name=" + s}
	}
	for _, s := range []string{"x", "y"} {
		if _, err := z.Authorize(ctx, reader, sel(s)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := z.Authorize(ctx, reader, sel("z")); !errors.Is(err, ErrThrottled) || !strings.Contains(err.Error(), reader.Name) {
		t.Fatalf("third new check: %v, want ErrThrottled naming the user", err)
	}
	if _, err := z.Authorize(ctx, reader, sel("x")); err != nil {
		t.Fatalf("a cached decision is answered whatever the user's rate: %v", err)
	}
	other := *reader
	other.Name = "system:serviceaccount:a:other"
	if _, err := z.Authorize(ctx, &other, sel("z")); err != nil {
		t.Fatalf("another user is not limited by the first: %v", err)
	}
}

func TestAuthorizeDoesNotRememberFailedReviews(t *testing.T) {
	f := &fakeAccessReviews{decide: func(authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
		return authorizationv1.SubjectAccessReviewStatus{}, errors.New("connection refused")
	}}
	z := newTestAuthorizer(t, f, newClock(), AuthorizerOptions{})
	for i := range 2 {
		_, err := z.Authorize(context.Background(), reader, Attributes{Verb: "list", Resource: configMaps, Namespace: "a"})
		if !errors.Is(err, ErrUnavailable) || f.calls.Load() != int32(i+1) {
			t.Fatalf("attempt %d: %v after %d reviews; want ErrUnavailable, a review each time", i, err, f.calls.Load())
		}
	}
}
