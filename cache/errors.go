package cache

import "errors"

// Sentinel errors; daemon maps them to gRPC codes.
var (
	// ErrNotSynced: the Source has not completed its first list, and the
	// last attempt failed. The error wraps the cause.
	ErrNotSynced = errors.New("informer has not synced")
	// ErrResourceRemoved: the resource no longer exists upstream (for
	// example its CustomResourceDefinition was deleted).
	ErrResourceRemoved = errors.New("resource removed")
	// ErrUnknownResource: the API server does not serve the resource.
	ErrUnknownResource = errors.New("unknown resource")
	// ErrStopped: the Source or Manager was stopped.
	ErrStopped = errors.New("informer stopped")
)
