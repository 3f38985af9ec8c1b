package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/auth"
)

// readyzInterval is how often the readiness prober asks the API server.
const readyzInterval = 5 * time.Second

// readiness is the API server's reachability as the background prober
// last found it: /readyz answers from it and never calls the API server.
type readiness struct {
	// onRecover, if set, is called when a probe succeeds after one failed.
	onRecover func()
	// heard, if set, returns when an informer last heard from the API
	// server (cache.Manager.UpstreamHeard).
	heard func() time.Time

	// handedOff: the daemon handed its work to a new one (handoff.go).
	handedOff atomic.Bool

	mu      sync.Mutex // guards checked and err
	checked bool
	err     error
}

// run probes every interval until ctx ends.
func (r *readiness) run(ctx context.Context, cfg *rest.Config, interval time.Duration) {
	kube, err := kubernetes.NewForConfig(cfg)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err == nil {
			r.tick(ctx, kube, interval)
		} else {
			r.set(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick probes the API server, unless the last probe reached it and an
// informer has heard from it within interval since: its watches show it is
// there, and a fleet of daemons then costs the API server no probes (5,000
// nodes probing every 5 s would be 1,000 requests a second). An API server
// gone quiet is probed within two intervals; a failing one at every tick.
func (r *readiness) tick(ctx context.Context, kube kubernetes.Interface, interval time.Duration) {
	r.mu.Lock()
	ok := r.checked && r.err == nil
	r.mu.Unlock()
	if ok && r.heard != nil && time.Since(r.heard()) < interval {
		return
	}
	r.probe(ctx, kube)
}

// probe asks the API server for /version, within 2 s.
func (r *readiness) probe(ctx context.Context, kube kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := kube.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
	r.set(err)
}

func (r *readiness) set(err error) {
	r.mu.Lock()
	recovered := r.checked && r.err != nil && err == nil
	r.checked, r.err = true, err
	r.mu.Unlock()
	if recovered && r.onRecover != nil {
		r.onRecover()
	}
}

// ServeHTTP answers 200 while the last probe reached the API server:
// informerd serves what it has without it, but cannot start new informers.
func (r *readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	checked, err := r.checked, r.err
	r.mu.Unlock()
	switch {
	case r.handedOff.Load():
		http.Error(w, "handed off to a new daemon", http.StatusServiceUnavailable)
	case !checked:
		http.Error(w, "the API server has not been probed yet", http.StatusServiceUnavailable)
	case err != nil:
		// Unready, as the rollout of a DaemonSet should wait, but serving:
		// informerd_sources_stale counts the informers serving their last
		// state.
		http.Error(w, "API server unreachable: serving the informers' last state, starting none", http.StatusServiceUnavailable)
	default:
		_, _ = w.Write([]byte("ok\n"))
	}
}

func healthz(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }

// healthHandler serves /healthz and /readyz only, to anyone.
func healthHandler(ready *readiness) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", healthz)
	mux.Handle("/readyz", ready)
	return mux
}

// pprofProfiles are the profiles /debug/pprof/ serves by name.
var pprofProfiles = []string{"allocs", "block", "goroutine", "heap", "mutex", "threadcreate"}

// metricsHandler serves /healthz and /readyz to anyone, and /metrics and,
// if pprof, /debug/pprof/ only to callers authenticated as on the gRPC API
// and allowed a non-resource get on the path (as Kubernetes components
// do). With authn nil (-insecure-local-only, loopback only) it serves them
// to anyone.
func metricsHandler(reg *prometheus.Registry, enablePprof bool, ready *readiness, authn *auth.Authenticator, authz *auth.Authorizer, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", healthz)
	mux.Handle("/readyz", ready)
	guard := func(path string, h http.Handler) http.Handler {
		if authn == nil {
			return h
		}
		return &guarded{path: path, h: h, authn: authn, authz: authz, log: log}
	}
	mux.Handle("/metrics", guard("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	if enablePprof {
		for path, h := range map[string]http.HandlerFunc{
			"/debug/pprof/": pprof.Index, "/debug/pprof/cmdline": pprof.Cmdline, "/debug/pprof/profile": pprof.Profile,
			"/debug/pprof/symbol": pprof.Symbol, "/debug/pprof/trace": pprof.Trace,
		} {
			mux.Handle(path, guard(path, h))
		}
		for _, p := range pprofProfiles {
			path := "/debug/pprof/" + p
			mux.Handle(path, guard(path, pprof.Handler(p)))
		}
	}
	return mux
}

// guarded serves h only to callers allowed get on path.
type guarded struct {
	path  string
	h     http.Handler
	authn *auth.Authenticator
	authz *auth.Authorizer
	log   *slog.Logger
}

func (g *guarded) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The index serves only itself; profiles have their own routes.
	if g.path == "/debug/pprof/" && r.URL.Path != g.path && !slices.Contains(pprofProfiles, strings.TrimPrefix(r.URL.Path, g.path)) {
		http.NotFound(w, r)
		return
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	user, _, err := g.authn.Authenticate(r.Context(), r.Header.Values("Authorization"), auth.Peer{Network: "tcp", IP: host}.Key())
	if err == nil {
		_, err = g.authz.Authorize(r.Context(), user, auth.Attributes{Verb: "get", Path: g.path})
	}
	if err != nil {
		code := http.StatusServiceUnavailable
		switch {
		case errors.Is(err, auth.ErrUnauthenticated):
			code = http.StatusUnauthorized
			w.Header().Set("WWW-Authenticate", `Bearer realm="informerd"`)
		case errors.Is(err, auth.ErrDenied):
			code = http.StatusForbidden
		case errors.Is(err, auth.ErrThrottled):
			code = http.StatusTooManyRequests
		}
		g.log.Debug("HTTP request refused", "path", r.URL.Path, "code", code, "err", err)
		http.Error(w, err.Error(), code)
		return
	}
	g.h.ServeHTTP(w, r)
}
