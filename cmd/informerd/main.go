// Command informerd is the node-local shared-informer daemon. See
// README.md and docs/ for what it does; `informerd -help` for its flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/daemon"
	"github.com/informerd/informerd/internal/version"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/status"
)

// config is the parsed command line.
type config struct {
	version         bool // -version: print the version and exit
	kubeconfig      string
	socket          string
	listenTCP       string
	metricsAddr     string
	scope           string
	lingerTTL       time.Duration
	logMaxEvents    int
	logMaxBytes     int64
	logMinAge       time.Duration
	upstreamTimeout time.Duration
	keepManaged     bool
	disableWatchLst bool
	kubeAPIQPS      float64
	kubeAPIBurst    int
	enablePprof     bool
	logLevel        slog.Level
	maxObjectBytes  int
	maxInformers    int
	maxPerCaller    int
	maxLogBytesAll  int64
	writeTimeout    time.Duration
	addressRelated  relatedKinds
}

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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	if err := run(ctx, cfg, log); err != nil {
		log.Error("informerd failed", "err", err)
		os.Exit(1)
	}
}

// parseFlags parses and checks the flags; every error names its flag.
func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("informerd", flag.ContinueOnError)
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&c.socket, "socket", "/var/run/informerd/informerd.sock", "Unix socket to serve on (mode 0600); empty: none")
	fs.StringVar(&c.listenTCP, "listen-tcp", "", "loopback TCP address to serve on as well, e.g. 127.0.0.1:7650; empty: none")
	fs.StringVar(&c.metricsAddr, "metrics-address", "127.0.0.1:7651", "address for /metrics, /healthz and /readyz; empty: none")
	fs.StringVar(&c.scope, "scope", string(cache.ScopeAutomatic), "scope strategy for namespaced resources: automatic, cluster or namespace")
	fs.DurationVar(&c.lingerTTL, "linger-ttl", 2*time.Minute, "how long an unused informer keeps running before it is stopped")
	fs.IntVar(&c.logMaxEvents, "log-max-events", 10000, "events each informer's log keeps once they are older than -log-min-age")
	fs.Int64Var(&c.logMaxBytes, "log-max-bytes", 64<<20, "object bytes each informer's log may hold")
	fs.DurationVar(&c.logMinAge, "log-min-age", 30*time.Second, "events younger than this stay in the log past -log-max-events; 0: no floor")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", 2*time.Minute, "bound on each LIST page and on a watch that brings nothing (the API server bookmarks about every minute)")
	fs.BoolVar(&c.keepManaged, "keep-managed-fields", false, "keep metadata.managedFields in served objects")
	fs.BoolVar(&c.disableWatchLst, "disable-watch-list", false, "list with LIST instead of WatchList streaming")
	fs.Float64Var(&c.kubeAPIQPS, "kube-api-qps", 50, "queries per second to the API server for LISTs, access reviews and discovery (watches are not limited)")
	fs.IntVar(&c.kubeAPIBurst, "kube-api-burst", 100, "burst above -kube-api-qps")
	fs.BoolVar(&c.enablePprof, "enable-pprof", false, "serve /debug/pprof/ on -metrics-address")
	fs.IntVar(&c.maxObjectBytes, "max-object-bytes", 8<<20, fmt.Sprintf("objects whose encoding is larger are not served (logged and counted); at most %d", maxObjectLimit))
	fs.IntVar(&c.maxInformers, "max-informers", 512, "informers running at once, lingering ones included; at the limit a new one replaces the least recently used lingering one")
	fs.IntVar(&c.maxPerCaller, "max-informers-per-caller", 64, "distinct informers one caller's streams may hold at once")
	fs.Int64Var(&c.maxLogBytesAll, "max-log-bytes-total", 1<<30, "object bytes all informers' logs may hold together (each also -log-max-bytes)")
	fs.DurationVar(&c.writeTimeout, "stream-write-timeout", time.Minute, "a stream whose client reads nothing for this long is ended (UNAVAILABLE; the client resumes)")
	fs.Var(&c.addressRelated, "address-related", "a related kind for WatchAddress answers, repeatable: RESOURCE.VERSION[.GROUP],selector=PATH[,port=PATH][,field=PATH]...,\n"+
		"for example servers.v1beta3.policy.linkerd.io,selector=spec.podSelector,port=spec.port,field=spec.proxyProtocol")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: informerd takes flags only", fs.Args())
	}
	if c.version {
		return c, nil
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", *level)
	}
	switch cache.ScopeStrategy(c.scope) {
	case cache.ScopeAutomatic, cache.ScopeCluster, cache.ScopeNamespace:
	default:
		return nil, fmt.Errorf("-scope %q: want automatic, cluster or namespace", c.scope)
	}
	if c.socket == "" && c.listenTCP == "" {
		return nil, errors.New("-socket and -listen-tcp are both empty: informerd would serve no one")
	}
	if c.listenTCP != "" {
		if err := checkLoopback(c.listenTCP); err != nil {
			return nil, fmt.Errorf("-listen-tcp %q: %w", c.listenTCP, err)
		}
	}
	if c.lingerTTL <= 0 {
		return nil, fmt.Errorf("-linger-ttl %s: must be positive", c.lingerTTL)
	}
	if c.upstreamTimeout <= 0 {
		return nil, fmt.Errorf("-upstream-timeout %s: must be positive", c.upstreamTimeout)
	}
	if c.logMaxEvents <= 0 {
		return nil, fmt.Errorf("-log-max-events %d: must be positive", c.logMaxEvents)
	}
	if c.logMaxBytes <= 0 {
		return nil, fmt.Errorf("-log-max-bytes %d: must be positive", c.logMaxBytes)
	}
	if c.kubeAPIQPS <= 0 {
		return nil, fmt.Errorf("-kube-api-qps %v: must be positive", c.kubeAPIQPS)
	}
	if c.kubeAPIBurst < 1 {
		return nil, fmt.Errorf("-kube-api-burst %d: must be at least 1", c.kubeAPIBurst)
	}
	if c.enablePprof && c.metricsAddr == "" {
		return nil, errors.New("-enable-pprof needs -metrics-address")
	}
	if c.logMinAge < 0 {
		return nil, fmt.Errorf("-log-min-age %s: must not be negative", c.logMinAge)
	}
	if c.maxObjectBytes <= 0 || c.maxObjectBytes > maxObjectLimit {
		return nil, fmt.Errorf("-max-object-bytes %d: must be between 1 and %d, the most a client accepts", c.maxObjectBytes, maxObjectLimit)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"-max-informers", int64(c.maxInformers)}, {"-max-informers-per-caller", int64(c.maxPerCaller)}, {"-max-log-bytes-total", c.maxLogBytesAll}} {
		if f.v <= 0 {
			return nil, fmt.Errorf("%s %d: must be positive", f.name, f.v)
		}
	}
	if c.writeTimeout <= 0 {
		return nil, fmt.Errorf("-stream-write-timeout %s: must be positive", c.writeTimeout)
	}
	return c, nil
}

