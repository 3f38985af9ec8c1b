package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/informerd/informerd/test/controlplane"
)

// The kinds of `bench idle`: what the streams of one run are.
const (
	idleBaseline = "baseline" // a daemon with no streams
	idleWatch    = "watch"    // Watch of ConfigMaps or Pods in the namespace
	idleStatus   = "status"   // WatchStatus of a few ConfigMaps and Pods
	idleAddress  = "address"  // WatchAddress of a pod's IP:port
)

var idleKinds = []string{idleBaseline, idleWatch, idleStatus, idleAddress}

// addressPort is the port every WatchAddress stream asks about: the
// benchmark Pods' "http" port.
const addressPort = 8080

// idleWorkload is what `bench idle` runs: for each kind, a daemon of its
// own with Streams streams of that kind, opened by Processes client
// processes, then nothing changes for Window.
type idleWorkload struct {
	Kinds         []string      `json:"kinds"`
	Streams       int           `json:"streamsPerKind"`
	Processes     int           `json:"clientProcesses"`
	ConfigMaps    int           `json:"configMaps"`
	Pods          int           `json:"pods"`
	StatusObjects int           `json:"objectsPerStatusStream"`
	Settle        time.Duration `json:"-"`
	Window        time.Duration `json:"-"`
	SettleSeconds float64       `json:"settleSeconds"`
	WindowSeconds float64       `json:"windowSeconds"`
	DaemonArgs    []string      `json:"daemonArgs,omitempty"`
}

// idleRun is one kind, measured.
type idleRun struct {
	Kind      string `json:"kind"`
	Streams   int    `json:"streams"`
	Processes int    `json:"clientProcesses"`
	// OpenSeconds: from starting the client processes until every stream
	// had its initial state (SYNCED, or the first address answer).
	OpenSeconds float64 `json:"openSeconds,omitempty"`

	// Over the window, which starts Settle after the last stream is open:
	// the daemon's CPU seconds (utime+stime, /proc/<pid>/stat), the same
	// per minute and per stream, the client processes' together, what
	// the clients received, and the daemon's authentication and
	// authorization work (its counters).
	WindowSeconds                  float64 `json:"windowSeconds"`
	DaemonCPUSeconds               float64 `json:"daemonCpuSeconds"`
	DaemonCPUSecondsPerMinute      float64 `json:"daemonCpuSecondsPerMinute"`
	DaemonCPUMillisPerStreamMinute float64 `json:"daemonCpuMillisPerStreamPerMinute,omitempty"`
	ClientsCPUSeconds              float64 `json:"clientsCpuSeconds"`
	ClientsCPUSecondsPerMinute     float64 `json:"clientsCpuSecondsPerMinute"`
	EventsReceived                 int64   `json:"eventsReceived"`
	TokenCacheHits                 float64 `json:"tokenCacheHits"`
	TokenReviews                   float64 `json:"tokenReviews"`
	AccessCacheHits                float64 `json:"accessCacheHits"`
	AccessReviews                  float64 `json:"accessReviews"`
	// DaemonStreams is what the daemon's gauges count open at the end of
	// the window (informerd_streams, _status_streams, _ip_port_subscribers).
	DaemonStreams float64 `json:"daemonStreams"`

	// The daemon's state with no streams (Empty), with the first client
	// process's (First: the informers started) and with all (All, right
	// after the window); per stream is from First to All over the streams
	// the other processes opened (from Empty with one process).
	Empty               daemonState `json:"empty"`
	First               daemonState `json:"first,omitzero"`
	All                 daemonState `json:"all"`
	GoroutinesPerStream float64     `json:"goroutinesPerStream,omitempty"`
	HeapBytesPerStream  float64     `json:"heapBytesPerStream,omitempty"`
	RSSBytesPerStream   float64     `json:"rssBytesPerStream,omitempty"`
}

// daemonState is the daemon's goroutines (go_goroutines), live heap after
// two forced GCs and RSS at one moment.
type daemonState struct {
	Goroutines    int    `json:"goroutines"`
	HeapLiveBytes uint64 `json:"heapLiveBytes"`
	RSSBytes      uint64 `json:"rssBytes"`
}

type idleReport struct {
	Machine  machine      `json:"machine"`
	Workload idleWorkload `json:"workload"`
	Command  string       `json:"command"`
	Runs     []idleRun    `json:"runs"`
}

