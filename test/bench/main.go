// Command bench measures what informerd saves against the real control
// plane: the same workload watched by N client processes that each run a
// client-go dynamic informer (direct), and by N processes that share one
// informerd (with and without a local store). See docs/benchmarks.md.
//
// `bench client ...` is the role of one client process; the harness starts
// itself in that role.
//
// `bench status` measures cli-utils appliers waiting for their Deployments
// through informerd's WatchStatus vs through cli-utils' DefaultStatusWatcher
// (status.go); `bench applier ...` is the role of one applier process.
//
// `bench idle` measures what idle Watch, WatchStatus and WatchAddress
// streams cost the daemon: CPU, goroutines and memory while nothing
// changes (idle.go); `bench idler ...` is the role of one process holding
// such streams.
//
// `bench fleet` simulates K nodes, each with its own informerd and 5
// local consumers, against the same consumers direct: the API server's
// cost, a rolling upgrade of the daemons and an API server restart
// (fleet.go); `bench fleetnodes ...` is the role of one process holding
// some nodes' consumers (fleetnode.go).
//
// `bench memory` measures the daemon's live heap and RSS per stored Pod at
// 10,000 and 30,000 Pods, stored as JSON, as protobuf and behind the
// metadata view, what the address view adds per Pod, and client-go Pod
// informers beside them (memory.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/informerd/informerd/test/controlplane"
)

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "client":
		err = runClient(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "status":
		err = runStatusBench(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "applier":
		err = runApplier(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "idle":
		err = runIdleBench(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "idler":
		err = runIdler(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "fleet":
		err = runFleetBench(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "fleetnodes":
		err = runFleetNodes(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "memory":
		err = runMemoryBench(os.Args[2:])
	default:
		err = run()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// workload is what one benchmark run creates and changes.
type workload struct {
	ConfigMaps int           `json:"configMaps"`
	ObjectSize int           `json:"configMapBytes"`
	Pods       int           `json:"pods"`
	Updates    int           `json:"updates"`
	Rate       int           `json:"updatesPerSecond"`
	Clients    []int         `json:"clients"`
	Modes      []string      `json:"modes"`
	Timeout    time.Duration `json:"-"`
	// IdleWindow is how long the daemon's CPU is measured with every
	// client synced, before the updates.
	IdleWindow        time.Duration `json:"-"`
	IdleWindowSeconds float64       `json:"idleWindowSeconds"`
}

func run() error {
	quick := os.Getenv("BENCH_QUICK") == "1"
	w := workload{ConfigMaps: 10000, ObjectSize: 1024, Pods: 5000, Updates: 3000, Rate: 100, Clients: []int{1, 10, 50}, IdleWindow: 5 * time.Second}
	if quick {
		w = workload{ConfigMaps: 1000, ObjectSize: 1024, Pods: 500, Updates: 300, Rate: 100, Clients: []int{1, 10}, IdleWindow: 5 * time.Second}
	}
	bin := flag.String("bin", "_output/bin", "directory with the informerd binary")
	out := flag.String("out", "_output/bench/results.json", "where to write the results as JSON")
	flag.IntVar(&w.ConfigMaps, "configmaps", w.ConfigMaps, "ConfigMaps to create")
	flag.IntVar(&w.ObjectSize, "configmap-bytes", w.ObjectSize, "payload bytes per ConfigMap")
	flag.IntVar(&w.Pods, "pods", w.Pods, "Pods to create (Running on a kwok node)")
	flag.IntVar(&w.Updates, "updates", w.Updates, "ConfigMap updates per run, each stamped with its write time")
	flag.IntVar(&w.Rate, "rate", w.Rate, "updates per second")
	clients := flag.String("clients", joinInts(w.Clients), "comma-separated numbers of client processes")
	modeList := flag.String("modes", strings.Join(modes, ","), "comma-separated modes to run")
	flag.DurationVar(&w.Timeout, "timeout", 10*time.Minute, "longest wait for the clients of one run to sync")
	flag.DurationVar(&w.IdleWindow, "idle-window", w.IdleWindow, "how long the daemon's CPU is measured with every client synced and nothing changing, before the updates")
	flag.Parse()
	w.IdleWindowSeconds = w.IdleWindow.Seconds()
	var err error
	if w.Clients, err = parseInts(*clients); err != nil {
		return fmt.Errorf("-clients: %w", err)
	}
	w.Modes = strings.Split(*modeList, ",")
	for _, m := range w.Modes {
		if !slices.Contains(modes, m) {
			return fmt.Errorf("-modes: unknown mode %q (want one of %s)", m, strings.Join(modes, ", "))
		}
	}
	if w.ConfigMaps < 1 || w.Updates < 1 || w.Rate < 1 || w.Pods < 0 || w.IdleWindow <= 0 {
		return errors.New("-configmaps, -updates and -rate must be at least 1, -pods at least 0, -idle-window positive")
	}
	env, err := startBench(*bin, "etcd, kube-apiserver, kwok with one fake node", controlplane.Options{FakeNode: true})
	if err != nil {
		return err
	}
	defer env.close()
	ctx, cp, informerd, self := env.ctx, env.cp, env.informerd, env.self
	h := &harness{cp: cp, w: w, self: self, informerd: informerd}
	if err := h.populate(ctx); err != nil {
		return err
	}
	if err := h.identities(ctx); err != nil {
		return err
	}
	defer os.RemoveAll(h.tokens)

	rep := report{Machine: describeMachine(cp), Workload: w, Command: commandLine()}
	for _, n := range w.Clients {
		for _, mode := range w.Modes {
			say("run: %s, %d clients", mode, n)
			r, err := h.runOnce(ctx, mode, n)
			if err != nil {
				return fmt.Errorf("%s with %d clients: %w", mode, n, err)
			}
			rep.Runs = append(rep.Runs, r)
		}
	}
	say("snapshot: a new client's snapshot of the %d ConfigMaps vs a direct LIST", w.ConfigMaps)
	if rep.Snapshot, err = h.snapshot(ctx); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	rep.summarize()
	rep.print(os.Stdout)
	return writeReport(*out, rep)
}

// benchEnv is what each benchmark starts from: the informerd binary and
// this one, a context that SIGINT and SIGTERM end, and a control plane.
type benchEnv struct {
	ctx             context.Context
	stop            context.CancelFunc
	cp              *controlplane.ControlPlane
	informerd, self string
}

// startBench finds the binaries in bin and starts a control plane with
// opts (what names its parts, for the log); close stops it.
func startBench(bin, what string, opts controlplane.Options) (*benchEnv, error) {
	informerd, self, err := binaries(bin)
	if err != nil {
		return nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	say("starting the control plane (%s)", what)
	cp, err := controlplane.Start(ctx, opts)
	if err != nil {
		stop()
		return nil, err
	}
	return &benchEnv{ctx: ctx, stop: stop, cp: cp, informerd: informerd, self: self}, nil
}

func (e *benchEnv) close() {
	e.cp.Stop()
	e.stop()
}

// binaries returns the informerd binary in bin and this one.
func binaries(bin string) (informerd, self string, err error) {
	informerd, err = filepath.Abs(filepath.Join(bin, "informerd"))
	if err != nil {
		return "", "", err
	}
	if _, err := os.Stat(informerd); err != nil {
		return "", "", fmt.Errorf("-bin: %w (run make build)", err)
	}
	self, err = os.Executable()
	return informerd, self, err
}

// writeReport writes rep as indented JSON to path.
func writeReport(path string, rep any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	say("wrote %s", path)
	return nil
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench %s: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func commandLine() string {
	cmd := "make bench"
	if os.Getenv("BENCH_QUICK") == "1" {
		cmd = "make bench BENCH_QUICK=1"
	}
	return makeCommand(cmd, "BENCH_FLAGS", os.Args[1:])
}

// makeCommand is the make command line that runs the harness with args:
// cmd, then variable='args' without the -bin the Makefile passes.
func makeCommand(cmd, variable string, args []string) string {
	var user []string
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "-bin" || args[i] == "--bin":
			i++ // and its value
		case strings.HasPrefix(args[i], "-bin=") || strings.HasPrefix(args[i], "--bin="):
		default:
			user = append(user, args[i])
		}
	}
	if len(user) == 0 {
		return cmd
	}
	return cmd + " " + variable + "='" + strings.Join(user, " ") + "'"
}

// machine describes where the numbers come from.
type machine struct {
	CPU        string `json:"cpu"`
	CPUs       int    `json:"cpus"`
	MemoryGiB  int    `json:"memoryGiB"`
	GoVersion  string `json:"goVersion"`
	Kubernetes string `json:"kubernetes"`
	Date       string `json:"date"`
}

func describeMachine(cp *controlplane.ControlPlane) machine {
	m := machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Date: time.Now().UTC().Format(time.DateOnly)}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if mem, err := statusField("/proc/meminfo", "MemTotal:"); err == nil {
		m.MemoryGiB = int((mem + 1<<29) >> 30)
	}
	if v, err := serverVersion(cp); err == nil {
		m.Kubernetes = v
	}
	return m
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
