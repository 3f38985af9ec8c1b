package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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
// asks for an informer per distinct field selector (metadata.name!=x-N:
// metadata.name=x-N would be served by the bystander's informer) gets
// RESOURCE_EXHAUSTED naming the limit once it holds
// -max-informers-per-caller, the API server sees no LIST beyond those, and
// a flood of requests for resources that do not exist rereads discovery at
// a bounded rate; meanwhile another caller's stream keeps receiving.
func TestInformerLimitsWithABystander(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "limits")
	const perCaller = 8
	// The daemon's own discovery requests, counted on its side: the API
	// server's counters also count kube-controller-manager's, which
	// rereads discovery for every namespace it deletes (other tests').
	var discoveryReads atomic.Int64
	cfg := env.RESTConfig()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && (r.URL.Path == "/api" || r.URL.Path == "/apis") {
				discoveryReads.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	d := startDaemon(t, cache.Options{Config: cfg, MaxSourcesPerOwner: perCaller, Scope: cache.ScopeCluster})
	bystander := openStream(ctx, t, d.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "bystander"}, "")
	bystander.until(ctx, t, "the bystander syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	mallory := d.dial(t, reads(configMaps, ""))
	lists0, watches0 := upstreamLists(ctx, t, configMaps), upstreamWatches(t, configMaps)
	var refused error
	for i := range 30 {
		opts := client.WatchOptions{Resource: configMaps, FieldSelector: fmt.Sprintf("metadata.name!=x-%d", i), ClientName: "mallory"}
		s := openStream(ctx, t, mallory, opts, "")
		if i < perCaller {
			s.until(ctx, t, "one of the caller's first informers syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
			continue
		}
		if refused = s.end(ctx, t); status.Code(refused) != codes.ResourceExhausted || !strings.Contains(refused.Error(), "informers") {
			t.Fatalf("stream %d of one caller ended with %v, want RESOURCE_EXHAUSTED naming the informer limit", i, refused)
		}
	}
	// The daemon lists by WatchList (a WATCH) unless the API server refuses
	// it: count both. The caller's streams are all still open.
	lists, watches := upstreamLists(ctx, t, configMaps)-lists0, upstreamWatches(t, configMaps)-watches0
	t.Logf("30 distinct field selectors from one caller: %d more upstream watches, %d LISTs; the rest refused: %v", watches, lists, refused)
	if lists > perCaller || watches > perCaller {
		t.Errorf("one caller's field selectors cost the API server %d watches and %d LISTs, want at most %d", watches, lists, perCaller)
	}

	// Requests for resources that do not exist, 200 at once: each is
	// answered from a discovery read after it came, and discovery is
	// reread at most once a second, whatever they ask.
	discoveries := func() int { return int(discoveryReads.Load()) }
	discoveries0 := discoveries()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			opts := client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: fmt.Sprintf("nothing%d", i)}, ClientName: "mallory"}
			s, err := mallory.Stream(ctx, opts, "")
			if err == nil {
				defer s.Close()
				for err == nil {
					_, err = s.Recv()
				}
			}
			if status.Code(err) != codes.NotFound && status.Code(err) != codes.PermissionDenied {
				t.Errorf("a request for a resource that does not exist ended with %v", err)
			}
		})
	}
	wg.Wait()
	took, rereads := time.Since(start), discoveries()-discoveries0
	t.Logf("200 requests at once for resources that do not exist took %s and cost %d discovery requests", took, rereads)
	if limit := 2 * (int(took/time.Second) + 2); rereads > limit { // /api and /apis per reread, a second apart
		t.Errorf("200 requests for resources that do not exist cost %d discovery requests in %s, want at most %d", rereads, took, limit)
	}

	createConfigMap(ctx, t, ns, "still-here", nil)
	bystander.until(ctx, t, "the bystander still receives", isAdded("still-here"))
}

// roundTripFunc is an http.RoundTripper of a func.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