// runIdleBench is `bench idle`: what idle streams cost the daemon.
func runIdleBench(args []string) error {
	w := idleWorkload{Kinds: idleKinds, Streams: 1000, Processes: 10, ConfigMaps: 100, Pods: 100, StatusObjects: 10,
		Settle: 10 * time.Second, Window: time.Minute}
	fs := flag.NewFlagSet("bench idle", flag.ContinueOnError)
	bin := fs.String("bin", "_output/bin", "directory with the informerd binary")
	out := fs.String("out", "_output/bench/idle.json", "where to write the results as JSON")
	kinds := fs.String("kinds", strings.Join(w.Kinds, ","), "comma-separated kinds to run: "+strings.Join(idleKinds, ", "))
	fs.IntVar(&w.Streams, "streams", w.Streams, "streams of each kind")
	fs.IntVar(&w.Processes, "processes", w.Processes, "client processes that open them, each with a ServiceAccount of its own")
	fs.IntVar(&w.ConfigMaps, "configmaps", w.ConfigMaps, "ConfigMaps to create")
	fs.IntVar(&w.Pods, "pods", w.Pods, "Pods to create (Running on a kwok node, with IPs for WatchAddress)")
	fs.IntVar(&w.StatusObjects, "status-objects", w.StatusObjects, "objects per WatchStatus stream (ConfigMaps and Pods, alternately)")
	fs.DurationVar(&w.Settle, "settle", w.Settle, "wait after every stream is open, before the window")
	fs.DurationVar(&w.Window, "window", w.Window, "the measured window, in which nothing changes")
	daemonArgs := fs.String("daemon-args", "", "extra informerd flags, space-separated (e.g. -authz-allow-ttl=10s to see re-checks in the window)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	w.Kinds = strings.Split(*kinds, ",")
	for _, k := range w.Kinds {
		if !slices.Contains(idleKinds, k) {
			return fmt.Errorf("-kinds: unknown kind %q (want one of %s)", k, strings.Join(idleKinds, ", "))
		}
	}
	switch {
	case w.Streams < 1 || w.Processes < 1 || w.Processes > w.Streams:
		return fmt.Errorf("-streams (%d) and -processes (%d) must be at least 1, with no more processes than streams", w.Streams, w.Processes)
	case (w.Streams+w.Processes-1)/w.Processes > maxIdleStreamsPerProcess:
		// The daemon's -max-streams-per-caller (512) counts a process's
		// streams: it is one ServiceAccount.
		return fmt.Errorf("%d streams in %d processes is more than %d per process: raise -processes", w.Streams, w.Processes, maxIdleStreamsPerProcess)
	case w.ConfigMaps < 1 || w.Pods < 1 || w.StatusObjects < 1:
		return fmt.Errorf("-configmaps, -pods and -status-objects must be at least 1")
	case w.Window <= 0 || w.Settle < 0:
		return fmt.Errorf("-window must be positive, -settle not negative")
	}
	w.SettleSeconds, w.WindowSeconds = w.Settle.Seconds(), w.Window.Seconds()
	w.DaemonArgs = strings.Fields(*daemonArgs)
	env, err := startBench(*bin, "etcd, kube-apiserver, kwok with one fake node", controlplane.Options{FakeNode: true})
	if err != nil {
		return err
	}
	defer env.close()
	ctx, cp, informerd, self := env.ctx, env.cp, env.informerd, env.self
	h := &idleHarness{
		harness: harness{cp: cp, w: workload{ConfigMaps: w.ConfigMaps, ObjectSize: 1024, Pods: w.Pods}, self: self, informerd: informerd},
		w:       w,
	}
	if err := h.populate(ctx); err != nil {
		return err
	}
	if err := h.identities(ctx); err != nil {
		return err
	}
	defer os.RemoveAll(h.tokens)
	if err := h.writeAddresses(ctx); err != nil {
		return err
	}

	rep := idleReport{Machine: describeMachine(cp), Workload: w, Command: makeCommand("make bench-idle", "BENCH_IDLE_FLAGS", args)}
	for _, kind := range w.Kinds {
		say("run: %s, %d streams in %d processes, window %s", kind, w.Streams, w.Processes, w.Window)
		r, err := h.run(ctx, kind)
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		rep.Runs = append(rep.Runs, r)
	}
	rep.print(os.Stdout)
	return writeReport(*out, rep)
}

// maxIdleStreamsPerProcess keeps a client process's streams under the
// daemon's default -max-streams-per-caller (512).
const maxIdleStreamsPerProcess = 500

type idleHarness struct {
	harness
	w         idleWorkload
	addresses string // file of the Pods' IP:port, one a line
}

// idleName is the ServiceAccount of client process i of kind.
func idleName(kind string, i int) string { return fmt.Sprintf("idle-%s-%d", kind, i) }

// identities creates the client processes' ServiceAccounts, each allowed
// only what its kind reads, and the scraper.
func (h *idleHarness) identities(ctx context.Context) error {
	admin := h.admin()
	pods := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}
	for _, kind := range h.w.Kinds {
		if kind == idleBaseline {
			continue
		}
		err := parallel(ctx, h.w.Processes, func(ctx context.Context, i int) error {
			name := idleName(kind, i)
			if _, err := controlplane.ServiceAccountToken(ctx, admin, namespace, name); err != nil {
				return err
			}
			if kind == idleAddress { // WatchAddress reads pods in every namespace
				return controlplane.Grant(ctx, admin, namespace, name, "", pods)
			}
			return controlplane.Grant(ctx, admin, namespace, name, namespace, readRule)
		})
		if err != nil {
			return err
		}
	}
	var err error
	if h.scraper, err = controlplane.ServiceAccountToken(ctx, admin, namespace, "scraper", "informerd"); err != nil {
		return err
	}
	if err := controlplane.Grant(ctx, admin, namespace, "scraper", "", scrapeRule); err != nil {
		return err
	}
	h.tokens, err = os.MkdirTemp("", "informerd-bench-tokens-")
	return err
}

