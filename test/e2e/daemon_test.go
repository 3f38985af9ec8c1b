package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/address"
	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/daemon"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/status"
	"github.com/informerd/informerd/test/controlplane"
)

// testDaemon is an in-process informerd serving on a Unix socket, wired as
// cmd/informerd wires it (every caller authenticated by TokenReview and
// every stream authorized by SubjectAccessReview), against the test
// control plane.
type testDaemon struct {
	socket string
	tcp    string // the TCP address, if security.TCP asked for one
	mgr    *cache.Manager
	stop   func() // idempotent; also run when the test ends
}

// security is what a test may tune of a daemon's authentication and
// authorization: TTLs, limits, opt-ins. There is deliberately no way to
// turn them off; the harness sets the reviewers itself.
type security struct {
	Authn          auth.AuthenticatorOptions
	Authz          auth.AuthorizerOptions
	Limits         daemon.Limits
	ServeSensitive []schema.GroupResource
	// TCP, if set, is a loopback address the daemon serves on as well
	// (port 0 picks one), with TLS if set.
	TCP string
	TLS *tls.Config
	// AddressRelated are WatchAddress's related kinds.
	AddressRelated []address.RelatedKind
}

// startDaemon starts a daemon on a new socket; see startDaemonAt.
func startDaemon(t *testing.T, opts cache.Options, tune ...func(*security)) *testDaemon {
	t.Helper()
	return startDaemonAt(t, filepath.Join(t.TempDir(), "informerd.sock"), opts, tune...)
}

