package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/test/controlplane"
)

// binary is a command of this module, built once per test binary.
type binary struct {
	pkg  string
	once sync.Once
	path string
	err  error
}

var (
	informerdBin   = &binary{pkg: "github.com/informerd/informerd/cmd/informerd"}
	informerctlBin = &binary{pkg: "github.com/informerd/informerd/cmd/informerctl"}
)

// prebuild builds the commands, once: TestMain starts it beside the
// control plane, so that no test's deadline pays for a build.
func prebuild() {
	for _, b := range []*binary{informerdBin, informerctlBin} {
		b.prepare()
	}
}

// build returns the path of the built command.
func (b *binary) build(t *testing.T) string {
	t.Helper()
	b.prepare()
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// prepare builds the command once.
func (b *binary) prepare() {
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "informerd-e2e-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(b.pkg))
		b.err = goBuild("", b.path, b.pkg)
	})
}

// goBuild builds pkgs into out (a file, or a directory ending in a path
// separator) in dir ("": this one) as make image does, static, so that
// every build of the tests (prebuild's, TestExamples', test/image's) is one
// configuration and they share the build cache.
func goBuild(dir, out string, pkgs ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-o", out}, pkgs...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, b)
	}
	return nil
}

// daemonProc is informerd running as its own process, as in production.
type daemonProc struct {
	t       *testing.T
	socket  string
	metrics string // http://127.0.0.1:port
	args    []string
	out     io.Writer // the process's stdout and stderr; nil: os.Stderr
	env     []string  // added to the test's environment
	cmd     *exec.Cmd
	done    chan struct{}
	// scraper is a token allowed to get /metrics and the heap profile,
	// made on first use.
	scraper string
}

// startDaemonProcess starts the informerd binary against the test control
// plane with extra flags, on a socket in a temporary directory. It serves
// the fake node with authentication on (the reviews as the admin).
func startDaemonProcess(t *testing.T, socket string, flags ...string) *daemonProc {
	t.Helper()
	return startDaemonProcessTo(t, socket, nil, flags...)
}

// startDaemonProcessTo is startDaemonProcess with the process's output
// written to out (nil: os.Stderr). A flag given again in flags overrides
// the default (for example -kubeconfig).
func startDaemonProcessTo(t *testing.T, socket string, out io.Writer, flags ...string) *daemonProc {
	t.Helper()
	return startDaemonProcessEnv(t, socket, out, nil, flags...)
}

// startDaemonProcessEnv is startDaemonProcessTo with environ
// ("NAME=value") added to the process's environment.
func startDaemonProcessEnv(t *testing.T, socket string, out io.Writer, environ []string, flags ...string) *daemonProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	args := append([]string{"-kubeconfig", env.KubeconfigPath, "-socket", socket, "-metrics-address", addr, "-log-level", "warn",
		"-node-name", controlplane.FakeNodeName}, flags...)
	d := &daemonProc{t: t, socket: socket, metrics: "http://" + addr, args: args, out: out, env: environ}
	d.start()
	t.Cleanup(func() { d.signal(syscall.SIGTERM) })
	return d
}

func (d *daemonProc) start() {
	d.t.Helper()
	d.cmd = exec.Command(informerdBin.build(d.t), d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if d.out == nil {
		d.cmd.Stdout, d.cmd.Stderr = os.Stderr, os.Stderr
	}
	if d.env != nil {
		d.cmd.Env = append(os.Environ(), d.env...)
	}
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan struct{})
	done := d.done
	go func() { _ = d.cmd.Wait(); close(done) }()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		resp, err := http.Get(d.metrics + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		d.t.Fatalf("informerd did not come up: %v", err)
	}
}

// signal sends sig and waits for the process to exit.
func (d *daemonProc) signal(sig syscall.Signal) {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		d.t.Errorf("informerd ignored %s for 20s", sig)
	}
}

// scrape GETs path from the daemon's HTTP endpoint as a caller allowed to
// get /metrics and /debug/pprof/heap; the caller closes the body.
func (d *daemonProc) scrape(path string) *http.Response {
	d.t.Helper()
	if d.scraper == "" {
		d.scraper = identity(d.t, permission{path: "/metrics"}, permission{path: "/debug/pprof/heap"})
	}
	req, _ := http.NewRequest(http.MethodGet, d.metrics+path, nil)
	req.Header.Set("Authorization", "Bearer "+d.scraper)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		d.t.Fatalf("GET %s: %s", path, resp.Status)
	}
	return resp
}

// metric reads one unlabeled sample from the daemon's /metrics, as a
// caller allowed to.
func (d *daemonProc) metric(name string) float64 {
	d.t.Helper()
	resp := d.scrape("/metrics")
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	d.t.Fatalf("metric %s not found", name)
	return 0
}

// metricSum sums every sample of the metric name, whatever its labels (0
// if it has none).
func (d *daemonProc) metricSum(name string) float64 {
	d.t.Helper()
	resp := d.scrape("/metrics")
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum
}
