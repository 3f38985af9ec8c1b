package cache

import (
	"errors"
	"fmt"
)

// Sentinel errors; daemon maps them to gRPC codes.
var (
	// ErrNotSynced: the Source has not completed its first list, and the
	// last attempt failed. The error wraps the cause.
	ErrNotSynced = errors.New("informer has not synced")
	// ErrResourceRemoved: the resource no longer exists upstream (for
	// example its CustomResourceDefinition was deleted). Where the Manager
	// knows it from its watch of CRDs, before discovery does, the error is
	// ErrUnknownResource as well.
	ErrResourceRemoved = errors.New("resource removed")
	// ErrCRDTerminating: the resource's CustomResourceDefinition is being
	// deleted. The API server still serves it while the CRD's finalizers
	// run, then answers 404; an informer cannot tell which it answers now,
	// so only the API server can answer. Once the CRD is gone, requests
	// get ErrResourceRemoved.
	ErrCRDTerminating = errors.New("resource terminating")
	// ErrUnknownResource: the API server does not serve the resource.
	ErrUnknownResource = errors.New("unknown resource")
	// ErrStopped: the Source or Manager was stopped.
	ErrStopped = errors.New("informer stopped")
	// ErrRejected: the API server rejected the request as invalid (400 or
	// 422), for example a field selector it does not support for the
	// resource. The error wraps the API server's; its message quotes at
	// most 64 bytes of the field selector in one place.
	ErrRejected = errors.New("the API server rejected the request")
	// ErrTooNew: the request asked for a resourceVersion the informer has
	// not reached in time; retrying later may succeed.
	ErrTooNew = errors.New("resourceVersion not reached yet")
	// ErrObjectNotFound: Get found no such object.
	ErrObjectNotFound = errors.New("object not found")
	// ErrLimit: a limit of the Manager (Options) refuses the request; the
	// error names the limit.
	ErrLimit = errors.New("limit reached")
	// ErrNoInformer: a Request with ExistingInformerOnly found no informer
	// running or lingering for its Key, and started none.
	ErrNoInformer = errors.New("no informer runs for the request")
)

// TooNewError is the ErrTooNew of a subscription whose informer did not
// reach Want within its wait: it was at Current.
type TooNewError struct {
	Key           Key
	Want, Current uint64
}

func (e *TooNewError) Error() string {
	return fmt.Sprintf("%v: %s has not reached resourceVersion %d within %s; it is at %d (retry)", ErrTooNew, e.Key, e.Want, freshnessWait, e.Current)
}

func (e *TooNewError) Unwrap() error { return ErrTooNew }
