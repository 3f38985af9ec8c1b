package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/quote"
)

// call is one request's life in the daemon, the same for every RPC that
// reads (Watch, WatchStatus, WatchAddress, Get):
//
//	validate (the handler, before begin; refusals go through reject)
//	authenticate (the interceptors: the caller is on the context; a
//	      stream holds one of its caller's streams, a unary call spends
//	      its caller's share of unary calls, and a Get holds a stream too)
//	authorize (call.authorize: the caller's auth.Grant re-checks it)
//	hold (call.subscribe, call.hold: counted against the caller's
//	      informers, and its rate of new ones, and shown in ListInformers)
//	serve (the handler)
//	end (call.end: the one place that maps what ended it to a status)
//
// A call is used from its handler's goroutine only; its context ends when
// the client leaves, when the daemon shuts down (errShuttingDown) or when
// a re-check revokes the grant (the denial), each as its cause.
type call struct {
	s      *Server
	ctx    context.Context
	cancel context.CancelCauseFunc
	caller *caller
	holder string
	// grant is what the caller was allowed; nil in InsecureLocalOnly mode.
	grant *auth.Grant
	// releases undo the holds, in order.
	releases []func()
	// stopShutdown detaches ctx from the daemon's shutdown.
	stopShutdown func() bool
}

// streamVerbs are what a call does to each resource it reads: the
// informer that serves it lists and watches it.
var streamVerbs = []string{"list", "watch"}

// access is one resource a call reads.
type access struct {
	GVR                          schema.GroupVersionResource
	Namespace                    string // "" for all namespaces or cluster-scoped
	LabelSelector, FieldSelector string // canonical
}

// begin starts the call of the caller the interceptors put on ctx, for the
// client named holder. The handler must end it, with call.end.
func (s *Server) begin(ctx context.Context, holder string) (*call, error) {
	c := callerOf(ctx)
	if c == nil {
		return nil, s.reject(fmt.Errorf("%w: no caller: the request did not pass the daemon's authentication", auth.ErrUnauthenticated))
	}
	cl := &call{s: s, caller: c, holder: holder}
	cl.ctx, cl.cancel = context.WithCancelCause(ctx)
	cl.stopShutdown = context.AfterFunc(s.shutdown, func() { cl.cancel(errShuttingDown) })
	if c.user != nil {
		g, err := auth.NewGrant(cl.ctx, auth.GrantOptions{
			Authenticator: s.opts.Authenticator, Authorizer: s.opts.Authorizer,
			Token: c.token, User: c.user, TokenUntil: c.until,
			Revoke: func(err error) {
				c.log.Info("stream ended by a re-check", "reason", err)
				cl.cancel(err)
			},
		})
		if err != nil {
			cl.close()
			return nil, s.reject(err)
		}
		cl.grant = g
	}
	return cl, nil
}

// log returns the call's logger.
func (c *call) log() *slog.Logger { return c.caller.log.With("client", c.holder) }

// authorize checks that the caller may list and watch every access, and
// adds them to what its grant re-checks. A sensitive resource is refused
// unless the operator opted in to it, in every mode.
func (c *call) authorize(accesses ...access) error {
	for _, a := range accesses {
		if err := c.s.checkSensitive(a.GVR.GroupResource()); err != nil {
			return err
		}
	}
	if c.grant == nil { // InsecureLocalOnly: the daemon's own permissions
		return nil
	}
	attrs := make([]auth.Attributes, 0, len(accesses)*len(streamVerbs))
	for _, a := range accesses {
		for _, verb := range streamVerbs {
			attrs = append(attrs, auth.Attributes{
				Verb: verb, Resource: a.GVR, Namespace: a.Namespace,
				LabelSelector: a.LabelSelector, FieldSelector: a.FieldSelector,
			})
		}
	}
	return c.grant.Add(c.ctx, attrs...)
}

