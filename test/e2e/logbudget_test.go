package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestLogBudgetKeepsTheChartsMemoryLimit: the daemon, run with the memory
// settings deploy/ gives its container (and so the chart, which
// TestHelmChartMatchesKustomize holds to them: GOMEMLIMIT, and the default
// -max-log-bytes-total that follows from it), holds big ConfigMaps in
// several informers, most of its Go memory limit, and churns them well past
// what its event logs may hold together; its anonymous memory (what an OOM kill at the container's limit counts;
// the binary's pages can be dropped) stays under the container's memory
// limit. A bystander watching the churned namespace is served through it
// to the last write, without a RESET.
//
// INFORMERD_E2E_LOGBUDGET_WRITES sets the writes (default 150, of 900 KiB
// each), INFORMERD_E2E_LOGBUDGET_OBJECTS the ConfigMaps they go to (40);
// INFORMERD_E2E_LOGBUDGET_FLAGS adds daemon flags, for contrast
// (-max-log-bytes-total=1073741824 is expected to fail the test).
func TestLogBudgetKeepsTheChartsMemoryLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	writes := 150
	if v := os.Getenv("INFORMERD_E2E_LOGBUDGET_WRITES"); v != "" {
		writes, _ = strconv.Atoi(v)
	}
	extra := strings.Fields(os.Getenv("INFORMERD_E2E_LOGBUDGET_FLAGS"))
	chart := readDeployedMemory(t)

	// objects ConfigMaps of 900 KiB, written in turn. Besides the
	// bystander's informer of the namespace, informers-1 informers of
	// field selectors that match them all (an informer each, with a store
	// and a log of its own) receive every write. The stores hold 8 x 35
	// MiB, most of the Go memory limit; the logs together would hold 8 x
	// 64 MiB (-log-max-bytes each) if the budget did not bound them.
	const informers = 8
	objects := 40
	if v := os.Getenv("INFORMERD_E2E_LOGBUDGET_OBJECTS"); v != "" {
		objects, _ = strconv.Atoi(v)
	}
	body := strings.Repeat("informerd ", 900<<10/10)
	ns := createNamespace(ctx, t, "logbudget")
	for i := range objects {
		createConfigMap(ctx, t, ns, fmt.Sprintf("big-%d", i), map[string]string{"n": "0", "body": body})
	}

	logs, err := os.Create(filepath.Join(t.TempDir(), "informerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	flags := append(append(chart.flags, "-log-level", "info"), extra...)
	d := startDaemonProcessEnv(t, filepath.Join(t.TempDir(), "informerd.sock"), logs, chart.env, flags...)
	pid := d.cmd.Process.Pid
	goLimit, budget := memoryLine(t, logs.Name())
	churned := int64(writes) * int64(len(body))
	t.Logf("container limit %d MiB, %v, flags %q: the daemon's Go memory limit %d MiB, -max-log-bytes-total %d MiB",
		chart.limit>>20, chart.env, flags, goLimit>>20, budget>>20)
	if len(extra) == 0 && budget != goLimit/4 {
		t.Fatalf("-max-log-bytes-total %d, want a quarter of the Go memory limit %d", budget, goLimit)
	}
	if len(extra) == 0 && informers*churned <= 2*budget {
		t.Fatalf("%d writes of %d bytes to %d informers do not exceed twice the log budget (%d bytes): the test would prove nothing",
			writes, len(body), informers, budget)
	}

	bystander := readEvents(ctx, t, dialSocket(t, d.socket, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "bystander"})
	readers := []*eventReader{bystander}
	for i := range informers - 1 {
		c := dialSocket(t, d.socket, reads(configMaps, ns))
		readers = append(readers, readEvents(ctx, t, c, client.WatchOptions{
			Resource: configMaps, Namespace: ns, FieldSelector: fmt.Sprintf("metadata.name!=none-%d", i), ClientName: fmt.Sprintf("churn-%d", i)}))
	}
	for _, r := range readers {
		r.waitSynced(ctx, t)
	}

	// 435.2 MiB: InformerdMemoryHigh's threshold (deploy/components/monitoring).
	const alertAt = 512 << 20 * 85 / 100
	stopSampling := sampleMemory(t, pid, alertAt)
	cpuBefore := cpuSeconds(t, pid)
	start := time.Now()
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	var newest uint64
	for w := range writes {
		patch := fmt.Sprintf(`{"data":{"n":%q}}`, strconv.Itoa(w+1))
		cm, err := cms.Patch(ctx, fmt.Sprintf("big-%d", w%objects), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("write %d: %v", w, err)
		}
		newest, _ = strconv.ParseUint(cm.ResourceVersion, 10, 64)
	}
	wrote := time.Since(start)
	for _, r := range readers {
		r.waitPast(ctx, t, newest)
	}
	served := time.Since(start)
	peaks := stopSampling()
	cpu := cpuSeconds(t, pid) - cpuBefore
	end := procStatus(t, pid)

	t.Logf("churned %d writes of %d KiB (%.1f MiB; %.1f MiB through %d informers) in %s, all served in %s; daemon CPU %.2f s",
		writes, len(body)>>10, float64(churned)/(1<<20), float64(informers*churned)/(1<<20), informers, wrote.Round(time.Millisecond), served.Round(time.Millisecond), cpu)
	t.Logf("peak RssAnon %.1f MiB, peak VmRSS %.1f MiB (%d samples), VmHWM %.1f MiB (RssFile %.1f MiB at the end), against the container's %d MiB; VmRSS above InformerdMemoryHigh's %.1f MiB for %s",
		mib(peaks.anon), mib(peaks.rss), peaks.samples, mib(end["VmHWM"]), mib(end["RssFile"]), chart.limit>>20, mib(alertAt), peaks.rssOver.Round(time.Millisecond))
	for _, r := range readers {
		if n := r.resets(); n > 0 {
			t.Errorf("%s got %d RESETs", r.name, n)
		}
	}
	if peaks.anon >= chart.limit {
		t.Errorf("the daemon's anonymous memory peaked at %.1f MiB, over the container's memory limit of %d MiB: it would be OOM-killed", mib(peaks.anon), chart.limit>>20)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// deployedMemory is what deploy/base/daemonset.yaml gives the daemon's
// container.
type deployedMemory struct {
	limit int64    // resources.limits.memory
	env   []string // GOMEMLIMIT=..., if set
	flags []string // its args, but for those that say where it serves
}

func readDeployedMemory(t *testing.T) deployedMemory {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(self), "..", "..", "deploy", "base", "daemonset.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "informerd" {
			continue
		}
		m := deployedMemory{limit: c.Resources.Limits.Memory().Value()}
		if m.limit == 0 {
			t.Fatalf("%s: the container informerd has no memory limit", path)
		}
		for _, e := range c.Env {
			switch {
			case e.Name != "GOMEMLIMIT":
			case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
				m.env = append(m.env, fmt.Sprintf("GOMEMLIMIT=%d", m.limit))
			case e.ValueFrom == nil:
				m.env = append(m.env, "GOMEMLIMIT="+e.Value)
			default:
				t.Fatalf("%s: GOMEMLIMIT from %v: the test cannot tell what the kubelet would set", path, e.ValueFrom)
			}
		}
		for _, a := range c.Args {
			switch strings.SplitN(strings.TrimLeft(a, "-"), "=", 2)[0] {
			case "socket", "node-name", "health-address":
			default:
				m.flags = append(m.flags, a)
			}
		}
		return m
	}
	t.Fatalf("%s: no container informerd", path)
	return deployedMemory{}
}

var memoryLineRE = regexp.MustCompile(`msg="memory limits".* go-memory-limit=(\d+) .*max-log-bytes-total=(\d+)`)

// memoryLine returns the Go memory limit and the log budget the daemon
// says it chose at start, from its text log.
func memoryLine(t *testing.T, logs string) (goLimit, budget int64) {
	t.Helper()
	b, err := os.ReadFile(logs)
	if err != nil {
		t.Fatal(err)
	}
	m := memoryLineRE.FindSubmatch(b)
	if m == nil {
		t.Fatalf("the daemon did not log its memory limits:\n%s", b)
	}
	goLimit, _ = strconv.ParseInt(string(m[1]), 10, 64)
	budget, _ = strconv.ParseInt(string(m[2]), 10, 64)
	return goLimit, budget
}

// eventReader reads a stream until the test ends, remembering its
// position and the RESETs it got.
type eventReader struct {
	name    string
	mu      sync.Mutex // guards the fields below
	pos     uint64     // the resourceVersion of the last event
	synced  bool
	nresets int
	err     error         // the error that ended the stream
	changed chan struct{} // closed and replaced whenever the above change
}

func readEvents(ctx context.Context, t *testing.T, c *client.Client, opts client.WatchOptions) *eventReader {
	t.Helper()
	s, err := c.Stream(ctx, opts, "")
	if err != nil {
		t.Fatal(err)
	}
	r := &eventReader{name: opts.ClientName, changed: make(chan struct{})}
	done := make(chan struct{})
	go func() { // ends when the stream does
		defer close(done)
		for {
			evs, err := s.Recv()
			r.mu.Lock()
			r.err = err
			for _, ev := range evs {
				switch ev.GetType() {
				case informerdv1.EventType_EVENT_TYPE_RESET:
					r.nresets++
				case informerdv1.EventType_EVENT_TYPE_SYNCED:
					r.synced = true
				}
				if rv, err := strconv.ParseUint(ev.GetResourceVersion(), 10, 64); err == nil {
					r.pos = max(r.pos, rv)
				}
			}
			close(r.changed)
			r.changed = make(chan struct{})
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { s.Close(); <-done })
	return r
}

func (r *eventReader) resets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nresets
}

// wait returns once cond holds of r, failing the test if the stream ends
// first.
func (r *eventReader) wait(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for {
		r.mu.Lock()
		ok, err, ch, pos := cond(), r.err, r.changed, r.pos
		r.mu.Unlock()
		switch {
		case ok:
			return
		case err != nil:
			t.Fatalf("%s: %s: the stream ended first: %v", r.name, what, err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("%s: %s: never happened (at resourceVersion %d)", r.name, what, pos)
		}
	}
}

func (r *eventReader) waitSynced(ctx context.Context, t *testing.T) {
	t.Helper()
	r.wait(ctx, t, "SYNCED", func() bool { return r.synced })
}

func (r *eventReader) waitPast(ctx context.Context, t *testing.T, rv uint64) {
	t.Helper()
	r.wait(ctx, t, fmt.Sprintf("resourceVersion %d", rv), func() bool { return r.pos >= rv })
}

// memPeaks is what sampleMemory saw.
type memPeaks struct {
	anon, rss int64         // the largest RssAnon and VmRSS
	rssOver   time.Duration // the time VmRSS was above the alert's threshold
	samples   int
}

// sampleMemory reads the process's /proc/<pid>/status every 10 ms until
// the returned function is called, which returns the peaks (the test's
// cleanup calls it too).
func sampleMemory(t *testing.T, pid int, alertAt int64) func() memPeaks {
	quit, res := make(chan struct{}), make(chan memPeaks, 1)
	go func() { // ends when quit is closed
		var p memPeaks
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		prev := time.Now()
		for {
			if st, err := readProcStatus(pid); err == nil {
				p.samples++
				p.anon, p.rss = max(p.anon, st["RssAnon"]), max(p.rss, st["VmRSS"])
				if st["VmRSS"] > alertAt {
					p.rssOver += time.Since(prev)
				}
			}
			prev = time.Now()
			select {
			case <-quit:
				res <- p
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	var peaks memPeaks
	stop := func() memPeaks {
		once.Do(func() { close(quit); peaks = <-res })
		return peaks
	}
	t.Cleanup(func() { stop() })
	return stop
}

// readProcStatus returns the sizes (in bytes) of /proc/<pid>/status.
func readProcStatus(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "VmHWM:	  123456 kB"
		k, v, ok := strings.Cut(sc.Text(), ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			out[k] = n << 10
		}
	}
	return out, sc.Err()
}

func procStatus(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	st, err := readProcStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// cpuSeconds returns the process's user and system CPU time so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command, field 2, may hold spaces; it ends at the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %s", pid, b)
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}