// startDaemonAt starts a daemon with opts (Config defaults to the admin's)
// on socket, serving the fake node, with informerd's default security
// except what tune changes, and stops it when the test ends: listeners,
// then streams, then informers. Its reviews are made as the admin.
func startDaemonAt(t *testing.T, socket string, opts cache.Options, tune ...func(*security)) *testDaemon {
	t.Helper()
	if opts.Config == nil {
		opts.Config = env.RESTConfig()
	}
	opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sec := security{Authn: auth.AuthenticatorOptions{NodeName: controlplane.FakeNodeName}}
	for _, f := range tune {
		f(&sec)
	}
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	sec.Authn.Reviews, sec.Authn.Logger = admin.AuthenticationV1().TokenReviews(), opts.Logger
	sec.Authz.Reviews, sec.Authz.Logger = admin.AuthorizationV1().SubjectAccessReviews(), opts.Logger
	authn, err := auth.NewAuthenticator(sec.Authn)
	if err != nil {
		t.Fatal(err)
	}
	authz, err := auth.NewAuthorizer(sec.Authz)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := cache.NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	statuses, err := status.New(status.Options{Cache: mgr, Logger: opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := daemon.New(daemon.Options{
		Cache: mgr, Status: statuses, AddressRelated: sec.AddressRelated, Logger: opts.Logger, Authenticator: authn, Authorizer: authz,
		Limits: sec.Limits, ServeSensitive: sec.ServeSensitive, TLS: sec.TLS,
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	informerdv1.RegisterInformerServiceServer(gs, srv)
	listen := func(network, addr string) net.Listener {
		l, err := net.Listen(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		return srv.Listen(l)
	}
	d := &testDaemon{socket: socket, mgr: mgr}
	ls := []net.Listener{listen("unix", socket)}
	if sec.TCP != "" {
		ls = append(ls, listen("tcp", sec.TCP))
		d.tcp = ls[1].Addr().String()
	}
	var served sync.WaitGroup
	for _, l := range ls {
		served.Add(1)
		go func() { defer served.Done(); _ = gs.Serve(l) }()
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopped := make(chan struct{})
			go func() { gs.GracefulStop(); close(stopped) }()
			srv.Shutdown()
			<-stopped
			served.Wait()
			statuses.Close()
			mgr.Close()
		})
	}
	t.Cleanup(stop)
	d.stop = stop
	return d
}

// dial returns a new client connection to the daemon as a caller of its
// own, which may do exactly perms; it is closed at the end of the test.
func (d *testDaemon) dial(t *testing.T, perms ...permission) *client.Client {
	t.Helper()
	return dialSocket(t, d.socket, perms...)
}

// dialSocket is dial for a daemon on socket (for example a process).
func dialSocket(t *testing.T, socket string, perms ...permission) *client.Client {
	t.Helper()
	return dialWith(t, socket, client.WithToken(identity(t, perms...)))
}

// dialWith connects to target with opts as they are: for the tests of
// authentication itself.
func dialWith(t *testing.T, target string, opts ...grpc.DialOption) *client.Client {
	t.Helper()
	c, err := client.Dial(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// permission is one thing a test client may do: list and watch a resource
// in a namespace ("" for all namespaces), or get a non-resource path.
type permission struct {
	gvr       schema.GroupVersionResource
	namespace string
	path      string
}

// reads lets a client list and watch gvr in namespace ("" for all).
func reads(gvr schema.GroupVersionResource, namespace string) permission {
	return permission{gvr: gvr, namespace: namespace}
}

// readsAll lets a client list and watch every resource in every namespace:
// what an applier (cli-utils' StatusWatcher) needs, to read the kinds it
// applies and the objects they generate.
var readsAll = reads(schema.GroupVersionResource{Group: "*", Resource: "*"}, "")

// introspects lets a client see every informer and stream.
var introspects = permission{path: "/informerd/informers"}

// clientNamespace holds the test clients' ServiceAccounts.
var clientNamespace = sync.OnceValues(func() (string, error) {
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	ns, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-clients-"}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return ns.Name, nil
})

var identities atomic.Int64

// identity creates a ServiceAccount of its own with exactly perms, waits
// until the API server's authorizer grants them, and returns a token for
// it with informerd's audience. The ServiceAccount is named after the test.
func identity(t *testing.T, perms ...permission) string {
	t.Helper()
	ns, name := newServiceAccount(t)
	grant(t, ns, name, perms...)
	return mintToken(t, ns, name, auth.DefaultAudience)
}

// newServiceAccount picks a new ServiceAccount name in clientNamespace.
func newServiceAccount(t *testing.T) (namespace, name string) {
	t.Helper()
	ns, err := clientNamespace()
	if err != nil {
		t.Fatal(err)
	}
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	return ns, strings.Trim(fmt.Sprintf("c%d-%.40s", identities.Add(1), base), "-")
}

// mintToken returns a TokenRequest token of ServiceAccount ns/name (created
// if needed) for audience.
func mintToken(t *testing.T, ns, name, audience string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token, err := controlplane.ServiceAccountToken(ctx, kubernetes.NewForConfigOrDie(env.RESTConfig()), ns, name, audience)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// grant gives ServiceAccount ns/name exactly perms (replacing what grant
// gave it before) and waits until the API server's authorizer says so
// (controlplane.Grant does).
func grant(t *testing.T, ns, name string, perms ...permission) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	rules := map[string][]rbacv1.PolicyRule{} // by namespace; "" is cluster-wide
	for _, p := range perms {
		if p.path != "" {
			rules[""] = append(rules[""], rbacv1.PolicyRule{NonResourceURLs: []string{p.path}, Verbs: []string{"get"}})
			continue
		}
		rules[p.namespace] = append(rules[p.namespace], rbacv1.PolicyRule{APIGroups: []string{p.gvr.Group}, Resources: []string{p.gvr.Resource}, Verbs: []string{"list", "watch"}})
	}
	for namespace, rs := range rules {
		if err := controlplane.Grant(ctx, admin, ns, name, namespace, rs...); err != nil {
			t.Fatal(err)
		}
	}
}

// tokenFile writes identity(perms)'s token to a file, for process clients.
func tokenFile(t *testing.T, perms ...permission) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), fmt.Sprintf("token-%d", identities.Load()+1))
	if err := os.WriteFile(path, []byte(identity(t, perms...)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testWriter sends daemon logs to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// apiMetrics reads the API server's own /metrics.
type apiMetrics struct{ text string }

func scrapeAPIServer(ctx context.Context, t *testing.T) apiMetrics {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	b, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("scraping the API server's metrics: %v", err)
	}
	return apiMetrics{string(b)}
}

// sum adds the samples of metric whose labels include every want pair.
func (m apiMetrics) sum(metric string, want map[string]string) float64 {
	total := 0.0
	sc := bufio.NewScanner(strings.NewReader(m.text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		labels, value := line[len(metric)+1:end], strings.TrimSpace(line[end+1:])
		ok := true
		for k, v := range want {
			if !strings.Contains(","+labels, ","+k+`="`+v+`"`) {
				ok = false
				break
			}
		}
		if ok {
			f, _ := strconv.ParseFloat(value, 64)
			total += f
		}
	}
	return total
}

// upstreamLists is how many cluster-wide LIST requests of gvr the API
// server served. Namespaced LISTs are left out: kube-controller-manager's
// namespace controller lists every resource of each namespace it deletes.
func upstreamLists(ctx context.Context, t *testing.T, gvr schema.GroupVersionResource) int {
	return int(scrapeAPIServer(ctx, t).sum("apiserver_request_total", map[string]string{
		"verb": "LIST", "group": gvr.Group, "resource": gvr.Resource, "scope": "cluster",
	}))
}

// hold waits for d, or until ctx ends. It is only for waits whose length is
// itself what a test exercises (an outage, a fault schedule, a load
// generator's pause); whatever can be waited on is waited on instead.
func hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// eventually polls cond until it holds: the API server's metrics and the
// daemon's introspection change asynchronously, with nothing to wait on.
func eventually(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll(ctx, t, 30*time.Second, what, cond)
}

// poll is eventually with a timeout of its own.
func poll(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