// maxObjectLimit is the largest -max-object-bytes: what clients accept.
const maxObjectLimit = informerdv1.MaxMessageBytes - informerdv1.MaxEventOverhead

// checkLoopback accepts host:port where host is a loopback IP or
// "localhost": informerd serves its node only.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return errors.New("not a loopback address: informerd serves local clients only")
	}
	return nil
}

// run serves until ctx ends, then shuts down in this order: stop accepting
// connections, end every stream (clients reconnect elsewhere), wait for the
// handlers, stop the informers.
func run(ctx context.Context, c *config, log *slog.Logger) error {
	restCfg, err := restConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = float32(c.kubeAPIQPS), c.kubeAPIBurst
	reg := prometheus.NewRegistry()
	// The GC metrics include go_gc_heap_live_bytes, the heap the last GC found
	// live: what the informers really hold.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	minAge := c.logMinAge
	if minAge == 0 {
		minAge = -1 // cache.LogLimits: negative is none, zero the default
	}
	mgr, err := cache.NewManager(cache.Options{
		Config: restCfg, Scope: cache.ScopeStrategy(c.scope), LingerTTL: c.lingerTTL,
		Log:               cache.LogLimits{MaxEvents: c.logMaxEvents, MaxBytes: c.logMaxBytes, MinAge: minAge},
		KeepManagedFields: c.keepManaged, DisableWatchList: c.disableWatchLst, UpstreamTimeout: c.upstreamTimeout,
		MaxObjectBytes: c.maxObjectBytes, MaxSources: c.maxInformers, MaxSourcesPerOwner: c.maxPerCaller, MaxLogBytes: c.maxLogBytesAll,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return err
	}
	defer mgr.Close()
	statuses, err := status.New(status.Options{Cache: mgr, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	defer statuses.Close() // after the streams end, before the informers stop
	srv, err := daemon.New(daemon.Options{Cache: mgr, Status: statuses, WriteTimeout: c.writeTimeout, AddressRelated: c.addressRelated, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	gs := grpc.NewServer(daemon.ServerOptions()...)
	informerdv1.RegisterInformerServiceServer(gs, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)

	var listeners []net.Listener
	if c.socket != "" {
		l, err := listenUnix(c.socket)
		if err != nil {
			return fmt.Errorf("-socket %s: %w", c.socket, err)
		}
		listeners = append(listeners, l)
	}
	if c.listenTCP != "" {
		l, err := net.Listen("tcp", c.listenTCP)
		if err != nil {
			return fmt.Errorf("-listen-tcp %s: %w", c.listenTCP, err)
		}
		listeners = append(listeners, l)
	}
	var httpSrv *http.Server
	if c.metricsAddr != "" {
		l, err := net.Listen("tcp", c.metricsAddr)
		if err != nil {
			return fmt.Errorf("-metrics-address %s: %w", c.metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("/readyz", readyz(restCfg))
		if c.enablePprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = httpSrv.Serve(l) }() // ends when Shutdown closes it below
	}

	serveErr := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { serveErr <- gs.Serve(l) }() // each ends when gs stops
		log.Info("serving", "address", l.Addr().String())
	}
	select {
	case <-ctx.Done():
	case err = <-serveErr:
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
	if httpSrv != nil {
		_ = httpSrv.Close()
	}
	return err
}

// readyz answers 200 while the API server answers /version within 2 s:
// informerd serves what it has without it, but cannot start new informers.
func readyz(cfg *rest.Config) http.HandlerFunc {
	kube, clientErr := kubernetes.NewForConfig(cfg)
	return func(w http.ResponseWriter, r *http.Request) {
		err := clientErr
		if err == nil {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			_, err = kube.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
		}
		if err != nil {
			http.Error(w, "API server unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}
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

// listenUnix listens on a Unix socket with mode 0600, replacing a stale
// socket file left by a previous run.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, errors.New("exists and is not a socket")
		}
		if c, err := net.Dial("unix", path); err == nil {
			_ = c.Close()
			return nil, errors.New("another process is serving on it")
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
