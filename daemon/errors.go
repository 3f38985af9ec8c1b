package daemon

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	statusengine "github.com/informerd/informerd/status"
)

var (
	// errShuttingDown ends streams when the daemon stops.
	errShuttingDown = errors.New("informerd is shutting down: reconnect to its replacement")
	// errWriteTimeout ends a stream whose client stopped reading.
	errWriteTimeout = errors.New("the client read nothing for the stream write timeout: the stream was ended; reconnect and resume from the last resource_version received")
	// errLimit: a request exceeds one of the daemon's limits; the wrapping
	// error names it.
	errLimit = errors.New("limit exceeded")
	// errTooLarge: a request is larger than the daemon ever accepts, so
	// sending it again cannot succeed (REQUEST_TOO_LARGE); it is an
	// errLimit.
	errTooLarge = fmt.Errorf("%w: request too large", errLimit)
	// errSensitive: the resource is sensitive and the operator has not
	// opted in to serving it.
	errSensitive = errors.New("sensitive resource")
	// errClusterScoped: a request names a namespace of a cluster-scoped
	// resource.
	errClusterScoped = errors.New("not found")
)

// toStatus maps an error to the gRPC status a client sees. It is the only
// place that does; errors that already carry a status keep it.
func toStatus(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, auth.ErrUnauthenticated):
		code = codes.Unauthenticated
	case errors.Is(err, auth.ErrDenied), errors.Is(err, errSensitive):
		code = codes.PermissionDenied
	case errors.Is(err, cache.ErrUnknownResource), errors.Is(err, cache.ErrResourceRemoved), errors.Is(err, cache.ErrObjectNotFound),
		errors.Is(err, errClusterScoped):
		code = codes.NotFound
	case errors.Is(err, cache.ErrRejected):
		code = codes.InvalidArgument
	case errors.Is(err, cache.ErrNoInformer):
		code = codes.FailedPrecondition
	case errors.Is(err, cache.ErrLimit), errors.Is(err, errLimit), errors.Is(err, auth.ErrThrottled):
		code = codes.ResourceExhausted
	case errors.Is(err, statusengine.ErrForbidden):
		code = codes.PermissionDenied
	case errors.Is(err, cache.ErrNotSynced), errors.Is(err, cache.ErrStopped), errors.Is(err, cache.ErrTooNew), errors.Is(err, cache.ErrCRDTerminating),
		errors.Is(err, errShuttingDown), errors.Is(err, errWriteTimeout), errors.Is(err, statusengine.ErrStopped),
		errors.Is(err, auth.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	st := status.New(code, err.Error())
	// Tells "no such object" and "no such namespace of this resource" from
	// "no such resource".
	reason := ""
	var metadata map[string]string
	var ae *auth.Error
	var tn *cache.TooNewError
	switch {
	case errors.Is(err, cache.ErrObjectNotFound):
		reason = informerdv1.ReasonObjectNotFound
	case errors.Is(err, errClusterScoped):
		reason = informerdv1.ReasonClusterScoped
	case errors.Is(err, errTooLarge):
		reason = informerdv1.ReasonRequestTooLarge
	case errors.Is(err, errSensitive):
		reason = informerdv1.ReasonSensitive
	case errors.Is(err, cache.ErrCRDTerminating):
		reason = informerdv1.ReasonCRDTerminating
	case errors.As(err, &ae) && errors.Is(ae.Kind, auth.ErrDenied) && ae.User != "":
		reason, metadata = informerdv1.ReasonDenied, map[string]string{informerdv1.MetadataUser: ae.User}
	case errors.As(err, &tn):
		reason, metadata = informerdv1.ReasonTooNew, map[string]string{
			informerdv1.MetadataWantResourceVersion:    strconv.FormatUint(tn.Want, 10),
			informerdv1.MetadataCurrentResourceVersion: strconv.FormatUint(tn.Current, 10),
		}
	}
	if reason != "" {
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: informerdv1.ErrorDomain, Reason: reason, Metadata: metadata}); derr == nil {
			st = d
		}
	}
	if after, ok := retryDelay(err); ok {
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)}); derr == nil {
			st = d
		}
	}
	return st.Err()
}
