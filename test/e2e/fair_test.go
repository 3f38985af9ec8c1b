package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestUnaryFloodOfOneCaller (issue 29): one ServiceAccount looping
// GetDiscovery and Get on 8 connections of its own, not waiting out its
// refusals, against the informerd binary, gets its share of unary calls
// and RESOURCE_EXHAUSTED for the rest, while a bystander's Gets are all
// answered and its new Watch syncs: with a tight share (20/s, burst 20,
// waiting at most 10 ms for a token, so that this machine floods well
// beyond it), and with the defaults (100/s, burst 200, 500 ms), under
// which its 8 calls in flight mostly wait for their tokens, paced rather
// than refused. It logs the figures: the daemon's CPU, calls answered and
// refused, the bystander's Get p99 and time to SYNCED, quiet and under
// the flood.
func TestUnaryFloodOfOneCaller(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rate, burst float64
		args        []string
	}{
		{"tight", 20, 20, []string{"-unary-calls-per-second=20", "-unary-call-burst=20", "-unary-call-max-wait=10ms"}},
		{"defaults", 100, 200, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { unaryFlood(t, tc.rate, tc.burst, tc.args...) })
	}
}

func unaryFlood(t *testing.T, rate, burst float64, args ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "flood")
	createConfigMap(ctx, t, ns, "cm", map[string]string{"k": "v"})
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "d.sock"), args...)
	getCM := &informerdv1.GetRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: ns, Name: "cm"}
	bystander := dialSocket(t, d.socket, reads(configMaps, ns))

	// p99 of the bystander's Gets over dur, and its new Watch's time to
	// SYNCED.
	measure := func(dur time.Duration) (p99, synced time.Duration) {
		start := time.Now()
		openStream(ctx, t, bystander, client.WatchOptions{Resource: configMaps, Namespace: ns}, "").
			until(ctx, t, "the bystander's new watch syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
		synced = time.Since(start)
		var lat []time.Duration
		for end := time.Now().Add(dur); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			start := time.Now()
			if _, err := bystander.API().Get(ctx, getCM); err != nil {
				t.Fatalf("the bystander's Get: %v", err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100], synced
	}
	if _, err := bystander.API().Get(ctx, getCM); err != nil { // the informer starts
		t.Fatal(err)
	}
	const quiet, flood = 3 * time.Second, 6 * time.Second
	cpu0 := d.metric("process_cpu_seconds_total")
	quietP99, quietSynced := measure(quiet)
	cpuQuiet := d.metric("process_cpu_seconds_total") - cpu0

	token := identity(t, reads(configMaps, ns))
	floodCtx, stop := context.WithCancel(ctx)
	var answered, refused atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()), client.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		greedy := informerdv1.NewInformerServiceClient(conn)
		wg.Go(func() {
			for floodCtx.Err() == nil {
				for _, call := range []func() error{
					func() error { _, err := greedy.GetDiscovery(floodCtx, &informerdv1.GetDiscoveryRequest{}); return err },
					func() error { _, err := greedy.Get(floodCtx, getCM); return err },
				} {
					switch err := call(); {
					case err == nil:
						answered.Add(1)
					case status.Code(err) == codes.ResourceExhausted:
						refused.Add(1)
					case floodCtx.Err() == nil:
						t.Errorf("the flood: %v", err)
					}
				}
			}
		})
	}
	start, cpu1 := time.Now(), d.metric("process_cpu_seconds_total")
	floodP99, floodSynced := measure(flood)
	cpuFlood := d.metric("process_cpu_seconds_total") - cpu1
	stop()
	wg.Wait()
	took := time.Since(start)
	t.Logf("one caller's flood on 8 connections for %s: %d calls answered, %d refused; daemon CPU %.2f cores quiet, %.2f flooded; bystander's Get p99 %s quiet, %s flooded; its new Watch SYNCED in %s quiet, %s flooded",
		took.Round(time.Millisecond), answered.Load(), refused.Load(), cpuQuiet/quiet.Seconds(), cpuFlood/took.Seconds(),
		quietP99.Round(time.Millisecond), floodP99.Round(time.Millisecond), quietSynced.Round(time.Millisecond), floodSynced.Round(time.Millisecond))
	// The share: the burst, then the rate.
	if most := int64(burst + rate*(took.Seconds()+0.1)); answered.Load() > most {
		t.Errorf("the flooder had %d calls answered in %s, more than its share (%d)", answered.Load(), took, most)
	}
	if refused.Load() == 0 && len(args) > 0 {
		t.Error("the flooder was never refused: the test proves nothing")
	}
}

// TestNewInformerChurnOfOneCaller (issue 29, item 3): one caller's Gets
// in 50 namespaces, each an informer of its own with -scope=namespace,
// against the informerd binary with the default rate of new informers
// (60 a minute, burst 32) and -max-informers=40: the burst starts
// informers, the rest are refused with RESOURCE_EXHAUSTED before anything
// is started or stopped for them, so the API server gets one LIST per
// informer started and none for a refusal, and a bystander's lingering
// informer, which 50 informers would have evicted at the limit, survives
// and serves it again without a LIST. (The client library would wait out
// each refusal's retry delay and start the rest at the rate.) It logs the
// figures.
func TestNewInformerChurnOfOneCaller(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "churn")
	createConfigMap(ctx, t, ns, "cm", nil)
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "d.sock"), "-scope=namespace", "-max-informers=40", "-linger-ttl=10m")
	get := func(c informerdv1.InformerServiceClient, namespace, name string) error {
		_, err := c.Get(ctx, &informerdv1.GetRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: namespace, Name: name})
		return err
	}
	bystander := dialSocket(t, d.socket, reads(configMaps, ns)).API()
	if err := get(bystander, ns, "cm"); err != nil { // its informer starts, then lingers
		t.Fatal(err)
	}
	// Not the client library, which waits out a refusal's retry delay:
	// the greedy caller asks again at once.
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()), client.WithToken(identity(t, reads(configMaps, ""))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	greedy := informerdv1.NewInformerServiceClient(conn)
	lists0 := d.metric("informerd_upstream_lists_total")
	start := time.Now()
	var started, refused int
	for i := range 50 {
		switch err := get(greedy, fmt.Sprintf("%s-%02d", ns, i), "x"); status.Code(err) {
		case codes.NotFound: // its informer synced, and holds no x
			started++
		case codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("Get %d: %v", i, err)
		}
	}
	took := time.Since(start)
	lists := d.metric("informerd_upstream_lists_total") - lists0
	if err := get(bystander, ns, "cm"); err != nil {
		t.Fatalf("the bystander after the churn: %v", err)
	}
	bystanderLists := d.metric("informerd_upstream_lists_total") - lists0 - lists
	t.Logf("one caller's 50 Gets in 50 namespaces in %s: %d informers started, %d refused (%v counted), %d LISTs; the bystander's lingering informer served it again with %v LISTs",
		took.Round(time.Millisecond), started, refused, d.metric("informerd_new_informers_refused_total"), int(lists), bystanderLists)
	if most := 32 + int(took.Minutes()*60) + 1; started > most || refused == 0 {
		t.Errorf("%d informers started, %d refused in %s; want at most %d started (the burst, then 1/s) and the rest refused", started, refused, took, most)
	}
	if int(lists) != started {
		t.Errorf("%v LISTs for %d informers started: refusals cost the API server", lists, started)
	}
	if bystanderLists != 0 {
		t.Errorf("the bystander's informer was evicted: its Get cost %v LISTs", bystanderLists)
	}
}
