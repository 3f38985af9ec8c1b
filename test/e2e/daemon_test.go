package e2e

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/daemon"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/status"
)

// testDaemon is an in-process informerd serving on a Unix socket, wired as
// cmd/informerd wires it, against the test control plane.
type testDaemon struct {
	socket string
	mgr    *cache.Manager
	stop   func() // idempotent; also run when the test ends
}

// startDaemon starts a daemon on a new socket; see startDaemonAt.
func startDaemon(t *testing.T, opts cache.Options, configure ...func(*daemon.Options)) *testDaemon {
	t.Helper()
	return startDaemonAt(t, filepath.Join(t.TempDir(), "informerd.sock"), opts, configure...)
}

// startDaemonAt starts a daemon with opts (Config defaults to the admin's)
// on socket, and stops it when the test ends: listeners, then streams, then
// informers. Each configure func may change the daemon's Options.
func startDaemonAt(t *testing.T, socket string, opts cache.Options, configure ...func(*daemon.Options)) *testDaemon {
	t.Helper()
	if opts.Config == nil {
		opts.Config = env.RESTConfig()
	}
	opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	mgr, err := cache.NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	statuses, err := status.New(status.Options{Cache: mgr, Logger: opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	dopts := daemon.Options{Cache: mgr, Status: statuses, Logger: opts.Logger}
	for _, f := range configure {
		f(&dopts)
	}
	srv, err := daemon.New(dopts)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(daemon.ServerOptions()...)
	informerdv1.RegisterInformerServiceServer(gs, srv)
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(l) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopped := make(chan struct{})
			go func() { gs.GracefulStop(); close(stopped) }()
			srv.Shutdown()
			<-stopped
			<-served
			statuses.Close()
			mgr.Close()
		})
	}
	t.Cleanup(stop)
	return &testDaemon{socket: socket, mgr: mgr, stop: stop}
}

// dial returns a new client connection to the daemon, closed at the end.
func (d *testDaemon) dial(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
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

// upstreamWatches is how many watches of gvr the API server holds now.
func upstreamWatches(ctx context.Context, t *testing.T, gvr schema.GroupVersionResource) int {
	return int(scrapeAPIServer(ctx, t).sum("apiserver_longrunning_requests", map[string]string{
		"verb": "WATCH", "group": gvr.Group, "resource": gvr.Resource,
	}))
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
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
