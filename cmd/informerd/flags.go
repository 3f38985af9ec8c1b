package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/daemon"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
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
	scopeClusterAt  int
	logMaxEvents    int
	logMaxBytes     int64
	logMinAge       time.Duration
	upstreamTimeout time.Duration
	recoveryWindow  time.Duration
	// prepareSocketDir is -prepare-socket-dir's owner, if set.
	prepareSocketDir *owner
	stripManaged     bool
	disableWatchLst  bool
	kubeAPIQPS       float64
	kubeAPIBurst     int
	enablePprof      bool
	logLevel         slog.Level
	logFormat        string // text or json
	maxObjectBytes   int
	maxInformers     int
	maxPerCaller     int
	maxLogBytesAll   int64
	writeTimeout     time.Duration
	addressRelated   relatedKinds
	// handoffSocket and handoffTimeout are -handoff-socket and
	// -handoff-timeout (handoff.go).
	handoffSocket  string
	handoffTimeout time.Duration

	// Security.
	nodeName          string
	tokenAudience     string
	insecureLocalOnly bool
	allowedUIDs       []uint32
	tlsCert, tlsKey   string
	healthAddr        string
	tokenCacheTTL     time.Duration
	tokenRejectTTL    time.Duration
	allowTTL, denyTTL time.Duration
	tokenReviewRate   float64
	tokenReviewBurst  int
	// tokenReviewsPending is -token-reviews-pending-per-peer.
	tokenReviewsPending int
	accessReviewRate    float64
	accessReviewBurst   int
	reviewQPS           float64
	reviewBurst         int
	sensitive           []schema.GroupResource
	serveSensitive      []schema.GroupResource
	limits              daemon.Limits
}

