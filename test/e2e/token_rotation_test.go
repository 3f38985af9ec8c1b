package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/internal/resumetest"
)

// TestInformerResumesWithTheRotatedToken (issue 28): the daemon ends a
// stream at its token's expiry (UNAUTHENTICATED); an informer over the
// client-go adapter whose token file was rotated meanwhile, as the kubelet
// rotates projected tokens, resumes its watch with the new token, without
// a relist, and goes on receiving changes.
func TestInformerResumesWithTheRotatedToken(t *testing.T) {
	if !env.Owned() {
		t.Skip("needs a control plane this test binary started (its issuer key)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "rotation")
	createConfigMap(ctx, t, ns, "before", nil)
	d := startDaemon(t, cache.Options{Scope: cache.ScopeNamespace})
	saNs, sa := newServiceAccount(t)
	long := identityToken(t, saNs, sa, reads(configMaps, ns))
	const lifetime = 8 * time.Second
	short, err := env.ExpiredToken(long, -lifetime) // expires in 8 s
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken := func(tok string) {
		tmp := tokenFile + ".new"
		if err := os.WriteFile(tmp, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, tokenFile); err != nil { // as the kubelet swaps the file
			t.Fatal(err)
		}
	}
	writeToken(short)
	var streams atomic.Int32
	count := grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err == nil {
			streams.Add(1)
		}
		return s, err
	})
	c := dialWith(t, d.socket, client.WithTokenFile(tokenFile), count)
	lw := &resumetest.BreakingLW{ListerWatcher: client.NewListerWatcher(c, client.WatchOptions{Resource: configMaps, Namespace: ns})}
	inf := toolscache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, toolscache.Indexers{})
	seen := make(chan string, 16)
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { seen <- obj.(*unstructured.Unstructured).GetName() },
	}); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(runCtx) }()
	defer func() { stop(); <-done }()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("the informer never synced")
	}
	opened := streams.Load()

	// The kubelet rotates the token before it expires; the daemon ends
	// the stream once the API server no longer accepts the old one (it
	// allows a minute of clock skew past the expiry), and the adapter
	// opens another.
	writeToken(long)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return streams.Load() > opened, nil
	}); err != nil {
		t.Fatalf("no stream was opened again after the token expired: %v", err)
	}
	createConfigMap(ctx, t, ns, "after-expiry", nil)
	for name := ""; name != "after-expiry"; {
		select {
		case name = <-seen:
		case <-ctx.Done():
			t.Fatal("the informer never received the change made after its token expired")
		}
	}
	if n := lw.Initial(); n != 1 {
		t.Errorf("the informer asked for an initial state %d times, want once (no relist at the token's expiry)", n)
	}
}
