package daemon_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// refusedFor returns the retry delay of err if it is RESOURCE_EXHAUSTED
// with a RetryInfo and its message names flag, and fails the test
// otherwise.
func refusedFor(t *testing.T, what string, err error, flag string) time.Duration {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), flag) {
		t.Fatalf("%s: %v; want RESOURCE_EXHAUSTED naming %s", what, err, flag)
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("%s: %v has no RetryInfo", what, err)
	return 0
}

// counterValue reads the counter name with the label values labels (name,
// value pairs), or 0.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestUnaryCallsShare: a caller's unary calls beyond its burst are refused
// with RESOURCE_EXHAUSTED and a retry delay, counted by RPC, on every one
// of its connections; another caller is served; the client library waits
// out the delay instead of failing, unless the delay outlasts its
// context.
func TestUnaryCallsShare(t *testing.T) {
	api := newFakeAPIServer(t)
	reg := prometheus.NewRegistry()
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.opts.Registerer = reg
		c.opts.Limits.UnaryCallsPerSecond, c.opts.Limits.UnaryCallBurst, c.opts.Limits.UnaryCallMaxWait = 1, 3, time.Millisecond
	})
	ctx := context.Background()
	greedy := informerdv1.NewInformerServiceClient(grpcConn(t, srv, "greedy"))
	for i := range 3 {
		if _, err := greedy.Version(ctx, &informerdv1.VersionRequest{}); err != nil {
			t.Fatalf("call %d, within the burst: %v", i+1, err)
		}
	}
	again := informerdv1.NewInformerServiceClient(grpcConn(t, srv, "greedy")) // the caller, not the connection, has the share
	_, err := again.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{})
	if d := refusedFor(t, "beyond the burst", err, "-unary-calls-per-second"); d <= 0 || d > time.Second {
		t.Fatalf("retry delay %s, want within the second a token takes", d)
	}
	if got := counterValue(t, reg, "informerd_unary_calls_refused_total", "rpc", "GetDiscovery"); got != 1 {
		t.Fatalf("informerd_unary_calls_refused_total{rpc=GetDiscovery} = %v, want 1", got)
	}
	bystander := informerdv1.NewInformerServiceClient(grpcConn(t, srv, "bystander"))
	if _, err := bystander.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{}); err != nil {
		t.Fatalf("another caller: %v", err)
	}

	// The client library waits for the caller's next token.
	lib := srv.dial(t, "greedy").API()
	if _, err := lib.Version(ctx, &informerdv1.VersionRequest{}); err != nil {
		t.Fatalf("through the client library: %v", err)
	}
	if got := counterValue(t, reg, "informerd_unary_calls_refused_total", "rpc", "Version"); got < 1 {
		t.Fatalf("the client library's call was never refused (%v): the test proves nothing", got)
	}
	// Its bucket is empty again: a delay longer than the context fails at
	// once.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = lib.Version(short, &informerdv1.VersionRequest{})
	refusedFor(t, "with a deadline before the next token", err, "-unary-calls-per-second")
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Fatalf("a refusal it could not wait out took %s", d)
	}
}

// TestGetHoldsAStream: a Get waiting for its informer to reach
// not_older_than_resource_version holds one of its caller's streams until
// it ends, so that a caller cannot hold more subscriptions through Gets
// than through streams.
func TestGetHoldsAStream(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) { c.opts.Limits.MaxStreamsPerCaller = 1 })
	greedy := srv.dial(t, "greedy")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	get := func(ctx context.Context, notOlderThan string) error {
		_, err := greedy.API().Get(ctx, &informerdv1.GetRequest{
			Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: "bench", Name: "cm-1",
			NotOlderThanResourceVersion: notOlderThan,
		})
		return err
	}
	got := make(chan error, 1)
	go func() { got <- get(ctx, "1000000") }()
	// Its informer's LIST comes after the Get took its stream; then the
	// Get waits for a resourceVersion that never comes (for 3 s).
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return api.lists.Load() > 0, nil
	}); err != nil {
		t.Fatal("the Get never started its informer")
	}
	err := firstResponse(greedy, client.WatchOptions{Resource: configMaps})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-streams-per-caller") {
		t.Fatalf("a stream while the Get waits: %v; want RESOURCE_EXHAUSTED naming max-streams-per-caller", err)
	}
	err = get(ctx, "")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-streams-per-caller") {
		t.Fatalf("a 2nd Get while the 1st waits: %v; want RESOURCE_EXHAUSTED naming max-streams-per-caller", err)
	}
	cancel()
	if err := <-got; status.Code(err) != codes.Canceled {
		t.Fatalf("the waiting Get: %v, want CANCELED", err)
	}
	if werr := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return firstResponse(greedy, client.WatchOptions{Resource: configMaps}) == nil, nil
	}); werr != nil {
		t.Fatal("the caller never got its stream back after its Get ended")
	}
}

