package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// refs returns n references to Deployments with realistic names (26
// bytes), from first on.
func refs(first, n int) []*informerdv1.ObjectReference {
	out := make([]*informerdv1.ObjectReference, n)
	for i := range out {
		out[i] = &informerdv1.ObjectReference{Group: "apps", Kind: "Deployment", Namespace: "team-a", Name: fmt.Sprintf("frontend-web-server-%06d", first+i)}
	}
	return out
}

// sendParts opens a WatchStatusChunked stream with c and sends n objects
// in parts of 500 (about 35 KiB), without closing its side.
func sendParts(ctx context.Context, t *testing.T, c *client.Client, n int) informerdv1.InformerService_WatchStatusChunkedClient {
	t.Helper()
	s, err := c.API().WatchStatusChunked(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 500 {
		if err := s.Send(&informerdv1.WatchStatusRequest{ClientName: "t", Objects: refs(i, min(500, n-i))}); err != nil {
			break // the daemon ended the stream: Recv says why
		}
	}
	return s
}

// result closes s's side and returns what ends its first Recv.
func result(s informerdv1.InformerService_WatchStatusChunkedClient) error {
	if err := s.CloseSend(); err != nil {
		return err
	}
	_, err := s.Recv()
	return err
}

func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// TestStatusRequestLimits: a status request of 20,000 objects arrives in
// parts within the 64 KiB message limit; one of more than 20,000 is
// INVALID_ARGUMENT; a message over the limit is gRPC's RESOURCE_EXHAUSTED; a
// caller's objects in all its open streams, counted as they arrive, stop
// at MaxStatusObjectsPerCaller (RESOURCE_EXHAUSTED without the reason
// REQUEST_TOO_LARGE: it frees up), which another caller does not feel; and a Watch keeps
// streaming meanwhile. (This daemon has no status engine: a request that
// passes every limit ends UNIMPLEMENTED.)
func TestStatusRequestLimits(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) { c.opts.Limits.MaxStatusObjectsPerCaller = 30000 })
	by := newBystander(t, api, srv)
	ctx := context.Background()
	greedy := srv.dial(t, "greedy")

	if err := result(sendParts(ctx, t, greedy, 20000)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("20,000 objects in parts: %v; want them accepted (UNIMPLEMENTED: no engine)", err)
	}
	err := result(sendParts(ctx, t, greedy, 20001))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at most 20000") {
		t.Fatalf("20,001 objects in parts: %v; want INVALID_ARGUMENT naming the limit", err)
	}
	for name, send := range map[string]func() error{
		"WatchStatus": func() error {
			s, err := greedy.API().WatchStatus(ctx, &informerdv1.WatchStatusRequest{Objects: refs(0, 1500)})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
		"WatchStatusChunked": func() error {
			s, err := greedy.API().WatchStatusChunked(ctx)
			if err != nil {
				return err
			}
			_ = s.Send(&informerdv1.WatchStatusRequest{Objects: refs(0, 1500)})
			return result(s)
		},
	} {
		err := send()
		// gRPC itself answers (and the client recognizes its message).
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "received message larger than max") {
			t.Fatalf("%s of a 100 KiB message: %v; want gRPC's RESOURCE_EXHAUSTED", name, err)
		}
	}

	hctx, release := context.WithCancel(ctx)
	held := sendParts(hctx, t, greedy, 20000)
	// The daemon counts a part once it read it, which the client cannot
	// see: poll until it has.
	_ = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		err = result(sendParts(ctx, t, greedy, 10001))
		return status.Code(err) != codes.Unimplemented, nil
	})
	if status.Code(err) != codes.ResourceExhausted || reason(err) != "" || !strings.Contains(err.Error(), "max-status-objects-per-caller") {
		t.Fatalf("10,001 more objects of the caller: %v; want RESOURCE_EXHAUSTED naming max-status-objects-per-caller", err)
	}
	if err := result(sendParts(ctx, t, srv.dial(t, "other"), 20000)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("another caller's 20,000 objects: %v", err)
	}
	by.stillReceives(t)
	release()
	_, _ = held.Recv()
	// The daemon gives the objects back when the handler returns, after
	// the client saw its stream end: poll.
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return status.Code(result(sendParts(ctx, t, greedy, 10000))) == codes.Unimplemented, nil
	})
	if err != nil {
		t.Fatal("the caller never got its objects back after its stream ended")
	}
}
