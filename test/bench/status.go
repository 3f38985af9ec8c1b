package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/test/controlplane"
)

// statusWorkload is what `bench status` runs: for each number of appliers
// and each mode, that many applier processes at once, each applying its
// own Deployments and waiting until they are reconciled.
type statusWorkload struct {
	Deployments   int      `json:"deploymentsPerApplier"`
	Appliers      []int    `json:"appliers"`
	Modes         []string `json:"modes"`
	ApplierQPS    float64  `json:"applierQPS"`
	ControllerQPS int      `json:"controllerManagerQPS"`
}

// statusRun is one (mode, appliers) run.
type statusRun struct {
	Mode     string `json:"mode"`
	Appliers int    `json:"appliers"`
	// WallSeconds: from starting the appliers until the last one is done.
	WallSeconds float64         `json:"wallSeconds"`
	Results     []applierResult `json:"applierResults"`
	// Lists counts the API server's LIST requests during the run, and
	// PeakWatches the most watches it held at once beyond those held
	// before the run, per resource.
	Lists       map[string]int `json:"lists"`
	PeakWatches map[string]int `json:"peakWatches"`
	// DaemonPeakRSS is informerd's peak resident set during the run (a
	// daemon started for the run; 0 in the other modes).
	DaemonPeakRSS uint64 `json:"daemonPeakRSSBytes"`
	// DaemonCPUSeconds is informerd's CPU time (utime+stime) from starting
	// the appliers until the last one is done; also per second of that
	// and per Deployment applied.
	DaemonCPUSeconds             float64 `json:"daemonCpuSeconds,omitempty"`
	DaemonCPUPerSecond           float64 `json:"daemonCpuSecondsPerSecond,omitempty"`
	DaemonCPUMillisPerDeployment float64 `json:"daemonCpuMillisPerDeployment,omitempty"`
}

type statusReport struct {
	Machine  machine        `json:"machine"`
	Workload statusWorkload `json:"workload"`
	Command  string         `json:"command"`
	Runs     []statusRun    `json:"runs"`
	// Rollouts are the rollout runs (-rollout), one per daemon binary.
	Rollouts []*rolloutResult `json:"rollouts,omitempty"`
}

// statusResources are the resources whose LISTs and watches are counted.
var statusResources = []string{"deployments", "replicasets", "pods"}

// runStatusBench is `bench status`: cli-utils appliers waiting through
// informerd's WatchStatus vs through cli-utils' DefaultStatusWatcher.
func runStatusBench(args []string) error {
	w := statusWorkload{Deployments: 200, Appliers: []int{1, 5}, Modes: applierModes, ApplierQPS: 100, ControllerQPS: 200}
	fs := flag.NewFlagSet("bench status", flag.ContinueOnError)
	bin := fs.String("bin", "_output/bin", "directory with the informerd binary")
	out := fs.String("out", "_output/bench/status.json", "where to write the results as JSON")
	fs.IntVar(&w.Deployments, "deployments", w.Deployments, "Deployments (of one replica) per applier")
	appliers := fs.String("appliers", joinInts(w.Appliers), "comma-separated numbers of appliers run at once (empty: no applier runs)")
	rollout := fs.Int("rollout", 0, "if > 0, also roll out one Deployment of this many replicas through informerd, with a bystander's status timed meanwhile")
	rolloutDaemons := fs.String("rollout-informerd", "", "comma-separated informerd binaries to run the rollout with, one after the other (default: the one in -bin)")
	modeList := fs.String("modes", strings.Join(w.Modes, ","), "comma-separated modes: "+strings.Join(applierModes, ", "))
	fs.Float64Var(&w.ApplierQPS, "applier-qps", w.ApplierQPS, "each applier's client QPS (burst twice that)")
	fs.IntVar(&w.ControllerQPS, "controller-qps", w.ControllerQPS, "kube-controller-manager's --kube-api-qps (burst twice that)")
	timeout := fs.Duration("timeout", 30*time.Minute, "longest reconcile wait of one applier")
	profiles := fs.String("memprofile-dir", "", "if set, each applier writes its allocation profile here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if *appliers == "" {
		w.Appliers = nil
	} else if w.Appliers, err = parseInts(*appliers); err != nil {
		return fmt.Errorf("-appliers: %w", err)
	}
	w.Modes = strings.Split(*modeList, ",")
	for _, m := range w.Modes {
		if !slices.Contains(applierModes, m) {
			return fmt.Errorf("-modes: unknown mode %q (want one of %s)", m, strings.Join(applierModes, ", "))
		}
	}
	env, err := startBench(*bin, "etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok with one fake node", controlplane.Options{
		ControllerManager: true, FakeNode: true,
		ControllerManagerFlags: []string{"--kube-api-qps=" + strconv.Itoa(w.ControllerQPS), "--kube-api-burst=" + strconv.Itoa(2*w.ControllerQPS)},
	})
	if err != nil {
		return err
	}
	defer env.close()
	ctx, cp, informerd, self := env.ctx, env.cp, env.informerd, env.self
	h := &statusHarness{cp: cp, w: w, self: self, informerd: informerd, timeout: *timeout, profiles: *profiles}
	if h.tokens, err = os.MkdirTemp("", "informerd-bench-tokens-"); err != nil {
		return err
	}
	defer os.RemoveAll(h.tokens)
	rep := statusReport{Machine: describeMachine(cp), Workload: w, Command: makeCommand("make bench-status", "BENCH_STATUS_FLAGS", args)}
	for _, n := range w.Appliers {
		for _, mode := range w.Modes {
			say("run: %s, %d appliers of %d Deployments", mode, n, w.Deployments)
			r, err := h.run(ctx, mode, n)
			if err != nil {
				return fmt.Errorf("%s with %d appliers: %w", mode, n, err)
			}
			rep.Runs = append(rep.Runs, r)
		}
	}
	if *rollout > 0 {
		bins := []string{informerd}
		if *rolloutDaemons != "" {
			bins = strings.Split(*rolloutDaemons, ",")
		}
		for _, bin := range bins {
			r, err := h.runRollout(ctx, bin, *rollout)
			if err != nil {
				return fmt.Errorf("rollout of %d replicas with %s: %w", *rollout, bin, err)
			}
			rep.Rollouts = append(rep.Rollouts, r)
		}
	}
	if len(rep.Runs) > 0 {
		rep.print(os.Stdout)
	}
	for _, r := range rep.Rollouts {
		r.print(os.Stdout)
	}
	return writeReport(*out, rep)
}