// resolve sets req to the canonical name of the resource it names (so
// that what is authorized is what the cache will read) and to the caller
// as its owner, and authorizes the caller for it with labelSelector.
// A namespace on a cluster-scoped resource is refused, as the API server
// refuses the path.
func (c *call) resolve(req *cache.Request, labelSelector string) error {
	gvr, namespaced, err := c.s.opts.Cache.ResolveResource(c.ctx, *req)
	if err != nil {
		return err
	}
	if !namespaced && req.Namespace != "" {
		return fmt.Errorf("%w: %s is cluster-scoped: it has no namespace %s (the API server answers 404 Not Found for it); leave the namespace empty",
			errClusterScoped, gvr.GroupResource(), quote.String(req.Namespace))
	}
	req.GVR, req.Kind, req.Owner, req.Holder, req.AdmitNew = gvr, "", c.caller.name, c.holder, c.admitNewInformer
	return c.authorize(access{GVR: gvr, Namespace: req.Namespace, LabelSelector: labelSelector, FieldSelector: req.FieldSelector})
}

// subscribe resolves and authorizes req, subscribes to it and registers
// the hold. The caller closes the Subscription.
func (c *call) subscribe(req cache.Request, labelSelector string) (*cache.Subscription, error) {
	if err := c.resolve(&req, labelSelector); err != nil {
		return nil, err
	}
	sub, err := c.s.opts.Cache.Subscribe(c.ctx, req)
	if err != nil {
		return nil, err
	}
	if sub.Key().GVR.GroupResource() != req.GVR.GroupResource() { // discovery changed in between
		sub.Close()
		return nil, fmt.Errorf("%w: %s now names %s: retry", cache.ErrNotSynced, req.GVR.GroupResource(), sub.Key().GVR.GroupResource())
	}
	c.register(sub.Key)
	return sub, nil
}

// hold authorizes the caller for a and holds the informer that serves it,
// for a component (status, address) that reads it on the caller's behalf:
// the informer counts against the caller's limit and shows as its own.
func (c *call) hold(a access) error {
	if err := c.authorize(a); err != nil {
		return err
	}
	held, err := c.s.opts.Cache.Hold(c.ctx, cache.Request{GVR: a.GVR, Namespace: a.Namespace, Owner: c.caller.name, Holder: c.holder, AdmitNew: c.admitNewInformer})
	if err != nil {
		return err
	}
	c.releases = append(c.releases, held.Release)
	c.register(held.Key)
	return nil
}

// admitNewInformer spends one of the caller's new informers
// (Limits.NewInformersPerMinute), or refuses with the delay until it has
// one. The cache calls it before it starts an informer for the caller,
// and before it stops a lingering one to make room for it.
func (c *call) admitNewInformer() error {
	retry := c.s.newInformers.allow(c.caller.name, time.Now())
	if retry == 0 {
		return nil
	}
	c.s.metrics.newInformersRefused.Inc()
	l := c.s.opts.Limits
	return retryAfter(retry, fmt.Errorf("%w: %s starts informers faster than its share (-new-informers-per-minute %g, -new-informer-burst %d): retry after %s (a request that an informer already running serves costs none)",
		errLimit, c.caller.name, l.NewInformersPerMinute, l.NewInformerBurst, retry.Round(time.Millisecond)))
}

// register shows the call as a holder of the informer key names (which
// may change: cache.Subscription.Key) in ListInformers until it ends.
func (c *call) register(key func() cache.Key) {
	c.releases = append(c.releases, c.s.holds.add(&hold{caller: c.caller, client: c.holder, key: key}))
}

// end ends the call and maps the error that ended it, telling a shutdown
// and a re-check's verdict apart from the client leaving; it counts and
// logs it with the caller (at debug level). It returns nil for nil.
func (c *call) end(err error) error {
	if err != nil && c.ctx.Err() != nil {
		if cause := context.Cause(c.ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause // shutdown, or a re-check's verdict
		}
	}
	c.close()
	if err == nil {
		return nil
	}
	st := toStatus(err)
	c.s.metrics.requestErrors.WithLabelValues(status.Code(st).String()).Inc()
	c.caller.log.Debug("request ended", "client", c.holder, "code", status.Code(st).String(), "err", status.Convert(st).Message())
	return st
}

// close releases what the call holds and stops its grant.
func (c *call) close() {
	for _, r := range slices.Backward(c.releases) {
		r()
	}
	c.releases = nil
	if c.grant != nil {
		c.grant.Stop()
	}
	c.stopShutdown()
	c.cancel(nil)
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