// parseFlags parses and checks the flags; every error names its flag.
func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("informerd", flag.ContinueOnError)
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&c.socket, "socket", "/var/run/informerd/informerd.sock", "Unix socket to serve on (mode 0666: every caller presents a token; 0600 with -insecure-local-only); empty: none")
	fs.StringVar(&c.listenTCP, "listen-tcp", "", "loopback TCP address to serve on as well, e.g. 127.0.0.1:7650; empty: none")
	fs.StringVar(&c.metricsAddr, "metrics-address", "127.0.0.1:7651", "address for /metrics, /healthz and /readyz; empty: none")
	fs.StringVar(&c.scope, "scope", string(cache.ScopeAutomatic), "scope strategy for namespaced resources: automatic, cluster or namespace")
	fs.IntVar(&c.scopeClusterAt, "scope-cluster-at", 8, "with -scope=automatic, the number of namespaces of a resource this node's clients ask for at which one cluster-wide informer replaces the informers per namespace (back to them once at most half as many are asked for, for -linger-ttl)")
	fs.DurationVar(&c.lingerTTL, "linger-ttl", 2*time.Minute, "how long an unused informer keeps running before it is stopped")
	fs.IntVar(&c.logMaxEvents, "log-max-events", 10000, "events each informer's log keeps once they are older than -log-min-age")
	fs.Int64Var(&c.logMaxBytes, "log-max-bytes", 64<<20, "object bytes each informer's log may hold")
	fs.DurationVar(&c.logMinAge, "log-min-age", 30*time.Second, "events younger than this stay in the log past -log-max-events; 0: no floor")
	fs.DurationVar(&c.recoveryWindow, "recovery-window", 10*time.Second, "when the API server answers again after failing, informers waiting to retry it do so after a random delay within this window, instead of after their backoff (up to 30 s): size it so that nodes x informers per node / window is a re-list rate the API server can take (docs/scale.md); 0: off, each informer waits out its own backoff as client-go's reflector does")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", 2*time.Minute, "bound on each LIST page and on a watch that brings nothing (the API server bookmarks about every minute)")
	fs.BoolVar(&c.stripManaged, "strip-managed-fields", false, "remove metadata.managedFields from stored and served objects (by default they are served as the API server sends them)")
	fs.BoolVar(&c.disableWatchLst, "disable-watch-list", false, "list with LIST instead of WatchList streaming")
	fs.Float64Var(&c.kubeAPIQPS, "kube-api-qps", 50, "queries per second to the API server for LISTs, the daemon's own access reviews and discovery, one budget for all of them (watches, WatchList streams included, are not limited; TokenReviews and SubjectAccessReviews have -review-qps)")
	fs.IntVar(&c.kubeAPIBurst, "kube-api-burst", 100, "burst above -kube-api-qps")
	fs.BoolVar(&c.enablePprof, "enable-pprof", false, "serve /debug/pprof/ on -metrics-address")
	fs.IntVar(&c.maxObjectBytes, "max-object-bytes", 8<<20, fmt.Sprintf("objects whose encoding is larger are not served (logged and counted); at most %d", maxObjectLimit))
	fs.IntVar(&c.maxInformers, "max-informers", 512, "informers running at once, lingering ones included; at the limit a new one replaces the least recently used lingering one")
	fs.IntVar(&c.maxPerCaller, "max-informers-per-caller", 64, "distinct informers one caller's streams may hold at once")
	fs.Int64Var(&c.maxLogBytesAll, "max-log-bytes-total", 0, "object bytes all informers' logs may hold together (each also -log-max-bytes); 0: a quarter of the Go memory limit (GOMEMLIMIT, else 7/8 of the container's memory limit, which the daemon then sets as the Go limit), or 1 GiB without one")
	fs.DurationVar(&c.writeTimeout, "stream-write-timeout", time.Minute, "a stream whose client reads nothing for this long is ended (UNAVAILABLE; the client resumes)")
	fs.Var(&c.addressRelated, "address-related", "a related kind for WatchAddress answers, repeatable: RESOURCE.VERSION[.GROUP],selector=PATH[,port=PATH][,field=PATH]...,\n"+
		"for example servers.v1beta3.policy.linkerd.io,selector=spec.podSelector,port=spec.port,field=spec.proxyProtocol")
	fs.StringVar(&c.handoffSocket, "handoff-socket", "", "Unix socket (mode 0600) of the hot handoff: a daemon started while another serves it takes over the listening -socket and every synced informer from it, without a LIST (docs/operations.md); keep it in a directory clients do not mount; empty: off")
	fs.DurationVar(&c.handoffTimeout, "handoff-timeout", 15*time.Second, "bound on a whole handoff: a slower one starts the new daemon cold and the old one serves on")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text (logfmt key=value) or json (one JSON object per line); a stream's lines carry its stream id and caller")

	fs.StringVar(&c.nodeName, "node-name", "", "the node this daemon serves (the downward API's spec.nodeName): tokens bound to a pod on another node are refused; empty: no node check")
	fs.StringVar(&c.tokenAudience, "token-audience", auth.DefaultAudience, "audience a caller's token must be issued for")
	fs.BoolVar(&c.insecureLocalOnly, "insecure-local-only", false, "DEVELOPMENT ONLY: serve callers without tokens, with the daemon's own permissions, on a 0600 Unix socket (no -listen-tcp)")
	prepare := fs.String("prepare-socket-dir", "", "UID:GID: create the directory of -socket, owned by UID:GID with mode 0755 (and that of -handoff-socket, if set, with mode 0700), and exit, so that the daemon can run as that user: run it once as root with the CHOWN capability only (the DaemonSet's init container)")
	uids := fs.String("allowed-uids", "", "comma-separated uids: if set, only Unix socket callers with one of these uids (SO_PEERCRED) are served, in addition to their token")
	fs.StringVar(&c.tlsCert, "tls-cert-file", "", "PEM certificate for -listen-tcp and -metrics-address (required when either is not loopback)")
	fs.StringVar(&c.tlsKey, "tls-key-file", "", "PEM private key of -tls-cert-file")
	fs.StringVar(&c.healthAddr, "health-address", "", "address for plain-HTTP /healthz and /readyz only (for kubelet probes); empty: none (they are on -metrics-address too)")
	fs.DurationVar(&c.tokenCacheTTL, "token-cache-ttl", time.Minute, "how long a verified token is remembered (never past its expiry)")
	fs.DurationVar(&c.tokenRejectTTL, "token-rejection-ttl", 10*time.Second, "how long a rejected token is remembered")
	fs.DurationVar(&c.allowTTL, "authz-allow-ttl", 5*time.Minute, "how long an allowed access is remembered; open streams are checked again after it")
	fs.DurationVar(&c.denyTTL, "authz-deny-ttl", 30*time.Second, "how long a denied access is remembered")
	fs.Float64Var(&c.tokenReviewRate, "token-reviews-per-second", 20, "TokenReviews per second for tokens informerd has not seen, from all peers together, shared fairly (see -token-reviews-pending-per-peer); re-checks of open streams and rotated tokens of known ServiceAccounts are not counted")
	fs.IntVar(&c.tokenReviewBurst, "token-review-burst", 100, "burst above -token-reviews-per-second")
	fs.IntVar(&c.tokenReviewsPending, "token-reviews-pending-per-peer", 4, "new tokens one peer (a uid; over TCP an IPv4 address, an IPv6 /64, or all of loopback) may have waiting for -token-reviews-per-second at once; more are refused with RESOURCE_EXHAUSTED")
	fs.Float64Var(&c.accessReviewRate, "access-reviews-per-second", 20, "SubjectAccessReviews per second that new checks not in the cache may cause, per caller; re-checks of open streams are not counted")
	fs.IntVar(&c.accessReviewBurst, "access-review-burst", 100, "burst above -access-reviews-per-second")
	fs.Float64Var(&c.reviewQPS, "review-qps", 100, "queries per second to the API server for TokenReviews and SubjectAccessReviews, apart from -kube-api-qps")
	fs.IntVar(&c.reviewBurst, "review-burst", 200, "burst above -review-qps")
	sensitive := fs.String("sensitive-resources", "", "comma-separated resource[.group] refused like secrets unless in -serve-sensitive, e.g. certificatesigningrequests.certificates.k8s.io")
	serveSensitive := fs.String("serve-sensitive", "", "comma-separated sensitive resource[.group] to serve anyway (callers still need RBAC), e.g. secrets")
	l := &c.limits
	fs.IntVar(&l.MaxStreamsPerCaller, "max-streams-per-caller", 512, "open streams per caller (user), on all its connections")
	fs.IntVar(&l.MaxRequestBytes, "max-request-bytes", 64<<10, "size of a request message, of every method (client/statuswatcher sends parts of 32 KiB)")
	fs.IntVar(&l.MaxStatusObjectsPerCaller, "max-status-objects-per-caller", 100000, "objects of all the open status streams of one caller (at least 20000, one request's limit)")
	fs.IntVar(&l.MaxSelectorBytes, "max-selector-bytes", 4<<10, "length of each selector of a request")
	fs.IntVar(&l.MaxHeaderBytes, "max-header-bytes", 16<<10, "size of a request's metadata, its token included")
	fs.IntVar(&l.MaxStreamsPerConnection, "max-streams-per-connection", 256, "concurrent streams on one connection (more wait)")
	fs.IntVar(&l.MaxConnections, "max-connections", 2048, "open connections in all (beyond, a new one displaces an unauthenticated one, or is closed at once)")
	fs.IntVar(&l.MaxConnectionsPerPeer, "max-connections-per-peer", 512, "open connections of one peer: a uid on the Unix socket; over TCP an IPv4 address, an IPv6 /64, or all of loopback")
	fs.IntVar(&l.MaxUnauthenticatedConnections, "max-unauthenticated-connections", 0, "open connections on which no call has passed authentication yet, of all peers (at most -max-connections); beyond, a new one displaces the oldest of the peer with the most; 0: -max-connections/4")
	fs.DurationVar(&l.ConnectionTimeout, "connection-timeout", 10*time.Second, "time a new connection has for its TLS handshake and HTTP/2 preface, and to make a call that passes authentication (else it is closed)")
	fs.DurationVar(&l.MaxConnectionIdle, "max-connection-idle", 5*time.Minute, "a connection without streams for this long is closed (clients reconnect when they need to)")
	fs.DurationVar(&l.KeepaliveMinTime, "keepalive-min-time", 20*time.Second, "shortest interval at which a client may send keepalive pings; more often closes its connection")
	fs.Float64Var(&l.UnaryCallsPerSecond, "unary-calls-per-second", 100, "unary calls (Get, GetDiscovery, ListInformers, Version; not the health Check) per second per caller (user); beyond, and -unary-call-burst, a call waits up to -unary-call-max-wait, then gets RESOURCE_EXHAUSTED with a retry delay, which the client library waits")
	fs.IntVar(&l.UnaryCallBurst, "unary-call-burst", 200, "burst above -unary-calls-per-second")
	fs.IntVar(&l.UnaryCallsInFlightPerCaller, "unary-calls-in-flight-per-caller", 64, "unary calls one caller may have in flight (waiting for a token or for an informer included); more get RESOURCE_EXHAUSTED with a retry delay")
	fs.DurationVar(&l.UnaryCallMaxWait, "unary-call-max-wait", 500*time.Millisecond, "longest a unary call waits for its caller's next token, and then for a seat (-unary-calls-in-flight), before it is refused with a retry delay")
	fs.IntVar(&l.UnaryCallsInFlight, "unary-calls-in-flight", 32, "unary calls the daemon runs at once, of all callers; one caller holds at most a quarter of them, and callers waiting for one are served in turn")
	fs.Float64Var(&l.NewInformersPerMinute, "new-informers-per-minute", 60, "informers one caller's requests may start per minute (a request served by a running or lingering informer starts none); beyond, and -new-informer-burst, RESOURCE_EXHAUSTED with a retry delay, and no lingering informer is stopped for it")
	fs.IntVar(&l.NewInformerBurst, "new-informer-burst", 32, "burst above -new-informers-per-minute")
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
	if c.logFormat != "text" && c.logFormat != "json" {
		return nil, fmt.Errorf("-log-format %q: want text or json", c.logFormat)
	}
	switch cache.ScopeStrategy(c.scope) {
	case cache.ScopeAutomatic, cache.ScopeCluster, cache.ScopeNamespace:
	default:
		return nil, fmt.Errorf("-scope %q: want automatic, cluster or namespace", c.scope)
	}
	if c.scopeClusterAt < 1 {
		return nil, fmt.Errorf("-scope-cluster-at %d: must be at least 1 (1 watches every resource cluster-wide)", c.scopeClusterAt)
	}
	if *prepare != "" {
		o, err := parseOwner(*prepare)
		if err != nil {
			return nil, fmt.Errorf("-prepare-socket-dir %q: %w", *prepare, err)
		}
		if c.socket == "" {
			return nil, errors.New("-prepare-socket-dir needs -socket")
		}
		c.prepareSocketDir = &o
	}
	if c.socket == "" && c.listenTCP == "" {
		return nil, errors.New("-socket and -listen-tcp are both empty: informerd would serve no one")
	}
	if c.handoffSocket != "" {
		switch {
		case c.socket == "":
			return nil, errors.New("-handoff-socket needs -socket: it hands over the Unix socket's listener")
		case filepath.Dir(c.handoffSocket) == filepath.Dir(c.socket):
			return nil, fmt.Errorf("-handoff-socket %q is in -socket's directory, which clients mount: give it a directory of its own", c.handoffSocket)
		case c.handoffTimeout <= 0:
			return nil, fmt.Errorf("-handoff-timeout %s: must be positive", c.handoffTimeout)
		}
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return nil, errors.New("-tls-cert-file and -tls-key-file go together")
	}
	for _, a := range []struct{ flag, addr string }{{"-listen-tcp", c.listenTCP}, {"-metrics-address", c.metricsAddr}} {
		if a.addr == "" {
			continue
		}
		loopback, err := isLoopback(a.addr)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", a.flag, a.addr, err)
		}
		if !loopback && c.tlsCert == "" {
			return nil, fmt.Errorf("%s %q is not a loopback address: callers' tokens would cross the network in the clear; set -tls-cert-file and -tls-key-file", a.flag, a.addr)
		}
		if !loopback && c.insecureLocalOnly {
			return nil, fmt.Errorf("%s %q: -insecure-local-only serves loopback and the Unix socket only", a.flag, a.addr)
		}
	}
	if c.insecureLocalOnly && c.listenTCP != "" {
		return nil, errors.New("-insecure-local-only is allowed on the Unix socket only: remove -listen-tcp")
	}
	if c.healthAddr != "" {
		if _, _, err := net.SplitHostPort(c.healthAddr); err != nil {
			return nil, fmt.Errorf("-health-address %q: %w", c.healthAddr, err)
		}
	}
	if *uids != "" {
		for _, u := range strings.Split(*uids, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(u), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("-allowed-uids %q: %q is not a uid", *uids, u)
			}
			c.allowedUIDs = append(c.allowedUIDs, uint32(n))
		}
	}
	var err error
	if c.sensitive, err = parseGroupResources(*sensitive); err != nil {
		return nil, fmt.Errorf("-sensitive-resources: %w", err)
	}
	if c.serveSensitive, err = parseGroupResources(*serveSensitive); err != nil {
		return nil, fmt.Errorf("-serve-sensitive: %w", err)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"-token-cache-ttl", c.tokenCacheTTL}, {"-token-rejection-ttl", c.tokenRejectTTL}, {"-authz-allow-ttl", c.allowTTL}, {"-authz-deny-ttl", c.denyTTL},
		{"-connection-timeout", l.ConnectionTimeout}, {"-max-connection-idle", l.MaxConnectionIdle}, {"-keepalive-min-time", l.KeepaliveMinTime},
		{"-unary-call-max-wait", l.UnaryCallMaxWait}} {
		if d.v <= 0 {
			return nil, fmt.Errorf("%s %s: must be positive", d.flag, d.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    float64
	}{{"-token-reviews-per-second", c.tokenReviewRate}, {"-token-review-burst", float64(c.tokenReviewBurst)},
		{"-token-reviews-pending-per-peer", float64(c.tokenReviewsPending)},
		{"-access-reviews-per-second", c.accessReviewRate}, {"-access-review-burst", float64(c.accessReviewBurst)},
		{"-review-qps", c.reviewQPS}, {"-review-burst", float64(c.reviewBurst)},
		{"-max-streams-per-caller", float64(l.MaxStreamsPerCaller)}, {"-max-request-bytes", float64(l.MaxRequestBytes)},
		{"-max-status-objects-per-caller", float64(l.MaxStatusObjectsPerCaller)},
		{"-max-selector-bytes", float64(l.MaxSelectorBytes)}, {"-max-header-bytes", float64(l.MaxHeaderBytes)},
		{"-max-streams-per-connection", float64(l.MaxStreamsPerConnection)}, {"-max-connections", float64(l.MaxConnections)},
		{"-max-connections-per-peer", float64(l.MaxConnectionsPerPeer)},
		{"-unary-calls-per-second", l.UnaryCallsPerSecond}, {"-unary-call-burst", float64(l.UnaryCallBurst)},
		{"-unary-calls-in-flight-per-caller", float64(l.UnaryCallsInFlightPerCaller)}, {"-unary-calls-in-flight", float64(l.UnaryCallsInFlight)},
		{"-new-informers-per-minute", l.NewInformersPerMinute}, {"-new-informer-burst", float64(l.NewInformerBurst)}} {
		if n.v <= 0 {
			return nil, fmt.Errorf("%s %v: must be positive", n.flag, n.v)
		}
	}
	if u := l.MaxUnauthenticatedConnections; u < 0 || u > l.MaxConnections {
		return nil, fmt.Errorf("-max-unauthenticated-connections %d: must be between 1 and -max-connections (%d), or 0 for -max-connections/4", u, l.MaxConnections)
	}
	if c.lingerTTL <= 0 {
		return nil, fmt.Errorf("-linger-ttl %s: must be positive", c.lingerTTL)
	}
	if c.recoveryWindow < 0 {
		return nil, fmt.Errorf("-recovery-window %s: must be positive, or 0 for off", c.recoveryWindow)
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
	}{{"-max-informers", int64(c.maxInformers)}, {"-max-informers-per-caller", int64(c.maxPerCaller)}} {
		if f.v <= 0 {
			return nil, fmt.Errorf("%s %d: must be positive", f.name, f.v)
		}
	}
	if c.maxLogBytesAll < 0 {
		return nil, fmt.Errorf("-max-log-bytes-total %d: must be positive, or 0 for a quarter of the Go memory limit", c.maxLogBytesAll)
	}
	if c.writeTimeout <= 0 {
		return nil, fmt.Errorf("-stream-write-timeout %s: must be positive", c.writeTimeout)
	}
	return c, nil
}

// maxObjectLimit is the largest -max-object-bytes: what clients accept.
const maxObjectLimit = informerdv1.MaxMessageBytes - informerdv1.MaxEventOverhead

// isLoopback reports whether host:port names a loopback address (a
// loopback IP or "localhost").
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// parseGroupResources reads a comma-separated list of resource[.group].
func parseGroupResources(list string) ([]schema.GroupResource, error) {
	var out []schema.GroupResource
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		gr := schema.ParseGroupResource(s)
		if errs := validation.IsDNS1123Subdomain(gr.Resource); len(errs) > 0 {
			return nil, fmt.Errorf("%q: %s", s, errs[0])
		}
		out = append(out, gr)
	}
	return out, nil
}
