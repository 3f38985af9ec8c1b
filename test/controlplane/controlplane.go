// Package controlplane starts a real, throwaway Kubernetes control plane on
// 127.0.0.1 for informerd's e2e tests, benchmarks and demo: etcd and
// kube-apiserver always; kube-controller-manager, kube-scheduler and kwok
// (one fake node, so that pods are scheduled, Running and get IPs) on request.
//
// The binaries are built from the pinned tool module under this directory by
// build.sh and cached outside the clone; Start builds them on first use.
// Every start generates fresh PKI and a fresh etcd data directory. Processes
// are stopped in reverse start order, with SIGKILL after a short grace.
package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configure Start. The zero value starts etcd and kube-apiserver on
// free loopback ports in a new temporary directory.
type Options struct {
	// BinDir holds the binaries. Default: $INFORMERD_CONTROLPLANE_BIN, else
	// the output of build.sh (which builds on a cache miss).
	BinDir string
	// Dir receives PKI, etcd data, logs and the admin kubeconfig. Default: a
	// new temporary directory, removed by Stop.
	Dir string
	// Ports; 0 picks a free port. A port that is given but already in use
	// fails Start before any process is started.
	EtcdPort, EtcdPeerPort, APIServerPort, ControllerManagerPort, SchedulerPort, KwokPort int
	// ControllerManager starts kube-controller-manager (namespaces
	// finalize, Deployments make ReplicaSets and Pods, default
	// ServiceAccounts appear), without the garbage collector and the quota
	// controller, which would watch every resource.
	ControllerManager bool
	// FakeNode starts kube-scheduler and kwok and registers one fake node
	// that kwok manages, so that pods get scheduled, Running and pod IPs.
	FakeNode bool
	// Detach leaves the processes running after the caller exits (for
	// `make cluster-up`); otherwise they are killed if the caller dies.
	Detach bool
	// APIServerFlags are appended to kube-apiserver's command line.
	APIServerFlags []string
	// ControllerManagerFlags are appended to kube-controller-manager's
	// (for example a higher --kube-api-qps for a benchmark's thousands of
	// Deployments).
	ControllerManagerFlags []string
	// Logf receives progress lines. Default: discard.
	Logf func(format string, args ...any)
}

// FakeNodeName is the name of the node that FakeNode registers.
const FakeNodeName = "kwok-node-0"

// KwokAnnotation marks the nodes kwok manages: a Node with
// KwokAnnotation: "fake" is Ready and runs the Pods bound to it.
const KwokAnnotation = "kwok.x-k8s.io/node"

// ControlPlane is a running control plane. Stop and Logs are safe for
// concurrent use; StopAPIServer and StartAPIServer must be called from one
// goroutine at a time.
type ControlPlane struct {
	// Dir holds PKI, data, logs and the admin kubeconfig.
	Dir string
	// KubeconfigPath is the admin kubeconfig (group system:masters).
	KubeconfigPath string
	// APIServerURL is https://127.0.0.1:<port>.
	APIServerURL string

	opts    Options
	pki     *pki
	admin   *rest.Config
	ownsDir bool

	mu    sync.Mutex // guards procs
	procs []*process // in start order
}

// process is one child process with its log file.
type process struct {
	name    string
	args    []string
	logPath string
	// healthPort is the loopback port of its /healthz, 0 if it has none
	// that waitComponent can ask.
	healthPort int
	cmd        *exec.Cmd
	done       chan struct{} // closed when the process has exited
}

// state is what a detached control plane leaves in Dir for Down.
type state struct {
	PIDs map[string]int `json:"pids"`
}

const stateFile = "state.json"

