// Command informerd is the node-local shared-informer daemon. See
// README.md and docs/ for what it does; `informerd -help` for its flags.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/daemon"
	"github.com/informerd/informerd/internal/version"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/status"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "informerd:", err)
		os.Exit(2)
	}
	if cfg.version {
		fmt.Println(version.Version)
		return
	}
	if o := cfg.prepareSocketDir; o != nil {
		err := prepareSocketDir(filepath.Dir(cfg.socket), *o, 0o755)
		if err == nil && cfg.handoffSocket != "" {
			err = prepareSocketDir(filepath.Dir(cfg.handoffSocket), *o, 0o700)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "informerd: -prepare-socket-dir:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := newLogger(os.Stderr, cfg.logFormat, cfg.logLevel)
	if err := run(ctx, cfg, log); err != nil {
		log.Error("informerd failed", "err", err)
		os.Exit(1)
	}
}

// newLogger returns the daemon's logger, writing to w in format (text or
// json, as parseFlags checked) at level.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	o := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

// run serves until ctx ends, then shuts down in this order: stop accepting
// connections, end every stream (clients reconnect elsewhere), wait for the
// handlers, stop the informers.
func run(ctx context.Context, c *config, log *slog.Logger) error {
	restCfg, err := restConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	// One budget for every client built from restCfg (the cache's LISTs,
	// access reviews and discovery): a RateLimiter set in a rest.Config is
	// shared by its copies, where QPS and Burst would make one per client.
	restCfg.QPS, restCfg.Burst = float32(c.kubeAPIQPS), c.kubeAPIBurst
	restCfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(restCfg.QPS, restCfg.Burst)
	mem := readMemoryLimits()
	mem.apply()
	if c.maxLogBytesAll == 0 {
		c.maxLogBytesAll = mem.logBytes()
	}
	log.Info("memory limits", "container-limit", mem.container, "go-memory-limit", mem.goLimit, "from", mem.source(), "max-log-bytes-total", c.maxLogBytesAll)
	if mem.tight() {
		log.Warn("GOMEMLIMIT leaves less than 1/8 of the container's memory limit to what the Go runtime does not count: the container may be OOM-killed before the runtime collects harder; set it to 7/8 of the limit or less", "GOMEMLIMIT", mem.goLimit, "container-limit", mem.container)
	}
	reg := prometheus.NewRegistry()
	// The GC metrics include go_gc_heap_live_bytes, the heap the last GC found
	// live: what the informers really hold.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// A daemon that takes over from another (handoff.go) reads what it
	// hands over before it starts anything, so that the old one is frozen
	// for as short a time as possible.
	in := &inherited{}
	if c.handoffSocket != "" {
		in = takeOver(c.handoffSocket, c.handoffTimeout, c.maxObjectBytes, log)
	}
	defer in.finish(false) // unless it served what it took
	minAge := c.logMinAge
	if minAge == 0 {
		minAge = -1 // cache.LogLimits: negative is none, zero the default
	}
	mgr, err := cache.NewManager(cache.Options{
		Config: restCfg, Scope: cache.ScopeStrategy(c.scope), ClusterAt: c.scopeClusterAt, LingerTTL: c.lingerTTL,
		Log:                cache.LogLimits{MaxEvents: c.logMaxEvents, MaxBytes: c.logMaxBytes, MinAge: minAge},
		StripManagedFields: c.stripManaged, DisableWatchList: c.disableWatchLst, UpstreamTimeout: c.upstreamTimeout,
		RecoveryWindow: c.recoveryWindow, Discovery: in.discovery,
		MaxObjectBytes: c.maxObjectBytes, MaxSources: c.maxInformers, MaxSourcesPerOwner: c.maxPerCaller, MaxLogBytes: c.maxLogBytesAll,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return err
	}
	defer mgr.Close()
	restored := false
	if in.states != nil {
		n, err := mgr.Restore(in.states)
		if err != nil {
			log.Warn("handoff: the informers handed over could not be restored: starting them cold (listing each)", "err", err)
		} else {
			log.Info("handoff: serving the informers handed over, each resuming its watch from its position", "informers", n)
			restored = true
		}
		in.states = nil
	}
	statuses, err := status.New(status.Options{Cache: mgr, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	defer statuses.Close() // after the streams end, before the informers stop
	opts := daemon.Options{
		Cache: mgr, Status: statuses, AddressRelated: c.addressRelated,
		WriteTimeout: c.writeTimeout, Logger: log, Registerer: reg, Limits: c.limits,
		InsecureLocalOnly: c.insecureLocalOnly, AllowedUIDs: c.allowedUIDs,
		Sensitive: c.sensitive, ServeSensitive: c.serveSensitive,
	}
	if c.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return fmt.Errorf("-tls-cert-file, -tls-key-file: %w", err)
		}
		opts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if c.insecureLocalOnly {
		log.Warn("INSECURE: -insecure-local-only serves every caller on the socket without a token, with informerd's own permissions; for development only", "socket", c.socket)
	} else {
		if opts.Authenticator, opts.Authorizer, err = reviewers(restCfg, c, log, reg); err != nil {
			return err
		}
		if in.remembered != nil {
			tokens, accesses := auth.Import(*in.remembered, opts.Authenticator, opts.Authorizer)
			log.Info("handoff: trusting the callers the old daemon verified, until their verifications expire", "tokens", tokens, "accesses", accesses)
			in.remembered = nil
		}
		if c.nodeName == "" {
			log.Warn("-node-name is empty: tokens bound to pods on other nodes are accepted")
		}
	}
	srv, err := daemon.New(opts)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	informerdv1.RegisterInformerServiceServer(gs, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)

	var listeners []net.Listener
	var unixL *unixListener
	switch {
	case in.ln != nil:
		unixL = inheritedListener(in.ln, c.socket)
	case c.socket != "":
		mode := os.FileMode(0o666) // every caller authenticates with its token
		if c.insecureLocalOnly {
			mode = 0o600 // only the daemon's own user
		}
		// With a handoff socket, a daemon still serving here is being
		// replaced: take the path over from it.
		unixL, err = listenUnix(c.socket, mode, c.handoffSocket != "")
		if err != nil {
			return fmt.Errorf("-socket %s: %w", c.socket, err)
		}
	}
	if unixL != nil {
		listeners = append(listeners, srv.Listen(unixL))
	}
	if c.listenTCP != "" {
		l, err := net.Listen("tcp", c.listenTCP)
		if err != nil {
			return fmt.Errorf("-listen-tcp %s: %w", c.listenTCP, err)
		}
		listeners = append(listeners, srv.Listen(l))
	}

	// The readiness prober asks the API server in the background, and only
	// when no informer has heard from it lately: /readyz never costs it a
	// request.
	ready := &readiness{heard: mgr.UpstreamHeard}
	if c.recoveryWindow > 0 {
		ready.onRecover = mgr.UpstreamRecovered
	}
	probeCtx, stopProbe := context.WithCancel(ctx)
	var probing sync.WaitGroup
	probing.Add(1)
	go func() { defer probing.Done(); ready.run(probeCtx, restCfg, readyzInterval) }()
	defer func() { stopProbe(); probing.Wait() }()

	var httpSrvs []*http.Server
	serveHTTP := func(flag, addr string, h http.Handler, tlsCfg *tls.Config) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s %s: %w", flag, addr, err)
		}
		if tlsCfg != nil {
			l = tls.NewListener(l, tlsCfg)
		}
		hsrv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: c.limits.MaxHeaderBytes}
		httpSrvs = append(httpSrvs, hsrv)
		go func() { _ = hsrv.Serve(l) }() // ends when Close closes it below
		return nil
	}
	if c.metricsAddr != "" {
		var tlsCfg *tls.Config
		if loopback, _ := isLoopback(c.metricsAddr); !loopback {
			tlsCfg = opts.TLS
		}
		h := metricsHandler(reg, c.enablePprof, ready, opts.Authenticator, opts.Authorizer, log)
		if err := serveHTTP("-metrics-address", c.metricsAddr, h, tlsCfg); err != nil {
			return err
		}
	}
	if c.healthAddr != "" {
		if err := serveHTTP("-health-address", c.healthAddr, healthHandler(ready), nil); err != nil {
			return err
		}
	}

	serveErr := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { serveErr <- gs.Serve(l) }() // each ends when gs stops
		log.Info("serving", "address", l.Addr().String(), "authentication", !c.insecureLocalOnly)
	}
	// The handoff socket is this daemon's before it answers the old one,
	// which ends its streams on "ok": a daemon that cannot serve it fails
	// first, and the old one serves on.
	var handedOff <-chan struct{}
	if c.handoffSocket != "" {
		ho, err := serveHandoff(c.handoffSocket, unixL, mgr, opts.Authenticator, opts.Authorizer, c.handoffTimeout, log)
		if err != nil {
			return fmt.Errorf("-handoff-socket %s: %w", c.handoffSocket, err)
		}
		defer ho.Close()
		handedOff = ho.handedOff
	}
	in.finish(restored)
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	case <-handedOff:
		log.Info("handed off: ending the streams, whose clients resume on the new daemon; idling until stopped")
		ready.handedOff.Store(true)
		hs.Shutdown()
		// Each subscriber takes the handoff's Bookmark before its stream
		// ends, so that it resumes from it.
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		drain(dctx, mgr)
		cancel()
	}
	log.Info("shutting down")
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }() // stops accepting at once
	srv.Shutdown()                                    // ends the streams
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		gs.Stop()
		<-stopped
	}
	if ready.handedOff.Load() {
		// Its informers are frozen and cost the API server nothing; they
		// stop, in the order of docs/semantics.md, when the kubelet stops
		// the daemon. /healthz and /readyz answer until then.
		<-ctx.Done()
	}
	for _, h := range httpSrvs {
		_ = h.Close()
	}
	return err
}