type statusHarness struct {
	cp        *controlplane.ControlPlane
	w         statusWorkload
	self      string
	informerd string
	timeout   time.Duration
	profiles  string // directory for the appliers' allocation profiles, or ""
	tokens    string // directory for the appliers' token files
	runs      int
}

func (h *statusHarness) admin() *kubernetes.Clientset {
	cfg := h.cp.RESTConfig()
	cfg.QPS, cfg.Burst = 200, 400
	return kubernetes.NewForConfigOrDie(cfg)
}

// run runs n appliers of mode at once in namespaces of their own, then
// deletes the namespaces.
func (h *statusHarness) run(ctx context.Context, mode string, n int) (statusRun, error) {
	r := statusRun{Mode: mode, Appliers: n, Lists: map[string]int{}, PeakWatches: map[string]int{}}
	admin := h.admin()
	h.runs++
	namespaces := make([]string, n)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("status-%d-%s-%d", h.runs, mode, i)
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaces[i]}}, metav1.CreateOptions{}); err != nil {
			return r, err
		}
		if err := controlplane.WaitForDefaultServiceAccount(ctx, admin, namespaces[i]); err != nil {
			return r, err
		}
	}
	defer h.deleteNamespaces(admin, namespaces)
	before, err := apiCounts(ctx, admin)
	if err != nil {
		return r, err
	}
	var (
		d       *daemon
		daemon0 float64
		tokens  = make([]string, n)
	)
	if mode == applierInformerd || mode == applierInformerdMapper {
		for i, ns := range namespaces {
			if tokens[i], err = h.applierToken(ctx, admin, ns); err != nil {
				return r, err
			}
		}
		if d, err = startDaemon(ctx, h.informerd, h.cp.KubeconfigPath); err != nil {
			return r, err
		}
		defer d.stop()
		if daemon0, err = d.cpu(); err != nil {
			return r, err
		}
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() { // ends with stopSampling
		defer sampled.Done()
		h.sample(sampleCtx, admin, d, before, &r)
	}()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	r.Results = make([]applierResult, n)
	for i, ns := range namespaces {
		args := []string{"applier", "-kubeconfig", h.cp.KubeconfigPath, "-mode", mode, "-namespace", ns,
			"-deployments", strconv.Itoa(h.w.Deployments), "-qps", strconv.FormatFloat(h.w.ApplierQPS, 'f', -1, 64), "-timeout", h.timeout.String()}
		if d != nil {
			args = append(args, "-socket", d.socket, "-token-file", tokens[i])
		}
		if h.profiles != "" {
			args = append(args, "-memprofile", filepath.Join(h.profiles, ns+".allocs"))
		}
		g.Go(func() error { return runApplierProcess(gctx, h.self, args, &r.Results[i]) })
	}
	err = g.Wait()
	r.WallSeconds = time.Since(start).Seconds()
	stopSampling()
	sampled.Wait()
	if err != nil {
		return r, err
	}
	if d != nil {
		daemon1, err := d.cpu()
		if err != nil {
			return r, err
		}
		r.DaemonCPUSeconds = daemon1 - daemon0
		r.DaemonCPUPerSecond = r.DaemonCPUSeconds / r.WallSeconds
		r.DaemonCPUMillisPerDeployment = r.DaemonCPUSeconds * 1e3 / float64(n*h.w.Deployments)
	}
	after, err := apiCounts(ctx, admin)
	if err != nil {
		return r, err
	}
	for _, res := range statusResources {
		r.Lists[res] = int(after[res].lists - before[res].lists)
	}
	return r, nil
}

