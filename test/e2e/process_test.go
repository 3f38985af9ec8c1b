package e2e

import (
	"bufio"
	"context"
	"fmt"
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
)

// bins are the binaries the tests built, once per test binary.
var bins struct {
	mu   sync.Mutex // guards dir and errs
	dir  string
	errs map[string]error // by name: nil once built
}

// binary builds cmd/<name> once per test binary and returns its path.
func binary(t *testing.T, name string) string {
	t.Helper()
	bins.mu.Lock()
	defer bins.mu.Unlock()
	if bins.dir == "" {
		dir, err := os.MkdirTemp("", "informerd-e2e-bin-")
		if err != nil {
			t.Fatal(err)
		}
		bins.dir, bins.errs = dir, map[string]error{}
	}
	path := filepath.Join(bins.dir, name)
	err, built := bins.errs[name]
	if !built {
		out, buildErr := exec.Command("go", "build", "-o", path, "github.com/informerd/informerd/cmd/"+name).CombinedOutput()
		if buildErr != nil {
			err = fmt.Errorf("building %s: %w\n%s", name, buildErr, out)
		}
		bins.errs[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// daemonProc is informerd running as its own process, as in production.
type daemonProc struct {
	t       *testing.T
	socket  string
	metrics string // http://127.0.0.1:port
	args    []string
	cmd     *exec.Cmd
	done    chan struct{}
}

// startDaemonProcess starts the informerd binary against the test control
// plane with extra flags, on a socket in a temporary directory.
func startDaemonProcess(t *testing.T, socket string, flags ...string) *daemonProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	args := append([]string{"-kubeconfig", env.KubeconfigPath, "-socket", socket, "-metrics-address", addr, "-log-level", "warn"}, flags...)
	d := &daemonProc{t: t, socket: socket, metrics: "http://" + addr, args: args}
	d.start()
	t.Cleanup(func() { d.signal(syscall.SIGTERM) })
	return d
}

func (d *daemonProc) start() {
	d.t.Helper()
	d.cmd = exec.Command(binary(d.t, "informerd"), d.args...)
	d.cmd.Stdout, d.cmd.Stderr = os.Stderr, os.Stderr
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

// metric reads one unlabeled sample from the daemon's /metrics.
func (d *daemonProc) metric(name string) float64 {
	d.t.Helper()
	resp, err := http.Get(d.metrics + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
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
