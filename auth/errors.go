package auth

import (
	"errors"
	"fmt"
)

// Sentinel errors: every error of this package wraps one of them.
var (
	// ErrUnauthenticated: the caller's token is missing, malformed, or not
	// valid for this daemon. The message says which.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrDenied: the API server's authorizer does not allow the access.
	ErrDenied = errors.New("permission denied")
	// ErrThrottled: a source asked too many questions that the caches
	// could not answer; it may retry later.
	ErrThrottled = errors.New("too many reviews")
	// ErrUnavailable: a review could not be made (the API server is
	// unreachable or failing); the answer is unknown and not remembered.
	ErrUnavailable = errors.New("review unavailable")

	// errGraceSpent marks an ErrUnavailable past the grace a handoff
	// carried (graceMap): a Grant revokes on it rather than starting a
	// grace of its own.
	errGraceSpent = errors.New("grace spent")
)

// Error is a decision explained for the person at the other end: Error
// returns the explanation, and errors.Is matches Kind.
type Error struct {
	Kind error
	Msg  string
	// User is the caller's user name, for ErrDenied.
	User string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}