// applierRules are what an applier's WatchStatus reads in its namespace:
// its Deployments and, for their status, their ReplicaSets and Pods.
var applierRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"apps"}, Resources: []string{"deployments", "replicasets"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
}

// applierToken gives the applier of ns a ServiceAccount allowed
// applierRules there and writes a token of it for informerd to a file.
func (h *statusHarness) applierToken(ctx context.Context, admin *kubernetes.Clientset, ns string) (string, error) {
	const name = "applier"
	token, err := controlplane.ServiceAccountToken(ctx, admin, ns, name, "informerd")
	if err != nil {
		return "", err
	}
	if err := controlplane.Grant(ctx, admin, ns, name, ns, applierRules...); err != nil {
		return "", err
	}
	path := filepath.Join(h.tokens, ns)
	return path, os.WriteFile(path, []byte(token), 0o600)
}

// sample records the run's peak watches per resource and the daemon's
// peak RSS until ctx ends.
func (h *statusHarness) sample(ctx context.Context, admin *kubernetes.Clientset, d *daemon, before map[string]resourceCounts, r *statusRun) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := apiCounts(ctx, admin); err == nil {
			for _, res := range statusResources {
				r.PeakWatches[res] = max(r.PeakWatches[res], int(c[res].watches-before[res].watches))
			}
		}
		if d != nil {
			if rss, err := procRSS(d.pid()); err == nil {
				r.DaemonPeakRSS = max(r.DaemonPeakRSS, rss)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// resourceCounts are the API server's LIST requests so far and watches
// held now, of one resource.
type resourceCounts struct{ lists, watches float64 }

func apiCounts(ctx context.Context, admin *kubernetes.Clientset) (map[string]resourceCounts, error) {
	b, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]resourceCounts{}
	for _, res := range statusResources {
		sel := `resource="` + res + `"`
		out[res] = resourceCounts{
			lists:   metricSum(b, "apiserver_request_total", `verb="LIST"`, sel),
			watches: metricSum(b, "apiserver_longrunning_requests", `verb="WATCH"`, sel),
		}
	}
	return out, nil
}

// runApplierProcess runs one applier process and reads its result.
func runApplierProcess(ctx context.Context, self string, args []string, res *applierResult) error {
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	decodeErr := json.NewDecoder(bufio.NewReader(stdout)).Decode(res)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("applier %v: %w (%s)", args, err, strings.Join(res.Errors, "; "))
	}
	return decodeErr
}

// deleteNamespaces deletes a run's namespaces and waits until they are
// gone, so that the next run starts from the same cluster.
func (h *statusHarness) deleteNamespaces(admin *kubernetes.Clientset, names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for _, ns := range names {
		_ = admin.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, ns := range names {
			if _, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		say("namespaces %v not deleted: %v", names, err)
	}
}

func (r *statusReport) print(w io.Writer) {
	fmt.Fprintf(w, "\n%s, %d CPUs, %d GiB, %s, Kubernetes %s; %d Deployments per applier, applier QPS %g, kube-controller-manager QPS %d\n\n",
		r.Machine.CPU, r.Machine.CPUs, r.Machine.MemoryGiB, r.Machine.GoVersion, r.Machine.Kubernetes,
		r.Workload.Deployments, r.Workload.ApplierQPS, r.Workload.ControllerQPS)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tappliers\twall s\tapplier wall s (max)\tapplier peak RSS MiB (max)\tapplier alloc MiB (mean)\tapplier mallocs (mean)\tLISTs deploy/rs/pods\tpeak watches deploy/rs/pods\tdaemon peak RSS MiB\tdaemon CPU s\tdaemon CPU s/s\tdaemon CPU ms/Deployment\t")
	for _, run := range r.Runs {
		var wall, rss float64
		var alloc, mallocs float64
		for _, res := range run.Results {
			wall, rss = max(wall, res.WallSeconds), max(rss, float64(res.PeakRSS)/(1<<20))
			alloc += float64(res.TotalAlloc) / (1 << 20) / float64(len(run.Results))
			mallocs += float64(res.Mallocs) / float64(len(run.Results))
		}
		daemon := "-\t-\t-\t-"
		if run.Mode == applierInformerd || run.Mode == applierInformerdMapper {
			daemon = fmt.Sprintf("%.1f\t%.2f\t%.2f\t%.1f", float64(run.DaemonPeakRSS)/(1<<20), run.DaemonCPUSeconds, run.DaemonCPUPerSecond, run.DaemonCPUMillisPerDeployment)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%s\t%s\t%s\t\n", run.Mode, run.Appliers, run.WallSeconds, wall, rss, alloc, mallocs,
			joinCounts(run.Lists), joinCounts(run.PeakWatches), daemon)
	}
	_ = tw.Flush()
}

func joinCounts(m map[string]int) string {
	var s []string
	for _, res := range statusResources {
		s = append(s, strconv.Itoa(m[res]))
	}
	return strings.Join(s, "/")
}
