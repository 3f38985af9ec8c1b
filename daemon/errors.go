package daemon

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/informerd/informerd/cache"
)

// errShuttingDown ends streams when the daemon stops.
var errShuttingDown = errors.New("informerd is shutting down: reconnect to its replacement")

// toStatus maps an error to the gRPC status a client sees. It is the only
// place that does; errors that already carry a status keep it.
func toStatus(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, cache.ErrUnknownResource), errors.Is(err, cache.ErrResourceRemoved):
		code = codes.NotFound
	case errors.Is(err, cache.ErrNotSynced), errors.Is(err, cache.ErrStopped), errors.Is(err, errShuttingDown):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}
