package daemon_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestGetDiscovery: any authenticated caller gets the daemon's discovery;
// a request naming a resource the API server does not serve is NOT_FOUND
// (after a reread of discovery), and a malformed name INVALID_ARGUMENT;
// without a token, nothing.
func TestGetDiscovery(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn)
	ctx := context.Background()
	c := srv.dial(t, "applier").API()
	resp, err := c.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range resp.GetGroups() {
		for _, v := range g.GetVersions() {
			for _, r := range v.GetResources() {
				found = found || g.GetName() == "" && v.GetVersion() == "v1" && r.GetName() == "configmaps" && r.GetKind() == "ConfigMap" && r.GetNamespaced()
			}
		}
	}
	if !found {
		t.Fatalf("discovery without configmaps (v1, ConfigMap, namespaced): %v", resp)
	}
	if _, err := c.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{Kind: "ConfigMap"}); err != nil {
		t.Fatalf("naming ConfigMap: %v", err)
	}
	if _, err := c.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{Resource: &informerdv1.GroupVersionResource{Group: "example.com"}, Kind: "Widget"}); status.Code(err) != codes.NotFound {
		t.Fatalf("naming a kind the API server does not serve: %v, want NOT_FOUND", err)
	}
	if _, err := c.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{Kind: "Not/AKind"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("naming a malformed kind: %v, want INVALID_ARGUMENT", err)
	}
	anonymous := informerdv1.NewInformerServiceClient(grpcConn(t, srv, ""))
	if _, err := anonymous.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v, want UNAUTHENTICATED", err)
	}
}