// Start starts a control plane. On error nothing it started is left running.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	ports, err := pickPorts(&opts)
	if err != nil {
		return nil, err
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = BinDir(ctx); err != nil {
			return nil, err
		}
	}
	cp := &ControlPlane{opts: opts, Dir: opts.Dir}
	if cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "informerd-controlplane-"); err != nil {
			return nil, err
		}
		cp.ownsDir = true
	}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	for _, sub := range []string{"pki", "logs", "etcd"} {
		if err := os.MkdirAll(filepath.Join(cp.Dir, sub), 0o700); err != nil {
			return nil, err
		}
	}
	if cp.pki, err = generatePKI(filepath.Join(cp.Dir, "pki")); err != nil {
		return nil, fmt.Errorf("generating PKI: %w", err)
	}
	cp.APIServerURL = fmt.Sprintf("https://127.0.0.1:%d", opts.APIServerPort)
	cp.KubeconfigPath = filepath.Join(cp.Dir, "kubeconfig")
	if err := cp.writeKubeconfig(cp.KubeconfigPath); err != nil {
		return nil, err
	}
	cp.admin = &rest.Config{
		Host: cp.APIServerURL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.pki.caPEM,
			CertData: cp.pki.adminCertPEM,
			KeyData:  cp.pki.adminKP,
		},
		QPS:   -1,
		Burst: -1,
	}

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", opts.EtcdPort)
	if err := cp.startProcess("etcd", 0,
		"--name=informerd-test",
		"--data-dir="+filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", opts.EtcdPeerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", opts.EtcdPeerPort),
		fmt.Sprintf("--initial-cluster=informerd-test=http://127.0.0.1:%d", opts.EtcdPeerPort),
		"--unsafe-no-fsync",
		"--log-level=warn",
	); err != nil {
		return nil, err
	}
	if err := cp.waitHTTP(ctx, "etcd", etcdURL+"/health", nil); err != nil {
		return nil, err
	}

	if err := cp.startProcess("kube-apiserver", 0, cp.apiServerArgs(etcdURL)...); err != nil {
		return nil, err
	}
	if err := cp.waitAPIServer(ctx); err != nil {
		return nil, err
	}

	if opts.ControllerManager {
		if err := cp.startProcess("kube-controller-manager", ports[portControllerManager], append([]string{
			"--kubeconfig=" + cp.KubeconfigPath,
			"--authentication-kubeconfig=" + cp.KubeconfigPath,
			"--authorization-kubeconfig=" + cp.KubeconfigPath,
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[portControllerManager]),
			"--service-account-private-key-file=" + cp.pki.saPrivate,
			"--root-ca-file=" + cp.pki.caCert,
			"--use-service-account-credentials",
			"--leader-elect=false",
			// One fake node: no CIDRs, no evictions. The garbage collector
			// runs, as in every real cluster (cascading and foreground
			// deletion need it); the quota controller, which watches every
			// resource too and which nothing here uses, does not.
			"--controllers=*,-node-ipam-controller,-node-lifecycle-controller,-resourcequota-controller",
			"--v=1",
		}, opts.ControllerManagerFlags...)...); err != nil {
			return nil, err
		}
		if err := cp.waitComponent(ctx, "kube-controller-manager"); err != nil {
			return nil, err
		}
	}
	if opts.FakeNode {
		if err := cp.startFakeNode(ctx, ports); err != nil {
			return nil, err
		}
	}
	if opts.Detach {
		if err := cp.writeState(); err != nil {
			return nil, err
		}
	}
	opts.Logf("control plane ready at %s (kubeconfig %s)", cp.APIServerURL, cp.KubeconfigPath)
	return cp, nil
}

