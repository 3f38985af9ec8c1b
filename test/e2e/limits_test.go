package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestInformerLimitsWithABystander (issue 10, abuse limits): a caller that
// asks for an informer per distinct field selector gets
// RESOURCE_EXHAUSTED naming the limit once it holds
// -max-informers-per-caller, the API server sees no LIST beyond those, and
// a flood of requests for resources that do not exist rereads discovery at
// a bounded rate; meanwhile another caller's stream keeps receiving.
func TestInformerLimitsWithABystander(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "limits")
	const perCaller = 8
	d := startDaemon(t, cache.Options{MaxSourcesPerOwner: perCaller, Scope: cache.ScopeCluster})
	bystander := openStream(ctx, t, d.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "bystander"}, "")
	bystander.until(ctx, t, "the bystander syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	mallory := d.dial(t, reads(configMaps, ""))
	lists0 := upstreamLists(ctx, t, configMaps)
	var refused error
	for i := range 30 {
		opts := client.WatchOptions{Resource: configMaps, FieldSelector: fmt.Sprintf("metadata.name=x-%d", i), ClientName: "mallory"}
		s := openStream(ctx, t, mallory, opts, "")
		if i < perCaller {
			s.until(ctx, t, "one of the caller's first informers syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
			continue
		}
		if refused = s.end(ctx, t); status.Code(refused) != codes.ResourceExhausted || !strings.Contains(refused.Error(), "informers") {
			t.Fatalf("stream %d of one caller ended with %v, want RESOURCE_EXHAUSTED naming the informer limit", i, refused)
		}
	}
	lists := upstreamLists(ctx, t, configMaps) - lists0
	t.Logf("30 distinct field selectors from one caller: %d upstream LISTs; the rest refused: %v", lists, refused)
	if lists > perCaller {
		t.Errorf("one caller's field selectors cost the API server %d LISTs, want at most %d", lists, perCaller)
	}

	// Requests for resources that do not exist, 200 of them.
	start := time.Now()
	for i := range 200 {
		s := openStream(ctx, t, mallory, client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: fmt.Sprintf("nothing%d", i)}, ClientName: "mallory"}, "")
		if err := s.end(ctx, t); status.Code(err) != codes.NotFound && status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a request for a resource that does not exist ended with %v", err)
		}
	}
	t.Logf("200 requests for resources that do not exist took %s", time.Since(start))

	createConfigMap(ctx, t, ns, "still-here", nil)
	bystander.until(ctx, t, "the bystander still receives", isAdded("still-here"))
}