// reviewers returns the Authenticator and Authorizer, on a client of their
// own so that reviews and the informers' requests never wait for each
// other's rate limit.
func reviewers(restCfg *rest.Config, c *config, log *slog.Logger, reg prometheus.Registerer) (*auth.Authenticator, *auth.Authorizer, error) {
	cfg := rest.CopyConfig(restCfg)
	cfg.QPS, cfg.Burst, cfg.RateLimiter = float32(c.reviewQPS), c.reviewBurst, nil // a budget of its own
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	authn, err := auth.NewAuthenticator(auth.AuthenticatorOptions{
		Reviews: kube.AuthenticationV1().TokenReviews(), Audience: c.tokenAudience, NodeName: c.nodeName,
		CacheTTL: c.tokenCacheTTL, NegativeTTL: c.tokenRejectTTL,
		ReviewOptions:       auth.ReviewOptions{ReviewsPerSecond: c.tokenReviewRate, ReviewBurst: c.tokenReviewBurst, Logger: log, Registerer: reg},
		MaxPendingPerSource: c.tokenReviewsPending,
	})
	if err != nil {
		return nil, nil, err
	}
	authz, err := auth.NewAuthorizer(auth.AuthorizerOptions{
		Reviews: kube.AuthorizationV1().SubjectAccessReviews(), AllowTTL: c.allowTTL, DenyTTL: c.denyTTL,
		ReviewOptions: auth.ReviewOptions{ReviewsPerSecond: c.accessReviewRate, ReviewBurst: c.accessReviewBurst, Logger: log, Registerer: reg},
	})
	return authn, authz, err
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("-kubeconfig is empty and in-cluster configuration failed: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("-kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// listenUnix listens on a Unix socket with mode, replacing a stale socket
// file left by a previous run. The socket never exists at path with
// another mode: it is created in a private directory (0700, beside path,
// so that only the daemon's user reaches it there), given its mode, and
// linked into place, which fails if anything has appeared at path
// meanwhile. Its directory is made world-searchable so that client pods
// that mount it reach the socket. Closing the listener removes the socket.
//
// With replace, a daemon serving at path is replaced rather than refused:
// the socket is renamed over path, and the old daemon serves its open
// connections until it stops (a surge upgrade whose old daemon handed
// nothing over).
func listenUnix(path string, mode os.FileMode, replace bool) (*unixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, errors.New("exists and is not a socket")
		}
		if c, err := net.Dial("unix", path); err == nil {
			_ = c.Close()
			if !replace {
				return nil, errors.New("another process is serving on it")
			}
		} else if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	private, err := os.MkdirTemp(dir, ".s")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(private) // the socket's first name, and the socket if linking failed
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(private, "s"), Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false) // its first name is gone; unixListener removes path
	first := l.Addr().String()
	if err = os.Chmod(first, mode); err == nil {
		if replace {
			err = os.Rename(first, path) // atomic: the path always answers
		} else {
			err = os.Link(first, path)
		}
	}
	var fi os.FileInfo
	if err == nil {
		fi, err = os.Stat(path)
	}
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	return &unixListener{UnixListener: l, path: path, fi: fi}, nil
}

// inheritedListener is l, a listening socket handed over by the daemon
// this one replaces, which serves at path.
func inheritedListener(l *net.UnixListener, path string) *unixListener {
	fi, _ := os.Stat(path)
	return &unixListener{UnixListener: l, path: path, fi: fi}
}

// unixListener is a Unix socket listener linked to path after it was
// created (see listenUnix), or handed over: its address is path, and
// Close removes path if it is still this socket's and was not handed over.
type unixListener struct {
	*net.UnixListener
	path string
	fi   os.FileInfo // path's, once it was this socket's
	// keep: the socket was handed to another daemon, which serves at path.
	keep atomic.Bool
	once sync.Once
}

func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, err := os.Stat(l.path); err == nil && l.fi != nil && os.SameFile(fi, l.fi) && !l.keep.Load() {
			_ = os.Remove(l.path)
		}
	})
	return err
}