// TestNewInformerRate: a caller that starts informers faster than its
// rate is refused with RESOURCE_EXHAUSTED and a retry delay before
// anything is started or stopped for it: a bystander's lingering informer
// survives the churn at -max-informers, and the caller is still served
// from informers that run.
func TestNewInformerRate(t *testing.T) {
	api := newFakeAPIServer(t)
	reg := prometheus.NewRegistry()
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.maxSources, c.opts.Registerer = 3, reg
		c.opts.Limits.NewInformersPerMinute, c.opts.Limits.NewInformerBurst = 1, 2
	})
	named := func(name string) client.WatchOptions {
		return client.WatchOptions{Resource: configMaps, FieldSelector: "metadata.name=" + name}
	}
	if err := firstResponse(srv.dial(t, "bystander"), named("keep")); err != nil {
		t.Fatal(err)
	}
	greedy := srv.dial(t, "greedy")
	for _, name := range []string{"g1", "g2"} {
		if err := firstResponse(greedy, named(name)); err != nil {
			t.Fatalf("%s, within the burst: %v", name, err)
		}
	}
	lingering := func() (keep bool, n int) {
		for _, s := range srv.mgr.Sources() {
			if s.RefCount == 0 {
				n++
				keep = keep || s.Key.FieldSelector == "metadata.name=keep"
			}
		}
		return keep, n
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, n := lingering()
		return n == 3, nil
	}); err != nil {
		t.Fatalf("the 3 informers never all lingered: %v", srv.mgr.Sources())
	}
	lists := api.lists.Load()
	for i := range 10 {
		err := firstResponse(greedy, named("churn-"+string(rune('a'+i))))
		if d := refusedFor(t, "a new informer beyond the rate", err, "-new-informers-per-minute"); d < 50*time.Second || d > time.Minute {
			t.Fatalf("retry delay %s, want about the minute a token takes", d)
		}
	}
	if keep, n := lingering(); !keep || n != 3 {
		t.Fatalf("after the churn: %d lingering, the bystander's among them: %t; want 3 and true", n, keep)
	}
	if got := api.lists.Load(); got != lists {
		t.Fatalf("the refused requests made %d LISTs", got-lists)
	}
	if got := counterValue(t, reg, "informerd_new_informers_refused_total"); got != 10 {
		t.Fatalf("informerd_new_informers_refused_total = %v, want 10", got)
	}
	if err := firstResponse(greedy, named("g1")); err != nil {
		t.Fatalf("served by a lingering informer: %v", err)
	}
	if err := firstResponse(srv.dial(t, "newcomer"), named("new")); err != nil {
		t.Fatalf("another caller's new informer (a lingering one makes room): %v", err)
	}
}

// TestUnaryFloodLeavesABystanderServed: one caller looping GetDiscovery
// and Get on 8 connections, without waiting out its refusals, gets its
// share (the burst, then the rate: 10 and 10/s here, so that a loaded
// machine floods enough) and RESOURCE_EXHAUSTED for the rest, while a
// bystander's Gets are all answered. It logs the figures: calls
// answered and refused, the bystander's p99 quiet and under the flood,
// and the test process's CPU (daemon and clients together).
func TestUnaryFloodLeavesABystanderServed(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3 s flood")
	}
	api := newFakeAPIServer(t)
	const rate, burst = 10, 10
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.opts.Limits.UnaryCallsPerSecond, c.opts.Limits.UnaryCallBurst = rate, burst
	})
	getCM := &informerdv1.GetRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: "bench", Name: "cm-1"}
	answered := func(err error) bool { return err == nil || status.Code(err) == codes.NotFound }
	bystander := srv.dial(t, "bystander").API()
	// p99 of the bystander's Gets over d, each answered.
	measure := func(d time.Duration) time.Duration {
		var lat []time.Duration
		for end := time.Now().Add(d); time.Now().Before(end); {
			start := time.Now()
			if _, err := bystander.Get(context.Background(), getCM); !answered(err) {
				t.Errorf("the bystander's Get: %v", err)
				return 0
			}
			lat = append(lat, time.Since(start))
			time.Sleep(10 * time.Millisecond)
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100]
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const quiet, flood = time.Second, 2 * time.Second
	cpu0 := cpu()
	quietP99 := measure(quiet)
	cpuQuiet := cpu() - cpu0

	ctx, cancel := context.WithCancel(context.Background())
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		greedy := informerdv1.NewInformerServiceClient(grpcConn(t, srv, "greedy"))
		wg.Go(func() {
			for ctx.Err() == nil {
				for _, call := range []func() error{
					func() error { _, err := greedy.GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{}); return err },
					func() error { _, err := greedy.Get(ctx, getCM); return err },
				} {
					switch err := call(); {
					case answered(err):
						ok.Add(1)
					case status.Code(err) == codes.ResourceExhausted:
						refused.Add(1)
					case ctx.Err() == nil:
						t.Errorf("the flood: %v", err)
					}
				}
			}
		})
	}
	start, cpu1 := time.Now(), cpu()
	floodP99 := measure(flood)
	cpuFlood := cpu() - cpu1
	cancel()
	wg.Wait()
	took := time.Since(start)
	t.Logf("flood of one caller on 8 connections for %s: %d calls answered, %d refused; bystander's Get p99 %s quiet, %s in the flood; process CPU %.2f cores quiet, %.2f in the flood",
		took.Round(time.Millisecond), ok.Load(), refused.Load(), quietP99, floodP99, cpuQuiet.Seconds()/quiet.Seconds(), cpuFlood.Seconds()/took.Seconds())
	// Its share: the burst, then the rate, and a token a call may wait
	// for (500 ms) at the end.
	if most := int64(burst + rate*(took.Seconds()+0.5)); ok.Load() > most {
		t.Errorf("the flooder had %d calls answered in %s, more than its share (%d)", ok.Load(), took, most)
	}
	if refused.Load() == 0 {
		t.Error("the flooder was never refused: the test proves nothing")
	}
}
