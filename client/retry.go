package client

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxRetryWait bounds the time a unary call waits, in all, for the
// daemon's retry delays when its context has no deadline: a daemon that
// keeps refusing a caller fails its call then rather than never.
const maxRetryWait = time.Minute

// retryDelay returns the retry delay of err: the daemon refused the call
// for its caller's share (RESOURCE_EXHAUSTED with errdetails.RetryInfo),
// and it may succeed after that delay.
func retryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// retryShares is a unary interceptor that, when the daemon refuses a call
// for its caller's share of unary calls or of new informers (see
// retryDelay), waits the delay it names and calls again, within the
// call's context (and at most maxRetryWait in all without a deadline):
// a loop of Gets slows down to its share instead of failing. A refusal
// whose delay would outlast the context is returned at once.
func retryShares(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	giveUp := time.Now().Add(maxRetryWait)
	if d, ok := ctx.Deadline(); ok {
		giveUp = d
	}
	for {
		err := invoker(ctx, method, req, reply, cc, opts...)
		delay, ok := retryDelay(err)
		if !ok || time.Now().Add(delay).After(giveUp) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
