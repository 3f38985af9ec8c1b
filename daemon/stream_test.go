package daemon_test

import (
	"context"
	"slices"
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

// TestShutdownSendsWhatTheStreamTook: when the daemon shuts down (as a
// handoff ends its streams, once each has taken the handoff's Bookmark) a
// stream still sends every event it had taken, to a client that reads
// slowly too, before it ends with UNAVAILABLE.
func TestShutdownSendsWhatTheStreamTook(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := newFakeAPIServer(t)
	// One event per batch: the stream holds the last ones while its
	// sender waits on flow control.
	srv := serve(t, api, authOn, func(c *serverConfig) { c.opts.MaxBatchBytes = 1 })
	c, err := client.Dial(srv.socket, append(srv.credentials("slow"), grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Stream(ctx, client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ClientName: "slow"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if evs, err := s.Recv(); err != nil || evs[len(evs)-1].GetType() != informerdv1.EventType_EVENT_TYPE_SYNCED {
		t.Fatalf("first batch: %v, %v", evs, err)
	}
	// 200 KiB fill the windows; the two events after them wait in the daemon.
	api.feed <- event(1, 2, 200<<10)
	api.feed <- event(2, 3, 10)
	api.feed <- event(3, 4, 10)
	err = wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
		src := srv.mgr.Sources()
		return len(src) == 1 && src[0].ResourceVersion == "4" && src[0].MaxLagEvents == 0, nil
	})
	if err != nil {
		t.Fatal("the stream never took the three events")
	}
	srv.srv.Shutdown()
	var got []string
	for {
		evs, err := s.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shutting down") {
				t.Fatalf("the stream ended with %v, want UNAVAILABLE saying the daemon shuts down", err)
			}
			break
		}
		for _, ev := range evs {
			got = append(got, ev.GetResourceVersion())
		}
	}
	if want := []string{"2", "3", "4"}; !slices.Equal(got, want) {
		t.Fatalf("after the shutdown the stream sent the events at %v, want %v: it lost what it had taken", got, want)
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
