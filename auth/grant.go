package auth

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Grant is what one stream of a caller was allowed, and until when: the
// caller's token, good until the token cache's answer (never past the
// token's own expiry) runs out, and the accesses checked for it, each good
// until its decision expires. At the earliest of those deadlines the Grant
// checks again: the token with a TokenReview, the accesses with
// SubjectAccessReviews (each answered from the caches when they can),
// drawing on no caller's budget, so that a caller cannot dodge its
// re-checks by spending its own. When a re-check says no, the Grant calls
// its revoke func and stops.
//
// Nothing runs between deadlines: one timer, armed at the next one, and
// never sooner than minRecheck after the last check.
//
// The one fail-open rule: a re-check that cannot be made because the API
// server is unreachable (ErrUnavailable) keeps the Grant for its grace
// after the check first failed, retrying every recheckRetry; past it, the
// Grant is revoked with ErrUnavailable. Any other failure revokes it.
//
// A Grant is safe for concurrent use.
type Grant struct {
	authn  *Authenticator
	authz  *Authorizer
	token  string
	grace  time.Duration
	revoke func(error)
	ctx    context.Context // ends re-checks; a Grant made for a stream ends with it

	mu sync.Mutex // guards the fields below
	// user is who the token was last found to be.
	user     *User
	accesses []Attributes
	// tokenUntil and accessUntil are when the token and the earliest
	// access decision must be checked again; accessUntil is zero while
	// there is no access.
	tokenUntil, accessUntil time.Time
	// failingSince is when re-checks started failing with ErrUnavailable.
	failingSince time.Time
	timer        *time.Timer
	checking     bool // a re-check runs: it arms the next one when done
	stopped      bool
}

// GrantOptions configure a Grant.
type GrantOptions struct {
	// Authenticator and Authorizer re-check the Grant. Required.
	Authenticator *Authenticator
	Authorizer    *Authorizer
	// Token is the caller's bearer token, User who it was found to be,
	// and TokenUntil when that answer runs out, as Authenticate returned
	// them. Required.
	Token      string
	User       *User
	TokenUntil time.Time
	// Grace is how long re-checks may fail because the API server is
	// unreachable before the Grant is revoked. Default: the Authorizer's
	// AllowTTL.
	Grace time.Duration
	// Revoke is called at most once, from a re-check's goroutine, with an
	// error wrapping ErrUnauthenticated, ErrDenied, ErrThrottled or
	// ErrUnavailable that says why. Required.
	Revoke func(error)
}

// Re-check pacing: the soonest a check follows the previous one whatever
// the deadlines say (nothing can spin), and the interval of retries while
// the API server is unreachable.
const (
	minRecheck   = time.Second
	recheckRetry = 10 * time.Second
)

// NewGrant returns a Grant of the caller opts describe, holding no access
// yet. It re-checks until ctx ends or Stop is called.
func NewGrant(ctx context.Context, opts GrantOptions) (*Grant, error) {
	if opts.Authenticator == nil || opts.Authorizer == nil || opts.User == nil || opts.Revoke == nil {
		return nil, errors.New("auth: GrantOptions.Authenticator, Authorizer, User and Revoke are required")
	}
	if opts.Grace <= 0 {
		opts.Grace = opts.Authorizer.AllowTTL()
	}
	g := &Grant{
		authn: opts.Authenticator, authz: opts.Authorizer, token: opts.Token, grace: opts.Grace,
		revoke: opts.Revoke, ctx: ctx, user: opts.User, tokenUntil: opts.TokenUntil,
	}
	g.mu.Lock()
	g.armLocked(g.authn.opts.Now())
	g.mu.Unlock()
	g.authn.track(g, true)
	context.AfterFunc(ctx, g.Stop)
	return g, nil
}

// track adds g to (or removes it from) the live Grants that Export reads.
func (a *Authenticator) track(g *Grant, live bool) {
	a.grantsMu.Lock()
	defer a.grantsMu.Unlock()
	if !live {
		delete(a.grants, g)
		return
	}
	if a.grants == nil {
		a.grants = map[*Grant]struct{}{}
	}
	a.grants[g] = struct{}{}
}

