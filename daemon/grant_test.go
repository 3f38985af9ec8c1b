package daemon_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
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

// TestForgedTokenFloodLeavesCallersServed: 6,000 distinct well-formed
// forged tokens over TCP from 20 loopback source addresses (any local
// process may bind them) cost at most the shared budget of new-token
// reviews, and meanwhile a new caller with a valid token on the Unix
// socket is served at once (its review is not queued behind the flood's)
// and a bystander keeps streaming.
func TestForgedTokenFloodLeavesCallersServed(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.tcp = true
		c.authn = auth.AuthenticatorOptions{} // the defaults: 20 new tokens per second, burst 100, 4 pending per source
	})
	b := newBystander(t, api, srv)
	const sources, perSource = 20, 300
	if l, err := net.Listen("tcp", "127.0.0.2:0"); err != nil {
		t.Skipf("cannot bind 127.0.0.2: %v", err)
	} else {
		l.Close()
	}
	reviews0 := api.tokenReviews.Load()
	flooding, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var refused, throttled atomic.Int64
	for i := range sources {
		conn, err := grpc.NewClient(srv.tcp, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}}
				return d.DialContext(ctx, "tcp", addr)
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		api := informerdv1.NewInformerServiceClient(conn)
		for w := range 4 { // a few concurrent callers per source
			wg.Go(func() {
				for j := w; j < perSource && flooding.Err() == nil; j += 4 {
					ctx := metadata.AppendToOutgoingContext(flooding, "authorization", "Bearer "+token(fmt.Sprintf("forged-%d-%d", i, j)))
					_, err := api.Version(ctx, &informerdv1.VersionRequest{})
					switch status.Code(err) {
					case codes.Unauthenticated:
						refused.Add(1)
					case codes.ResourceExhausted:
						throttled.Add(1)
					}
				}
			})
		}
	}
	// A new caller arrives while the flood runs.
	for refused.Load()+throttled.Load() < 500 {
		runtime.Gosched()
	}
	start := time.Now()
	_, err := srv.dial(t, "newcomer").API().Version(context.Background(), &informerdv1.VersionRequest{})
	served := time.Since(start)
	if err != nil {
		t.Fatalf("a new valid caller during the flood: %v", err)
	}
	b.stillReceives(t)
	flood := time.Now()
	wg.Wait()
	stop()
	reviews := api.tokenReviews.Load() - reviews0
	t.Logf("%d forged tokens (%d reviewed and refused, %d throttled) cost %d TokenReviews; a new caller was served in %s during the flood",
		refused.Load()+throttled.Load(), refused.Load(), throttled.Load(), reviews, served.Round(time.Microsecond))
	if bound := 100 + 20*int(time.Since(flood).Seconds()+served.Seconds()+5) + 1; int(reviews) > bound {
		t.Fatalf("the flood cost %d TokenReviews, more than the shared budget's %d", reviews, bound)
	}
}
