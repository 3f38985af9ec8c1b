package daemon_test

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/client"
)

// grpcConn dials the test daemon's socket with gRPC alone, as the caller
// named name, or without a token if name is ""; it is closed when the
// test ends.
func grpcConn(t testing.TB, srv *testServer, name string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if name != "" {
		opts = append(opts, srv.credentials(name)...)
	}
	conn, err := grpc.NewClient("unix://"+srv.socket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// healthClient is a health client on its own grpcConn.
func healthClient(t testing.TB, srv *testServer, name string) healthpb.HealthClient {
	t.Helper()
	return healthpb.NewHealthClient(grpcConn(t, srv, name))
}

// watchHealth opens a health Watch with hc and returns what ends its
// first Recv: nil once it was served a status. The stream stays open
// until ctx ends.
func watchHealth(ctx context.Context, hc healthpb.HealthClient) error {
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	_, err = w.Recv()
	return err
}

// healthWatchHandlers counts the goroutines serving a health Watch: the
// daemon's side of each open one.
func healthWatchHandlers() int {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("grpc/health.(*Server).Watch("))
}

// settledGoroutines waits until the goroutines are at most want, and
// returns how many there are then (more than want if they never were).
func settledGoroutines(want int) int {
	n := runtime.NumGoroutine()
	_ = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		n = runtime.NumGoroutine()
		return n <= want, nil
	})
	return n
}

// TestHealthNeedsATokenExceptCheck (defect 4): only the unary health
// Check is served without a token (kubelet's probes); a token-less Watch
// or List gets UNAUTHENTICATED, and a refused Watch holds no goroutine
// although its client keeps the stream open. With a token, Watch is
// served and counts against MaxStreamsPerCaller.
func TestHealthNeedsATokenExceptCheck(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.health = true
		c.opts.Limits.MaxStreamsPerCaller = 2
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	anon := healthClient(t, srv, "")
	resp, err := anon.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("a token-less Check: %v, %v; want SERVING", resp, err)
	}
	if _, err := anon.List(ctx, &healthpb.HealthListRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a token-less List: %v; want UNAUTHENTICATED", err)
	}
	before := runtime.NumGoroutine()
	const n = 50
	for range n {
		if err := watchHealth(ctx, anon); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("a token-less Watch: %v; want UNAUTHENTICATED", err)
		}
	}
	if got := settledGoroutines(before); got > before {
		t.Errorf("%d token-less Watches refused, their streams still open: %d goroutines, %d before", n, got, before)
	}
	if h := healthWatchHandlers(); h != 0 {
		t.Errorf("%d health Watch handlers run after token-less Watches were refused", h)
	}

	prober := healthClient(t, srv, "prober")
	for i := range 2 {
		if err := watchHealth(ctx, prober); err != nil {
			t.Fatalf("Watch %d with a token: %v", i+1, err)
		}
	}
	err = watchHealth(ctx, prober)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-streams-per-caller") {
		t.Fatalf("a 3rd health Watch of a caller with 2 streams allowed: %v; want RESOURCE_EXHAUSTED naming max-streams-per-caller", err)
	}
}

// TestHealthWatchFlood (defect 4, at the scale): 4,000 token-less
// health Watches over 16 connections are all refused and hold nothing
// once refused; during a second flood, a quarter the size, a new caller
// is served within a second, and a bystander streams throughout. It logs the goroutines and
// live heap with the flood's streams open against before it.
func TestHealthWatchFlood(t *testing.T) {
	const conns, perConn = 16, 250
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) { c.health = true })
	by := newBystander(t, api, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var clients []healthpb.HealthClient
	for range conns {
		hc := healthClient(t, srv, "")
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil { // connected
			t.Fatal(err)
		}
		clients = append(clients, hc)
	}
	// flood opens perConn Watches on each connection, leaving those served
	// open, closes started after the first, and returns how they ended.
	flood := func(perConn int, started chan<- struct{}) map[codes.Code]int {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex // guards ended
			ended = map[codes.Code]int{}
			once  sync.Once
		)
		for _, hc := range clients {
			wg.Add(1)
			go func() { // ends after perConn Watches
				defer wg.Done()
				for range perConn {
					code := status.Code(watchHealth(ctx, hc))
					once.Do(func() { close(started) })
					mu.Lock()
					ended[code]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return ended
	}

	goroutinesBefore, heapBefore := runtime.NumGoroutine(), liveHeap()
	ended := flood(perConn, make(chan struct{}))
	goroutinesDuring, heapDuring, handlers := runtime.NumGoroutine(), liveHeap(), healthWatchHandlers()
	t.Logf("%d token-less health Watches (streams left open): %v; goroutines %d -> %d (%d health Watch handlers), live heap %.1f -> %.1f MiB",
		conns*perConn, ended, goroutinesBefore, goroutinesDuring, handlers, heapBefore, heapDuring)
	if ended[codes.Unauthenticated] != conns*perConn {
		t.Errorf("token-less Watches ended %v; want all %d UNAUTHENTICATED", ended, conns*perConn)
	}
	if handlers != 0 {
		t.Errorf("%d health Watch handlers hold goroutines", handlers)
	}
	if got := settledGoroutines(goroutinesBefore); got > goroutinesBefore {
		t.Errorf("goroutines %d after the refused flood, %d before", got, goroutinesBefore)
	}

	started, again := make(chan struct{}), make(chan map[codes.Code]int, 1)
	go func() { again <- flood(perConn/4, started) }() // ends after its Watches
	<-started
	start := time.Now()
	if err := firstResponse(srv.dial(t, "newcomer"), client.WatchOptions{Resource: configMaps}); err != nil {
		t.Fatalf("a new caller during the flood: %v", err)
	}
	waited := time.Since(start)
	t.Logf("a new caller during a second flood was served in %s; the flood: %v", waited.Round(time.Millisecond), <-again)
	if waited > time.Second {
		t.Errorf("a new caller waited %s during the flood; want under 1s", waited)
	}
	by.stillReceives(t)
}

// liveHeap returns the live heap in MiB, after a GC.
func liveHeap() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}
