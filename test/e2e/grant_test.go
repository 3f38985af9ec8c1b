package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

// TestIdleStatusStreamCostsNothing: an idle WatchStatus stream, before and
// after it learned its kinds, makes no token or access check between its
// grant's deadlines (it used to re-check in a loop, hundreds of thousands
// of token-cache hits a second), counted by the daemon's own metrics.
func TestIdleStatusStreamCostsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "idle-status")
	createConfigMap(ctx, t, ns, "present", nil)
	reg := prometheus.NewRegistry()
	d := startDaemon(t, cache.Options{}, func(s *security) { s.Authn.Registerer, s.Authz.Registerer = reg, reg })
	c := d.dial(t, reads(configMaps, ns))
	checks := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var n float64
		for _, mf := range mfs {
			switch mf.GetName() {
			case "informerd_token_cache_hits_total", "informerd_access_cache_hits_total", "informerd_token_reviews_total", "informerd_access_reviews_total":
				for _, m := range mf.GetMetric() {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	for _, tc := range []struct {
		name string
		ref  *informerdv1.ObjectReference
	}{
		// A kind the API server does not serve: the stream authorizes
		// nothing, ever.
		{"no access", &informerdv1.ObjectReference{Group: "nothing.example.com", Kind: "Nothing", Namespace: ns, Name: "x"}},
		{"configmaps", &informerdv1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: "present"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			s, err := c.API().WatchStatus(ctx, &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{tc.ref}, ClientName: "idle"})
			if err != nil {
				t.Fatal(err)
			}
			for synced := false; !synced; {
				resp, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range resp.GetEvents() {
					synced = synced || ev.GetType() == informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED
				}
			}
			before := checks()
			hold(ctx, 2*time.Second)
			got := checks() - before
			t.Logf("an idle status stream (%s): %v token and access checks in 2s", tc.name, got)
			if got > 0 {
				t.Fatalf("an idle status stream made %v token and access checks in 2s, want none (its grant expires in minutes)", got)
			}
		})
	}
}

// TestRevokedCallerSpendingItsBudgetIsStillEnded: after its RBAC is
// revoked, a caller that spends its own budget of SubjectAccessReviews on
// new label selectors (every new check throttled) still has its open
// stream re-checked and ended at the allow TTL: re-checks draw on no
// caller's budget. Real tokens, real RBAC, the real API server.
func TestRevokedCallerSpendingItsBudgetIsStillEnded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ttl = 3 * time.Second
	ns := createNamespace(ctx, t, "dodge")
	d := startDaemon(t, cache.Options{}, func(s *security) {
		s.Authz.AllowTTL = ttl
		s.Authz.ReviewsPerSecond, s.Authz.ReviewBurst = 1, 6
	})
	saNs, sa := newServiceAccount(t)
	c := dialWith(t, d.socket, client.WithToken(identityToken(t, saNs, sa, reads(configMaps, ns))))
	s := openStream(ctx, t, c, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "revoked"}, "")
	s.until(ctx, t, "the stream syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if err := controlplane.Revoke(ctx, admin, saNs, sa, ns); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + saNs + ":" + sa
	eventually(ctx, t, "RBAC no longer allows "+user, func() bool {
		r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNs, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "configmaps", Namespace: ns},
		}}, metav1.CreateOptions{})
		return err == nil && !r.Status.Allowed
	})
	revoked := time.Now()
	// The flood: new selectors, each a new access check, until the
	// caller's budget is spent and it stays spent.
	floodCtx, stopFlood := context.WithCancel(ctx)
	flooded := make(chan int)
	go func() {
		throttled := 0
		for i := 0; floodCtx.Err() == nil; i++ {
			fs, err := c.Stream(floodCtx, client.WatchOptions{Resource: configMaps, Namespace: ns, LabelSelector: fmt.Sprintf("flood=%d", i)}, "")
			if err == nil {
				_, err = fs.Recv()
				fs.Close()
			}
			if status.Code(err) == codes.ResourceExhausted {
				throttled++
			}
		}
		flooded <- throttled
	}()
	err := s.end(ctx, t)
	took := time.Since(revoked)
	stopFlood()
	throttled := <-flooded
	t.Logf("the stream ended %s after the revocation took effect (allow TTL %s), %d of the caller's new checks throttled meanwhile: %v",
		took.Round(time.Millisecond), ttl, throttled, err)
	if throttled == 0 {
		t.Fatal("the flood never spent the caller's budget: the test proves nothing")
	}
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), user+" may not list configmaps in namespace "+ns) {
		t.Fatalf("after the revocation the stream ended with %v; want PERMISSION_DENIED naming the verb, resource and namespace", err)
	}
	if took > ttl+time.Second {
		t.Fatalf("the stream outlived its revocation by %s, more than the allow TTL %s (+1s)", took, ttl)
	}
}