// writeAddresses writes the benchmark Pods' IP:addressPort to a file for
// the address clients.
func (h *idleHarness) writeAddresses(ctx context.Context) error {
	pods, err := h.admin().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var lines []string
	for _, p := range pods.Items {
		if p.Status.PodIP != "" {
			lines = append(lines, p.Status.PodIP+":"+strconv.Itoa(addressPort))
		}
	}
	if len(lines) == 0 {
		return fmt.Errorf("none of the %d Pods has an IP", len(pods.Items))
	}
	h.addresses = filepath.Join(h.tokens, "addresses")
	return os.WriteFile(h.addresses, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// run measures one kind on a daemon of its own.
func (h *idleHarness) run(ctx context.Context, kind string) (idleRun, error) {
	r := idleRun{Kind: kind}
	d, err := startDaemon(ctx, h.informerd, h.cp.KubeconfigPath, h.w.DaemonArgs...)
	if err != nil {
		return r, err
	}
	defer d.stop()
	if r.Empty, err = h.state(ctx, d); err != nil {
		return r, err
	}

	var procs []*clientProc
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	if kind != idleBaseline {
		r.Streams, r.Processes = h.w.Streams, h.w.Processes
		start := time.Now()
		first := 0
		for i := range h.w.Processes {
			n := h.w.Streams / h.w.Processes
			if i < h.w.Streams%h.w.Processes {
				n++
			}
			token, err := h.tokenFile(ctx, idleName(kind, i), "informerd")
			if err != nil {
				return r, err
			}
			p, err := startClient(ctx, h.self, []string{"idler", "-kind", kind, "-socket", d.socket, "-token-file", token,
				"-name", idleName(kind, i), "-namespace", namespace, "-streams", strconv.Itoa(n), "-first", strconv.Itoa(first),
				"-configmaps", strconv.Itoa(h.w.ConfigMaps), "-pods", strconv.Itoa(h.w.Pods),
				"-status-objects", strconv.Itoa(h.w.StatusObjects), "-addresses", h.addresses})
			if err != nil {
				return r, err
			}
			procs = append(procs, p)
			first += n
			// The first process's streams start the informers; what the
			// others add is what a stream costs.
			if i == 0 {
				if err := waitSyncedWithin(ctx, p, 10*time.Minute); err != nil {
					return r, err
				}
				if r.First, err = h.state(ctx, d); err != nil {
					return r, err
				}
			}
		}
		for _, p := range procs[1:] {
			if err := waitSyncedWithin(ctx, p, 10*time.Minute); err != nil {
				return r, err
			}
		}
		r.OpenSeconds = time.Since(start).Seconds()
	}

	if err := sleep(ctx, h.w.Settle); err != nil {
		return r, err
	}
	m0, err := scrape(ctx, d.metrics+"/metrics", h.scraper)
	if err != nil {
		return r, err
	}
	cpu0, err := d.cpu()
	if err != nil {
		return r, err
	}
	clients0 := clientsCPU(procs)
	if err := tell(procs, "start"); err != nil {
		return r, err
	}
	start := time.Now()
	if err := sleep(ctx, h.w.Window); err != nil {
		return r, err
	}
	cpu1, err := d.cpu()
	if err != nil {
		return r, err
	}
	r.WindowSeconds = time.Since(start).Seconds()
	clients1 := clientsCPU(procs)
	if err := tell(procs, "stop"); err != nil {
		return r, err
	}
	m1, err := scrape(ctx, d.metrics+"/metrics", h.scraper)
	if err != nil {
		return r, err
	}
	r.DaemonCPUSeconds, r.ClientsCPUSeconds = cpu1-cpu0, clients1-clients0
	delta := func(name string) float64 { return metricSum(m1, name) - metricSum(m0, name) }
	r.TokenCacheHits, r.TokenReviews = delta("informerd_token_cache_hits_total"), delta("informerd_token_reviews_total")
	r.AccessCacheHits, r.AccessReviews = delta("informerd_access_cache_hits_total"), delta("informerd_access_reviews_total")
	r.DaemonStreams = metricSum(m1, "informerd_streams") + metricSum(m1, "informerd_status_streams") + metricSum(m1, "informerd_ip_port_subscribers")
	if r.All, err = h.state(ctx, d); err != nil { // before the clients leave
		return r, err
	}
	for _, p := range procs {
		res, err := p.idleResult()
		if err != nil {
			return r, err
		}
		r.EventsReceived += res.Events
	}
	r.derive()
	return r, nil
}

// derive computes the per-minute and per-stream figures of r from what
// was measured.
func (r *idleRun) derive() {
	perMinute := 60 / r.WindowSeconds
	r.DaemonCPUSecondsPerMinute = r.DaemonCPUSeconds * perMinute
	r.ClientsCPUSecondsPerMinute = r.ClientsCPUSeconds * perMinute
	if r.Streams == 0 {
		return
	}
	r.DaemonCPUMillisPerStreamMinute = r.DaemonCPUSecondsPerMinute * 1000 / float64(r.Streams)
	// The first process opened ceil(Streams/Processes) streams.
	from, n := r.First, r.Streams-(r.Streams+r.Processes-1)/r.Processes
	if r.Processes == 1 {
		from, n = r.Empty, r.Streams
	}
	r.GoroutinesPerStream = float64(r.All.Goroutines-from.Goroutines) / float64(n)
	r.HeapBytesPerStream = (float64(r.All.HeapLiveBytes) - float64(from.HeapLiveBytes)) / float64(n)
	r.RSSBytesPerStream = (float64(r.All.RSSBytes) - float64(from.RSSBytes)) / float64(n)
}

// state reads the daemon's goroutines, live heap (two forced GCs) and RSS.
func (h *idleHarness) state(ctx context.Context, d *daemon) (daemonState, error) {
	var s daemonState
	b, err := scrape(ctx, d.metrics+"/metrics", h.scraper)
	if err != nil {
		return s, err
	}
	s.Goroutines = int(metricSum(b, "go_goroutines"))
	if s.HeapLiveBytes, err = d.heapLive(ctx, h.scraper); err != nil {
		return s, err
	}
	s.RSSBytes, err = procRSS(d.pid())
	return s, err
}

// tell writes a line to every idle client: "start" or "stop" counting
// what arrives.
func tell(procs []*clientProc, line string) error {
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
			return fmt.Errorf("client %d: %w", p.cmd.Process.Pid, err)
		}
	}
	return nil
}

