// Package auth decides who a caller of informerd is and what it may read,
// by asking the API server, so that the daemon never reads on behalf of
// someone with its own credentials.
//
// An Authenticator turns a bearer token (a projected ServiceAccount token
// with the daemon's audience) into a User with a TokenReview; an Authorizer
// decides whether a User may do one thing (list configmaps in a namespace,
// get /metrics) with a SubjectAccessReview. Both remember their answers in
// bounded expirable LRUs keyed by a SHA-256 hash (never the token itself),
// share one review among concurrent identical questions, and limit the
// reviews that questions missing the cache cause per source, so that a
// client cannot turn garbage into an unbounded stream of reviews.
//
// The unverified claims of a token (its expiry, audiences, ServiceAccount,
// pod and node) only bound how long a positive answer is remembered and
// explain a rejection in words a person can act on; the decision is always
// the API server's.
//
// Errors wrap one of ErrUnauthenticated, ErrDenied, ErrThrottled or
// ErrUnavailable; the daemon maps them to gRPC codes. This package knows
// no gRPC.
package auth