// liveGrants returns the live Grants.
func (a *Authenticator) liveGrants() []*Grant {
	a.grantsMu.Lock()
	defer a.grantsMu.Unlock()
	out := make([]*Grant, 0, len(a.grants))
	for g := range a.grants {
		out = append(out, g)
	}
	return out
}

// graced returns, if g's re-checks are failing because the API server is
// unreachable, what it serves on and when its grace ends.
func (g *Grant) graced() (token string, u *User, accesses []Attributes, until time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped || g.failingSince.IsZero() {
		return "", nil, nil, time.Time{}, false
	}
	return g.token, g.user, slices.Clone(g.accesses), g.failingSince.Add(g.grace), true
}

// User returns who the caller was last found to be.
func (g *Grant) User() *User {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.user
}

// Add checks each of accesses for the caller, as a new question (it draws
// on the caller's budget when the caches cannot answer), and adds those
// allowed to what the Grant re-checks. It returns the first error: an
// access not allowed is not added.
func (g *Grant) Add(ctx context.Context, accesses ...Attributes) error {
	u := g.User()
	for _, a := range accesses {
		exp, err := g.authz.authorize(ctx, u, a, classNew)
		if err != nil {
			return err
		}
		g.mu.Lock()
		if !slices.Contains(g.accesses, a) {
			g.accesses = append(g.accesses, a)
		}
		if g.accessUntil.IsZero() || exp.Before(g.accessUntil) {
			g.accessUntil = exp
			g.armLocked(g.authn.opts.Now())
		}
		g.mu.Unlock()
	}
	return nil
}

// Stop ends the Grant's re-checks. It is idempotent.
func (g *Grant) Stop() {
	g.authn.track(g, false)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	if g.timer != nil {
		g.timer.Stop()
	}
}

// armLocked (re)arms the timer at the next deadline, never sooner than
// minRecheck from now, unless a re-check runs (it arms when done).
func (g *Grant) armLocked(now time.Time) {
	if g.stopped || g.checking {
		return
	}
	next := g.tokenUntil
	if !g.accessUntil.IsZero() && g.accessUntil.Before(next) {
		next = g.accessUntil
	}
	if !g.failingSince.IsZero() {
		next = now.Add(recheckRetry)
	}
	d := max(next.Sub(now), minRecheck)
	if g.timer == nil {
		g.timer = time.AfterFunc(d, g.recheck)
	} else {
		g.timer.Reset(d)
	}
}

// recheck checks the token and every access again; see Grant.
func (g *Grant) recheck() {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return
	}
	g.checking = true
	accesses := slices.Clone(g.accesses)
	g.mu.Unlock()

	user, tokenUntil, err := g.authn.authenticate(g.ctx, g.token, "", classRecheck)
	var accessUntil time.Time
	for _, a := range accesses {
		if err != nil {
			break
		}
		var exp time.Time
		if exp, err = g.authz.authorize(g.ctx, user, a, classRecheck); err == nil && (accessUntil.IsZero() || exp.Before(accessUntil)) {
			accessUntil = exp
		}
	}

	if revoked := g.settle(user, tokenUntil, accessUntil, err); revoked != nil {
		g.revoke(revoked)
	}
}

// settle records a re-check's outcome and arms the next one; it returns
// the error to revoke the Grant with, if it must be.
func (g *Grant) settle(user *User, tokenUntil, accessUntil time.Time, err error) error {
	now := g.authn.opts.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.checking = false
	switch {
	case g.stopped || g.ctx.Err() != nil:
		return nil
	case err == nil:
		g.user, g.tokenUntil, g.accessUntil, g.failingSince = user, tokenUntil, accessUntil, time.Time{}
	case errors.Is(err, ErrUnavailable) && !errors.Is(err, errGraceSpent):
		if g.failingSince.IsZero() {
			g.failingSince = now
		}
		if now.Sub(g.failingSince) >= g.grace {
			g.stopped = true
			return errorf(ErrUnavailable, "the stream's authorization could not be re-checked for %s (the API server is unreachable): %v", g.grace, err)
		}
		g.authn.log.Warn("a stream's re-check failed; serving on within the grace", "user", g.user.Name, "err", err, "grace", g.grace)
	default: // denied, unauthenticated, or anything else: fail closed
		g.stopped = true
		return err
	}
	g.armLocked(now)
	return nil
}
