package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/auth"
)

// access is one resource a stream reads: the caller must be allowed
// to list and watch it.
type access struct {
	GVR                          schema.GroupVersionResource
	Namespace                    string // "" for all namespaces or cluster-scoped
	LabelSelector, FieldSelector string
}

// streamVerbs are what a stream does to each resource it reads.
var streamVerbs = []string{"list", "watch"}

// recheckRetry is how soon a stream's check is tried again when it could
// not be made (the API server is unreachable, or the caller's reviews are
// throttled): the stream keeps running meanwhile, as it would during an
// outage.
const recheckRetry = 10 * time.Second

// authorize checks that the caller of ctx may list and watch every
// access. It returns a context derived from ctx that is cancelled,
// with a PERMISSION_DENIED status as its cause, when a later re-check
// denies one of them; or UNAUTHENTICATED / PERMISSION_DENIED.
//
// A sensitive resource is refused unless the operator opted in to it. The
// re-check runs when the earliest decision expires (the allow TTL): the
// caller's token is reviewed again then too, and a caller whose token has
// expired or been invalidated by then is ended with UNAUTHENTICATED. So a
// stream costs one TokenReview and its SubjectAccessReviews per allow TTL
// at most, shared with every stream of the same token and accesses.
func (s *Server) authorize(ctx context.Context, accesses ...access) (context.Context, error) {
	c := callerOf(ctx)
	if c == nil {
		return ctx, toStatus(fmt.Errorf("%w: no caller: the request did not pass the daemon's authentication", auth.ErrUnauthenticated))
	}
	for _, a := range accesses {
		if err := s.checkSensitive(a.GVR.GroupResource()); err != nil {
			return ctx, toStatus(err)
		}
	}
	if c.user == nil { // InsecureLocalOnly: the daemon's own permissions
		return ctx, nil
	}
	until, err := s.authorizeUser(ctx, c.user, accesses)
	if err != nil {
		return ctx, toStatus(err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	s.recheck(ctx, cancel, c, accesses, until)
	return ctx, nil
}

// authorizeUser checks every verb of every access for u and returns the
// earliest expiry among the decisions.
func (s *Server) authorizeUser(ctx context.Context, u *auth.User, accesses []access) (time.Time, error) {
	var until time.Time
	for _, a := range accesses {
		for _, verb := range streamVerbs {
			exp, err := s.opts.Authorizer.Authorize(ctx, u, auth.Attributes{
				Verb: verb, Resource: a.GVR, Namespace: a.Namespace,
				LabelSelector: a.LabelSelector, FieldSelector: a.FieldSelector,
			})
			if err != nil {
				return time.Time{}, err
			}
			if until.IsZero() || exp.Before(until) {
				until = exp
			}
		}
	}
	return until, nil
}

// recheck checks the caller and accesses again at until and each time the
// new decisions expire, until ctx ends; a denial or a failed
// authentication cancels ctx with its status as the cause. No goroutine
// runs between checks.
func (s *Server) recheck(ctx context.Context, cancel context.CancelCauseFunc, c *caller, accesses []access, until time.Time) {
	var (
		mu      sync.Mutex // guards timer and stopped
		timer   *time.Timer
		stopped bool
		check   func()
	)
	arm := func(at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			timer = time.AfterFunc(time.Until(at), check)
		}
	}
	check = func() {
		user, _, err := s.opts.Authenticator.AuthenticateToken(ctx, c.token, c.peer.Key())
		var next time.Time
		if err == nil {
			next, err = s.authorizeUser(ctx, user, accesses)
		}
		switch {
		case ctx.Err() != nil:
		case err == nil:
			arm(next)
		case errors.Is(err, auth.ErrDenied), errors.Is(err, auth.ErrUnauthenticated):
			c.log.Info("stream ended by a re-check", "reason", err)
			cancel(toStatus(err))
		default: // unknown: keep serving, ask again soon
			c.log.Warn("stream re-check failed; trying again", "err", err, "retry", recheckRetry)
			arm(time.Now().Add(recheckRetry))
		}
	}
	arm(until)
	context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
		cancel(nil)
	})
}

// checkSensitive refuses a sensitive resource the operator has not opted
// in to.
func (s *Server) checkSensitive(gr schema.GroupResource) error {
	if !slices.Contains(s.opts.Sensitive, gr) || slices.Contains(s.opts.ServeSensitive, gr) {
		return nil
	}
	return fmt.Errorf("%w: informerd does not serve %s by default: its operator may opt in to this resource with -serve-sensitive=%s (callers still need RBAC to list and watch it)",
		errSensitive, gr, gr)
}
