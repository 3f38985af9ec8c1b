package daemon_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/client"
)

// TestRevokedCallerCannotDodgeItsRecheck: a caller whose access is
// revoked, and who then spends its own budget of access reviews on new
// label selectors, is still re-checked (re-checks draw on no budget) and
// its stream ends with PERMISSION_DENIED at the allow TTL, not later. A
// bystander of another identity streams throughout.
func TestRevokedCallerCannotDodgeItsRecheck(t *testing.T) {
	api := newFakeAPIServer(t)
	const allowTTL = time.Second
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.authz.AllowTTL = allowTTL
		c.authz.ReviewOptions = auth.ReviewOptions{ReviewsPerSecond: 0.001, ReviewBurst: 4}
	})
	b := newBystander(t, api, srv)
	victim := subscribe(t, srv, "revoked")
	victim.waitSynced(t)

	api.denyName.Store("revoked")
	revoked := time.Now()
	c := srv.dial(t, "revoked")
	throttled := false
	for i := 0; !throttled && i < 100; i++ {
		err := firstResponse(c, client.WatchOptions{Resource: configMaps, ClientName: "flood", LabelSelector: fmt.Sprintf("flood=%d", i)})
		throttled = status.Code(err) == codes.ResourceExhausted
	}
	if !throttled {
		t.Fatal("the caller never spent its budget of access reviews")
	}
	select {
	case <-victim.ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the revoked stream did not end")
	}
	took := time.Since(revoked)
	if status.Code(victim.err) != codes.PermissionDenied || !strings.Contains(victim.err.Error(), "may not") {
		t.Fatalf("the revoked stream ended with %v, want PERMISSION_DENIED", victim.err)
	}
	t.Logf("revoked stream ended %s after the revocation (allow TTL %s)", took.Round(time.Millisecond), allowTTL)
	if took > allowTTL+5*time.Second { // the re-check retry was 10s: a dodged re-check shows as more
		t.Fatalf("the revoked stream ended %s after the revocation, want about the allow TTL (%s)", took, allowTTL)
	}
	b.stillReceives(t)
}
