// This file is written by hand: what clients and the daemon agree on
// besides the messages.

package informerdv1

// MaxMessageBytes is the largest message the daemon sends: a WatchResponse
// is cut at about 1 MiB unless a single event is larger, and the daemon
// refuses objects larger than MaxMessageBytes-MaxEventOverhead (its
// -max-object-bytes is at most that). Clients must accept messages of this
// size.
const MaxMessageBytes = 16 << 20

// MaxEventOverhead bounds what an event adds to its object's bytes.
const MaxEventOverhead = 4 << 10

// ErrorDomain is the domain of the google.rpc.ErrorInfo details the
// daemon attaches to some errors.
const ErrorDomain = "informerd.io"

// ReasonObjectNotFound is the ErrorInfo reason of a NOT_FOUND that is
// about the object named, not its resource (Get).
const ReasonObjectNotFound = "OBJECT_NOT_FOUND"

// ReasonClusterScoped is the ErrorInfo reason of a NOT_FOUND for a
// request that names a namespace of a cluster-scoped resource: the API
// server has no such path. A client that treats the namespace as a
// default (kubectl's -n) retries without it.
const ReasonClusterScoped = "CLUSTER_SCOPED"

// ReasonRequestTooLarge is the ErrorInfo reason of a RESOURCE_EXHAUSTED for
// a request message larger than the daemon accepts: sending it again
// cannot succeed.
const ReasonRequestTooLarge = "REQUEST_TOO_LARGE"

// MaxStatusObjects is the most objects one WatchStatus or
// WatchStatusChunked request may name.
const MaxStatusObjects = 20000

// ReasonSensitive is the ErrorInfo reason of a PERMISSION_DENIED for a
// resource the daemon does not serve to anyone (a sensitive resource its
// operator has not opted in to): the caller's RBAC was not consulted.
const ReasonSensitive = "SENSITIVE_RESOURCE"

// ReasonDenied is the ErrorInfo reason of a PERMISSION_DENIED from the
// API server's authorizer; its metadata carries MetadataUser, the caller
// as the API server names it, for messages in the API server's shape.
const ReasonDenied = "ACCESS_DENIED"

// ReasonTooNew is the ErrorInfo reason of an UNAVAILABLE for a request
// whose resourceVersion the informer did not reach within its wait (3s,
// as the API server's watch cache); its metadata carries
// MetadataWantResourceVersion and MetadataCurrentResourceVersion.
const ReasonTooNew = "RESOURCE_VERSION_TOO_NEW"

// ReasonCRDTerminating is the ErrorInfo reason of an UNAVAILABLE for a
// custom resource whose CustomResourceDefinition is being deleted: the
// API server serves it until the CRD's finalizers are done, then answers
// 404, and only it knows which it answers now. A client that can ask the
// API server (WrapConfig) does; the daemon answers NOT_FOUND once the CRD
// is gone.
const ReasonCRDTerminating = "CRD_TERMINATING"

// MetadataWantResourceVersion is the ErrorInfo metadata key of the
// resourceVersion a request asked for, not reached.
const MetadataWantResourceVersion = "want_resource_version"

// MetadataCurrentResourceVersion is the ErrorInfo metadata key of the
// resourceVersion the informer had reached.
const MetadataCurrentResourceVersion = "current_resource_version"

// MetadataUser is the ErrorInfo metadata key of the caller's user name.
const MetadataUser = "user"

// HeaderAccepted is a response header key of a Watch stream: the daemon
// sends its headers once it has accepted the request (validated,
// authorized, subscribed, its informer synced and as fresh as asked), so
// that a client can tell an accepted stream that has nothing to send yet
// from one about to fail.
const HeaderAccepted = "informerd-accepted"

// HeaderReset is a response header key of a Watch stream, sent with
// HeaderAccepted when the requested resume point is lost: the stream
// starts with RESET and a snapshot. Its value is ResetLost or
// ResetNewInformer.
const HeaderReset = "informerd-reset"

// The values of HeaderReset.
const (
	// ResetLost: the informer ran before the request, and no longer holds
	// the resume point.
	ResetLost = "lost"
	// ResetNewInformer: the request started the informer, which began
	// after the resume point.
	ResetNewInformer = "new-informer"
)