// clientsCPU adds up the CPU seconds of procs (0 for any that is gone).
func clientsCPU(procs []*clientProc) float64 {
	total := 0.0
	for _, p := range procs {
		if s, err := procCPUSeconds(p.cmd.Process.Pid); err == nil {
			total += s
		}
	}
	return total
}

func waitSyncedWithin(ctx context.Context, p *clientProc, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return p.waitSynced(ctx)
}

func (r *idleReport) print(w io.Writer) {
	m, wl := r.Machine, r.Workload
	fmt.Fprintf(w, "\nmachine: %s, %d CPUs, %d GiB, %s, Kubernetes %s, %s\n", m.CPU, m.CPUs, m.MemoryGiB, m.GoVersion, m.Kubernetes, m.Date)
	fmt.Fprintf(w, "workload: %d streams per kind in %d client processes; %d ConfigMaps, %d Pods, %d objects per status stream; settle %s, window %s; command: %s\n\n",
		wl.Streams, wl.Processes, wl.ConfigMaps, wl.Pods, wl.StatusObjects, wl.Settle, wl.Window, r.Command)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\tstreams\topen s\tdaemon CPU s/min\tclients CPU s/min\tevents in window\ttoken cache hits\taccess cache hits\treviews\tgoroutines\tgoroutines/stream\theap B/stream\tRSS MiB\tRSS B/stream\t")
	for _, x := range r.Runs {
		perStream := func(v float64, format string) string {
			if x.Streams == 0 {
				return "-"
			}
			return fmt.Sprintf(format, v)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.2f\t%s\t%d\t%.0f\t%.0f\t%.0f\t%d\t%s\t%s\t%.1f\t%s\t\n",
			x.Kind, x.Streams, perStream(x.OpenSeconds, "%.1f"), x.DaemonCPUSecondsPerMinute, perStream(x.ClientsCPUSecondsPerMinute, "%.2f"),
			x.EventsReceived, x.TokenCacheHits, x.AccessCacheHits, x.TokenReviews+x.AccessReviews, x.All.Goroutines,
			perStream(x.GoroutinesPerStream, "%.2f"), perStream(x.HeapBytesPerStream, "%.0f"),
			float64(x.All.RSSBytes)/(1<<20), perStream(x.RSSBytesPerStream, "%.0f"))
	}
	_ = tw.Flush()
}
