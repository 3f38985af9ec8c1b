package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"

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

	user, revoked := revokeConfigMaps(ctx, t, saNs, sa, ns)
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

// statusStream opens a WatchStatus stream of refs and returns its events
// up to SYNCED, or the error that ended it first.
func statusStream(ctx context.Context, c *client.Client, refs ...*informerdv1.ObjectReference) ([]*informerdv1.StatusEvent, error) {
	s, err := c.API().WatchStatus(ctx, &informerdv1.WatchStatusRequest{Objects: refs, ClientName: "limited"})
	if err != nil {
		return nil, err
	}
	var evs []*informerdv1.StatusEvent
	for {
		resp, err := s.Recv()
		if err != nil {
			return evs, err
		}
		for _, ev := range resp.GetEvents() {
			if ev.GetType() == informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED {
				return evs, nil
			}
			evs = append(evs, ev)
		}
	}
}

// TestStatusStreamsCountAgainstTheInformerLimit: the informers a status
// stream reads are held for its caller, so -max-informers-per-caller
// counts them (they used to be held by no one), and ListInformers shows
// them as the caller's.
func TestStatusStreamsCountAgainstTheInformerLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "status-limit")
	d := startDaemon(t, cache.Options{MaxSourcesPerOwner: 1, Scope: cache.ScopeCluster})
	c := d.dial(t, readsAll)
	cm := &informerdv1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: "a"}
	svc := &informerdv1.ObjectReference{Kind: "Service", Namespace: ns, Name: "b"}
	if _, err := statusStream(ctx, c, cm, svc); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a status stream of two kinds with one informer per caller: %v, want RESOURCE_EXHAUSTED", err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	if _, err := statusStream(sctx, c, cm); err != nil {
		t.Fatalf("a status stream of one kind: %v", err)
	}
	resp, err := c.API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var holders []string
	for _, in := range resp.GetInformers() {
		if in.GetResource().GetResource() == "configmaps" {
			holders = in.GetHolders()
		}
	}
	if !slices.Contains(holders, "limited") {
		t.Fatalf("the status stream's informer of configmaps is held by %q, want the stream's client %q among them", holders, "limited")
	}
}

// TestNamespaceOfAClusterScopedResourceIsRefused: a request that names a
// namespace of a cluster-scoped resource is refused as the API server
// refuses its path (NOT_FOUND, with the CLUSTER_SCOPED reason) in Watch
// and Get, and in WatchStatus such an object is NotFound: a Role of that
// namespace granting every resource starts no cluster-wide informer.
func TestNamespaceOfAClusterScopedResourceIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "mine")
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(schema.GroupVersionResource{Group: "*", Resource: "*"}, ns))
	nodes := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	watches := upstreamWatches(t, nodes)
	clusterScoped := func(what string, err error) {
		t.Helper()
		st, _ := status.FromError(err)
		for _, detail := range st.Details() {
			if info, ok := detail.(*errdetails.ErrorInfo); ok && info.GetReason() == informerdv1.ReasonClusterScoped {
				t.Logf("%s: %v", what, err)
				return
			}
		}
		t.Fatalf("%s: %v, want NOT_FOUND with the reason %s", what, err, informerdv1.ReasonClusterScoped)
	}
	s, err := c.Stream(ctx, client.WatchOptions{Resource: nodes, Namespace: ns}, "")
	if err == nil {
		_, err = s.Recv()
		s.Close()
	}
	clusterScoped("Watch of nodes in a namespace", err)
	_, err = c.API().Get(ctx, &informerdv1.GetRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "nodes"}, Namespace: ns, Name: controlplane.FakeNodeName})
	clusterScoped("Get of a node in a namespace", err)
	evs, err := statusStream(ctx, c, &informerdv1.ObjectReference{Kind: "Node", Namespace: ns, Name: controlplane.FakeNodeName})
	if err != nil || len(evs) != 1 || evs[0].GetStatus().GetStatus() != informerdv1.Status_STATUS_NOT_FOUND {
		t.Fatalf("status of a Node named in a namespace: %v, %v; want NotFound", evs, err)
	}
	if got := upstreamWatches(t, nodes); got != watches {
		t.Fatalf("upstream watches of nodes went from %d to %d: an informer was started for a namespace's Role", watches, got)
	}
}

// TestRootScopeReadsGeneratedResourcesInTheObjectsNamespace: under the
// root scope strategy a status stream reads the objects' kinds
// cluster-wide but their generated resources (a Deployment's ReplicaSets
// and Pods) in the object's namespace, as cli-utils' readers list them:
// an applier allowed Deployments cluster-wide and ReplicaSets and Pods
// only in its namespace is served, not refused.
func TestRootScopeReadsGeneratedResourcesInTheObjectsNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "root-generated")
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(deployments, ""), reads(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, ns),
		reads(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, ns))
	s, err := c.API().WatchStatus(ctx, &informerdv1.WatchStatusRequest{
		Objects:       []*informerdv1.ObjectReference{{Group: "apps", Kind: "Deployment", Namespace: ns, Name: "web"}},
		ScopeStrategy: informerdv1.ScopeStrategy_SCOPE_STRATEGY_ROOT, ClientName: "root",
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []*informerdv1.StatusEvent
	for synced := false; !synced; {
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("a root-scope status stream of a Deployment, with ReplicaSets and Pods allowed in its namespace: %v", err)
		}
		for _, ev := range resp.GetEvents() {
			synced = synced || ev.GetType() == informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED
			if ev.GetStatus() != nil {
				got = append(got, ev)
			}
		}
	}
	if len(got) != 1 || got[0].GetStatus().GetStatus() != informerdv1.Status_STATUS_NOT_FOUND {
		t.Fatalf("statuses %v, want the Deployment NotFound", got)
	}
}