func (cp *ControlPlane) apiServerArgs(etcdURL string) []string {
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", cp.opts.APIServerPort),
		"--tls-cert-file=" + cp.pki.servingCert,
		"--tls-private-key-file=" + cp.pki.servKey,
		"--client-ca-file=" + cp.pki.caCert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + cp.pki.saPublic,
		"--service-account-signing-key-file=" + cp.pki.saPrivate,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--cert-dir=" + filepath.Join(cp.Dir, "pki"),
		"--v=1",
	}
	return append(args, cp.opts.APIServerFlags...)
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after a grace),
// leaving etcd and everything else running. StartAPIServer starts it again.
func (cp *ControlPlane) StopAPIServer() {
	cp.mu.Lock()
	p := cp.find("kube-apiserver")
	cp.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

// KillAPIServer kills kube-apiserver with SIGKILL, as a crash would: no
// graceful end of its watches. StartAPIServer starts it again.
func (cp *ControlPlane) KillAPIServer() {
	cp.mu.Lock()
	p := cp.find("kube-apiserver")
	cp.mu.Unlock()
	if p != nil && p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// StartAPIServer restarts a kube-apiserver stopped by StopAPIServer or
// KillAPIServer, with the same flags and port, and waits until it is ready.
// The components that watch it notice through their own retries; see
// RestartWatchers.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.mu.Lock()
	p := cp.find("kube-apiserver")
	cp.mu.Unlock()
	if p == nil {
		return errors.New("kube-apiserver was not started by this ControlPlane")
	}
	select {
	case <-p.done:
	default:
		return errors.New("kube-apiserver is still running")
	}
	if err := cp.restart(p); err != nil {
		return err
	}
	return cp.waitAPIServer(ctx)
}

// RestartWatchers restarts the components started after kube-apiserver
// (kube-controller-manager, kube-scheduler, kwok), in order, and waits for
// those with a health port, as an operator would after a control-plane
// outage. Their reflectors' backoff grows with every failed request and
// resets only after two minutes without one, so after a few API server
// restarts in a row they notice its return late (a new namespace got its
// kube-root-ca.crt 1.4, 12 and 48 s after the first three restarts,
// measured): tests that restart the API server call this so that later
// tests do not wait on that backoff.
func (cp *ControlPlane) RestartWatchers(ctx context.Context) error {
	cp.mu.Lock()
	i := slices.IndexFunc(cp.procs, func(p *process) bool { return p.name == "kube-apiserver" })
	var watchers []*process
	if i >= 0 {
		watchers = slices.Clone(cp.procs[i+1:])
	}
	cp.mu.Unlock()
	for _, w := range watchers {
		w.stop()
		if err := cp.restart(w); err != nil {
			return err
		}
		if w.healthPort != 0 {
			if err := cp.waitComponent(ctx, w.name); err != nil {
				return err
			}
		}
	}
	return nil
}

// Owned reports whether this ControlPlane started its processes (Start)
// rather than attaching to a running cluster (Attach).
func (cp *ControlPlane) Owned() bool { return cp.pki != nil }

// PID returns the process ID of the named component ("etcd",
// "kube-apiserver", ...) while it runs under this ControlPlane, else 0. Do
// not call it concurrently with StartAPIServer.
func (cp *ControlPlane) PID(name string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if p := cp.find(name); p != nil && p.cmd != nil && p.cmd.Process != nil {
		select {
		case <-p.done:
		default:
			return p.cmd.Process.Pid
		}
	}
	return 0
}

func (cp *ControlPlane) find(name string) *process {
	for _, p := range cp.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// Stop stops every process in reverse start order and removes Dir if Start
// created it. It is idempotent.
func (cp *ControlPlane) Stop() {
	cp.mu.Lock()
	procs := cp.procs
	cp.procs = nil
	cp.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop()
	}
	if cp.ownsDir {
		_ = os.RemoveAll(cp.Dir)
	}
}

// Logs returns the last maxBytes of every process log, for printing when a
// test fails.
func (cp *ControlPlane) Logs(maxBytes int) string {
	cp.mu.Lock()
	procs := append([]*process(nil), cp.procs...)
	cp.mu.Unlock()
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "===== %s (%s) =====\n%s\n", p.name, p.logPath, tail(p.logPath, maxBytes))
	}
	return b.String()
}

// RESTConfig returns a copy of the admin rest.Config (group system:masters),
// without client-side rate limits: tests measure the server, not the client.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	return rest.CopyConfig(cp.admin)
}

// TokenConfig returns a rest.Config that authenticates with a bearer token
// only, for acting as a ServiceAccount.
func (cp *ControlPlane) TokenConfig(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(cp.admin)
	cfg.BearerToken = token
	return cfg
}

// Attach returns a ControlPlane for an already running cluster named by a
// kubeconfig. Stop on it stops nothing, and StopAPIServer/StartAPIServer
// are not available.
func Attach(kubeconfigPath string) (*ControlPlane, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigPath)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfigPath, err)
	}
	cfg.QPS, cfg.Burst = -1, -1
	return &ControlPlane{KubeconfigPath: kubeconfigPath, APIServerURL: cfg.Host, admin: cfg}, nil
}

func (cp *ControlPlane) writeKubeconfig(path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["informerd-test"] = &clientcmdapi.Cluster{Server: cp.APIServerURL, CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.pki.adminCertPEM, ClientKeyData: cp.pki.adminKP}
	cfg.Contexts["informerd-test"] = &clientcmdapi.Context{Cluster: "informerd-test", AuthInfo: "admin"}
	cfg.CurrentContext = "informerd-test"
	return clientcmd.WriteToFile(*cfg, path)
}

func (cp *ControlPlane) startProcess(name string, healthPort int, args ...string) error {
	p := &process{name: name, args: args, healthPort: healthPort, logPath: filepath.Join(cp.Dir, "logs", name+".log")}
	cp.mu.Lock()
	cp.procs = append(cp.procs, p)
	cp.mu.Unlock()
	return cp.restart(p)
}

