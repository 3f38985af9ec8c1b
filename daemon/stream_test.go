package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestStalledClientIsCutOff (defect 9.3): a client that stops reading is
// cut off after the write timeout with UNAVAILABLE (it may resume), the
// daemon keeps none of its data beyond that, and a bystander on the same
// resource keeps receiving throughout.
func TestStalledClientIsCutOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := newFakeAPIServer(t)
	reg := prometheus.NewRegistry()
	srv := serve(t, api, authOn, func(c *serverConfig) { c.opts.WriteTimeout, c.opts.Registerer = 100*time.Millisecond, reg })
	bystander := subscribe(t, srv, "bystander")
	bystander.waitSynced(t)

	// Small flow-control windows: the daemon's writes block once about
	// 64 KiB are unread.
	c, err := client.Dial(srv.socket, append(srv.credentials("stalled"), grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stalled, err := c.Stream(ctx, client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ClientName: "stalled"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if evs, err := stalled.Recv(); err != nil || evs[len(evs)-1].GetType() != informerdv1.EventType_EVENT_TYPE_SYNCED {
		t.Fatalf("stalled client's first batch: %v, %v", evs, err)
	}

	const n = 300 // 300 x 4 KiB: far past the windows
	for i := 1; i <= n; i++ {
		api.feed <- event(i, i+1, 4096)
	}
	for got := 0; got < n; {
		select {
		case got = <-bystander.got:
		case <-ctx.Done():
			t.Fatalf("the bystander received %d of %d events while a client stalled", got, n)
		}
	}
	// The stalled stream's handler returns once it is cut off.
	err = wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return gaugeValue(t, reg, "informerd_streams") == 1, nil
	})
	if err != nil {
		t.Fatal("the stalled stream was never cut off")
	}
	for {
		_, err := stalled.Recv()
		if err == nil {
			continue // what the daemon wrote before it gave up
		}
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "read nothing") {
			t.Fatalf("the stalled stream ended with %v, want UNAVAILABLE naming the write timeout", err)
		}
		break
	}
}

// gaugeValue reads an unlabelled gauge from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