func (cp *ControlPlane) restart(p *process) error {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(filepath.Join(cp.opts.BinDir, p.name), p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !cp.opts.Detach {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	cp.opts.Logf("starting %s", p.name)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	done := p.done
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return nil
}

// stopGrace is how long a process gets after SIGTERM before SIGKILL.
const stopGrace = 5 * time.Second

func (p *process) stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// waitAPIServer waits until /readyz answers ok.
func (cp *ControlPlane) waitAPIServer(ctx context.Context) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.pki.caPEM)
	cert, err := tls.X509KeyPair(cp.pki.adminCertPEM, cp.pki.adminKP)
	if err != nil {
		return err
	}
	return cp.waitHTTP(ctx, "kube-apiserver", cp.APIServerURL+"/readyz",
		&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
}

// waitComponent waits for the /healthz of a component that serves HTTPS
// on its loopback healthPort with a self-signed certificate.
func (cp *ControlPlane) waitComponent(ctx context.Context, name string) error {
	cp.mu.Lock()
	p := cp.find(name)
	cp.mu.Unlock()
	if p == nil || p.healthPort == 0 {
		return fmt.Errorf("%s has no health port to wait on", name)
	}
	return cp.waitHTTP(ctx, name, fmt.Sprintf("https://127.0.0.1:%d/healthz", p.healthPort),
		&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // loopback health probe of a throwaway component
}

// startTimeout bounds how long one component may take to become ready.
const startTimeout = 90 * time.Second

func (cp *ControlPlane) waitHTTP(ctx context.Context, name, url string, tlsConfig *tls.Config) error {
	cp.mu.Lock()
	p := cp.find(name)
	cp.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	defer hc.CloseIdleConnections()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		resp, err := hc.Get(url)
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body[:n]))
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up; last lines of %s:\n%s", name, p.logPath, tail(p.logPath, 4096))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s after %s (last answer: %s); last lines of %s:\n%s",
				name, url, startTimeout, last, p.logPath, tail(p.logPath, 4096))
		case <-tick.C:
		}
	}
}

// port indices into the slice pickPorts returns.
const (
	portEtcd = iota
	portEtcdPeer
	portAPIServer
	portControllerManager
	portScheduler
	portKwok
	numPorts
)

// pickPorts fills every zero port in opts with a free loopback port, after
// checking that every given port is free, so that a busy port fails before
// anything starts.
func pickPorts(opts *Options) ([]int, error) {
	fields := []struct {
		name string
		p    *int
	}{
		{"etcd client", &opts.EtcdPort},
		{"etcd peer", &opts.EtcdPeerPort},
		{"kube-apiserver", &opts.APIServerPort},
		{"kube-controller-manager", &opts.ControllerManagerPort},
		{"kube-scheduler", &opts.SchedulerPort},
		{"kwok", &opts.KwokPort},
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for _, f := range fields {
		if *f.p == 0 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(*f.p)))
		if err != nil {
			return nil, fmt.Errorf("port %d for %s is not available (%w): free it or choose another port", *f.p, f.name, err)
		}
		held = append(held, l)
	}
	ports := make([]int, 0, numPorts)
	for _, f := range fields {
		if *f.p == 0 {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, fmt.Errorf("finding a free port for %s: %w", f.name, err)
			}
			held = append(held, l)
			*f.p = l.Addr().(*net.TCPAddr).Port
		}
		ports = append(ports, *f.p)
	}
	return ports, nil
}

func (cp *ControlPlane) writeState() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	st := state{PIDs: map[string]int{}}
	for _, p := range cp.procs {
		st.PIDs[p.name] = p.cmd.Process.Pid
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cp.Dir, stateFile), b, 0o600)
}

// Down stops a detached control plane that Start left in dir: each process
// group gets SIGTERM, then SIGKILL after a grace. It is a no-op when dir
// holds no state.
func Down(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("reading %s: %w", stateFile, err)
	}
	// Reverse start order.
	for _, name := range []string{"kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		pid, ok := st.PIDs[name]
		if !ok {
			continue
		}
		if syscall.Kill(-pid, syscall.SIGTERM) != nil {
			continue // already gone
		}
		deadline := time.Now().Add(stopGrace)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond) // polling a foreign process: nothing to wait on
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	return os.Remove(filepath.Join(dir, stateFile))
}

// BinDir returns the directory holding the control-plane binaries:
// $INFORMERD_CONTROLPLANE_BIN if set, else what build.sh prints (building
// them on a cache miss, which takes several minutes on a cold machine).
func BinDir(ctx context.Context) (string, error) {
	if d := os.Getenv("INFORMERD_CONTROLPLANE_BIN"); d != "" {
		return d, nil
	}
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate build.sh: set INFORMERD_CONTROLPLANE_BIN")
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(self), "build.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the control plane: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return lines[len(lines)-1], nil
}

func tail(path string, maxBytes int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > maxBytes {
		b = b[len(b)-maxBytes:]
	}
	return string(b)
}
