package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

const namespace = "bench"

// harness runs the benchmark's phases against one control plane.
type harness struct {
	cp        *controlplane.ControlPlane
	w         workload
	self      string // this binary, started in the client role
	informerd string
	// tokens holds the clients' token files; scraper may get the daemon's
	// /metrics and heap profile.
	tokens  string
	scraper string
}

// Every client is a ServiceAccount of its own that may list and watch the
// benchmark's resources in its namespace and nothing else, for informerd
// as for the API server; the harness's own reader and scraper likewise.
var (
	readRule   = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps", "pods"}, Verbs: []string{"list", "watch"}}
	scrapeRule = rbacv1.PolicyRule{NonResourceURLs: []string{"/metrics", "/debug/pprof/heap"}, Verbs: []string{"get"}}
)

// identities creates the ServiceAccounts of the clients and of the
// harness, with their grants.
func (h *harness) identities(ctx context.Context) error {
	admin := h.admin()
	n := slices.Max(h.w.Clients)
	err := parallel(ctx, n+1, func(ctx context.Context, i int) error {
		name := clientName(i)
		if i == n {
			name = "snapshot"
		}
		if _, err := controlplane.ServiceAccountToken(ctx, admin, namespace, name); err != nil {
			return err
		}
		return controlplane.Grant(ctx, admin, namespace, name, namespace, readRule)
	})
	if err != nil {
		return err
	}
	if h.scraper, err = controlplane.ServiceAccountToken(ctx, admin, namespace, "scraper", "informerd"); err != nil {
		return err
	}
	if err := controlplane.Grant(ctx, admin, namespace, "scraper", "", scrapeRule); err != nil {
		return err
	}
	h.tokens, err = os.MkdirTemp("", "informerd-bench-tokens-")
	return err
}

func clientName(i int) string { return fmt.Sprintf("client-%d", i) }

// tokenFile mints a token of ServiceAccount name for audience ("" for the
// API server) and writes it to a file.
func (h *harness) tokenFile(ctx context.Context, name, audience string) (string, error) {
	var auds []string
	if audience != "" {
		auds = []string{audience}
	}
	token, err := controlplane.ServiceAccountToken(ctx, h.admin(), namespace, name, auds...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(h.tokens, name+"-"+audience)
	return path, os.WriteFile(path, []byte(token), 0o600)
}

func (h *harness) admin() *kubernetes.Clientset {
	cfg := h.cp.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	return kubernetes.NewForConfigOrDie(cfg)
}

func serverVersion(cp *controlplane.ControlPlane) (string, error) {
	v, err := kubernetes.NewForConfigOrDie(cp.RESTConfig()).Discovery().ServerVersion()
	if err != nil {
		return "", err
	}
	return v.GitVersion, nil
}

// populate creates the namespace, the ConfigMaps and the Pods, and waits
// until kwok has made every Pod Running, so that runs see only the writer's
// changes.
func (h *harness) populate(ctx context.Context) error {
	admin := h.admin()
	start := time.Now()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// Pods need their ServiceAccount; no controller-manager makes it here.
	if _, err := admin.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	say("creating %d ConfigMaps of %d bytes and %d Pods", h.w.ConfigMaps, h.w.ObjectSize, h.w.Pods)
	err := parallel(ctx, h.w.ConfigMaps, func(ctx context.Context, i int) error {
		_, err := admin.CoreV1().ConfigMaps(namespace).Create(ctx, benchConfigMap(i, h.w.ObjectSize), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	if err := parallel(ctx, h.w.Pods, func(ctx context.Context, i int) error {
		_, err := admin.CoreV1().Pods(namespace).Create(ctx, benchPod(i), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 5*time.Second, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		// No limit: a page of a filtered list may be empty and still
		// have a continuation.
		l, err := admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Running"})
		if err == nil && len(l.Items) > 0 {
			say("%d of %d Pods are not Running yet", len(l.Items), h.w.Pods)
		}
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the pods to run: %w", err)
	}
	say("created in %s", time.Since(start).Round(time.Second))
	return nil
}

func cmName(i int) string { return fmt.Sprintf("cm-%05d", i) }

// parallel runs fn for 0..n-1 on 16 workers and returns the first error.
func parallel(ctx context.Context, n int, fn func(context.Context, int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error { return fn(ctx, i) })
	}
	return g.Wait()
}

// benchConfigMap is ConfigMap i of the workload: a payload of size bytes
// and two labels, the second spreading them over 16 shards.
func benchConfigMap(i, size int) *corev1.ConfigMap {
	payload := make([]byte, size)
	for j := range payload {
		payload[j] = 'a' + byte(j*7%26)
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cmName(i), Labels: map[string]string{"app": "bench", "shard": strconv.Itoa(i % 16)}},
		Data:       map[string]string{"payload": string(payload)},
	}
}

// benchPod is a Pod as a Deployment would make it: two containers with
// ports, env, resources, probes and mounts, bound to the fake node.
func benchPod(i int) *corev1.Pod {
	app := fmt.Sprintf("web-%02d", i%50)
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	probe := &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
		InitialDelaySeconds: 5, PeriodSeconds: 10,
	}
	var env []corev1.EnvVar
	for _, k := range []string{"LOG_LEVEL", "REGION", "FEATURE_FLAGS", "UPSTREAM_URL", "CACHE_SIZE"} {
		env = append(env, corev1.EnvVar{Name: k, Value: strings.ToLower(k) + "-value-" + app})
	}
	env = append(env, corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}})
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   fmt.Sprintf("%s-%05d", app, i),
			Labels: map[string]string{"app": app, "tier": "frontend", "pod-template-hash": "7d9f8c6b5"},
			Annotations: map[string]string{
				"prometheus.io/scrape": "true", "prometheus.io/port": "9090",
			},
		},
		Spec: corev1.PodSpec{
			NodeName:    controlplane.FakeNodeName,
			Tolerations: []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{
				{
					Name: "app", Image: "registry.example.com/team/" + app + ":v1.42.0",
					Args:  []string{"--listen=:8080", "--metrics=:9090"},
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}},
					Env:   env, Resources: res, ReadinessProbe: probe, LivenessProbe: probe,
					VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}},
				},
				{
					Name: "proxy", Image: "registry.example.com/mesh/proxy:v2.7.1",
					Ports:     []corev1.ContainerPort{{Name: "proxy", ContainerPort: 4143}},
					Resources: res,
				},
			},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
				ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cmName(i)}},
			}}},
		},
	}
}

// runResult is one mode at one client count.
type runResult struct {
	Mode    string `json:"mode"`
	Clients int    `json:"clients"`
	// Upstream cost: requests the API server served for configmaps and
	// pods during the run (its apiserver_request_total), and its CPU.
	UpstreamLists   int `json:"upstreamLists"`
	UpstreamWatches int `json:"upstreamWatches"`
	// DaemonLists and DaemonWatches are the daemon's own count of the
	// lists (LIST or WatchList) and watches it sent: the API server's
	// counts above also hold kwok's and other clients' requests.
	DaemonLists         int     `json:"daemonLists,omitempty"`
	DaemonWatches       int     `json:"daemonWatches,omitempty"`
	APIServerCPUSeconds float64 `json:"apiserverCpuSeconds"`
	// Node cost: every client process plus the daemon, at the end of the
	// run (every delivery made).
	NodeCPUSeconds   float64 `json:"nodeCpuSeconds"`
	NodeRSSBytes     uint64  `json:"nodeRssBytes"`
	DaemonCPUSeconds float64 `json:"daemonCpuSeconds,omitempty"`
	DaemonRSSBytes   uint64  `json:"daemonRssBytes,omitempty"`
	// The daemon's CPU seconds (utime+stime) by phase, so that a loop
	// that spins cannot hide in a total: per minute over IdleWindow with
	// every client synced and nothing changing; over the updates (first
	// write to every client's last delivery), in all and per delivery.
	DaemonIdleCPUSecondsPerMinute float64 `json:"daemonIdleCpuSecondsPerMinute,omitempty"`
	DaemonUpdatesCPUSeconds       float64 `json:"daemonUpdatesCpuSeconds,omitempty"`
	DaemonCPUMicrosPerDelivery    float64 `json:"daemonCpuMicrosPerDelivery,omitempty"`
	// DaemonHeapLiveBytes is the daemon's live heap (go_gc_heap_live_bytes)
	// with every client synced; DaemonHeapPerObject subtracts its live heap
	// before any client came.
	DaemonHeapLiveBytes uint64  `json:"daemonHeapLiveBytes,omitempty"`
	DaemonHeapPerObject float64 `json:"daemonHeapPerObject,omitempty"`
	// ClientHeapPerObject is the median client's live heap growth from
	// start to sync, per object it holds.
	ClientHeapPerObject float64 `json:"clientHeapPerObject"`
	SyncSecondsMedian   float64 `json:"syncSecondsMedian"`
	SyncSecondsMax      float64 `json:"syncSecondsMax"`
	LatencyP50Millis    float64 `json:"latencyP50Millis"`
	LatencyP99Millis    float64 `json:"latencyP99Millis"`
	LatencyMaxMillis    float64 `json:"latencyMaxMillis"`
	// Deliveries counts stamped updates received across clients;
	// Missed is how many of Updates x Clients never arrived.
	Deliveries int     `json:"deliveries"`
	Missed     int     `json:"missed"`
	EventsPerS float64 `json:"deliveriesPerSecond"`
}

// runOnce measures one mode with n client processes: start them, wait
// until all are synced, write the updates at the fixed rate, collect.
func (h *harness) runOnce(ctx context.Context, mode string, n int) (runResult, error) {
	r := runResult{Mode: mode, Clients: n}
	admin := h.admin()
	before, err := upstreamCounts(ctx, admin)
	if err != nil {
		return r, err
	}
	apiPID := h.cp.PID("kube-apiserver")
	apiCPU0, err := procCPUSeconds(apiPID)
	if err != nil {
		return r, err
	}

	var d *daemon
	args := []string{"client", "-mode", mode, "-namespace", namespace, "-updates", strconv.Itoa(h.w.Updates)}
	audience := "informerd"
	if strings.HasPrefix(mode, "direct") {
		args = append(args, "-kubeconfig", h.cp.KubeconfigPath)
		audience = ""
	} else {
		if d, err = startDaemon(ctx, h.informerd, h.cp.KubeconfigPath); err != nil {
			return r, err
		}
		defer d.stop()
		args = append(args, "-socket", d.socket)
	}
	heapBase := uint64(0)
	if d != nil {
		if heapBase, err = d.heapLive(ctx, h.scraper); err != nil {
			return r, err
		}
	}

	procs := make([]*clientProc, n)
	defer func() {
		for _, p := range procs {
			if p != nil {
				p.kill()
			}
		}
	}()
	if wrapped(mode) {
		args = append(args, "-kubeconfig", h.cp.KubeconfigPath)
	}
	for i := range procs {
		token, err := h.tokenFile(ctx, clientName(i), audience)
		if err != nil {
			return r, err
		}
		pargs := append(slices.Clip(args), "-name", clientName(i), "-token-file", token)
		if wrapped(mode) {
			apiToken, err := h.tokenFile(ctx, clientName(i), "")
			if err != nil {
				return r, err
			}
			pargs = append(pargs, "-api-token-file", apiToken)
		}
		if procs[i], err = startClient(ctx, h.self, pargs); err != nil {
			return r, err
		}
	}
	syncCtx, cancel := context.WithTimeout(ctx, h.w.Timeout)
	defer cancel()
	for _, p := range procs {
		if err := p.waitSynced(syncCtx); err != nil {
			return r, err
		}
	}
	if d != nil {
		live, err := d.heapLive(ctx, h.scraper)
		if err != nil {
			return r, err
		}
		r.DaemonHeapLiveBytes = live
		r.DaemonHeapPerObject = float64(int64(live)-int64(heapBase)) / float64(h.w.ConfigMaps+h.w.Pods)
	}

	var updatesCPU0 float64
	if d != nil {
		if r.DaemonIdleCPUSecondsPerMinute, err = idleCPU(ctx, d, h.w.IdleWindow); err != nil {
			return r, err
		}
		if updatesCPU0, err = d.cpu(); err != nil {
			return r, err
		}
	}

	writeStart := time.Now()
	if err := h.writeUpdates(ctx, admin); err != nil {
		return r, err
	}
	var (
		lat     []int64
		syncs   []float64
		perObj  []float64
		lastEvt int64
	)
	for _, p := range procs {
		res, err := p.result()
		if err != nil {
			return r, err
		}
		lat = append(lat, res.LatenciesMicros...)
		syncs = append(syncs, res.SyncSeconds)
		if res.Objects > 0 {
			perObj = append(perObj, float64(int64(res.HeapLiveSynced)-int64(res.HeapLiveBase))/float64(res.Objects))
		}
		lastEvt = max(lastEvt, res.LastEventUnix)
		r.NodeCPUSeconds += res.CPUSeconds
		r.NodeRSSBytes += res.RSSBytes
	}
	if d != nil { // every client has reported: the deliveries are done
		b, err := scrape(ctx, d.metrics+"/metrics", h.scraper)
		if err != nil {
			return r, err
		}
		r.DaemonLists = int(metricSum(b, "informerd_upstream_lists_total"))
		r.DaemonWatches = int(metricSum(b, "informerd_upstream_watches_total"))
		if r.DaemonCPUSeconds, err = d.cpu(); err != nil {
			return r, err
		}
		if r.DaemonRSSBytes, err = procRSS(d.pid()); err != nil {
			return r, err
		}
		r.DaemonUpdatesCPUSeconds = r.DaemonCPUSeconds - updatesCPU0
		if len(lat) > 0 {
			r.DaemonCPUMicrosPerDelivery = r.DaemonUpdatesCPUSeconds * 1e6 / float64(len(lat))
		}
		r.NodeCPUSeconds += r.DaemonCPUSeconds
		r.NodeRSSBytes += r.DaemonRSSBytes
	}
	r.Deliveries = len(lat)
	r.Missed = h.w.Updates*n - len(lat)
	r.LatencyP50Millis = percentile(lat, 0.50) / 1e3
	r.LatencyP99Millis = percentile(lat, 0.99) / 1e3
	r.LatencyMaxMillis = percentile(lat, 1) / 1e3
	if span := time.Unix(0, lastEvt).Sub(writeStart).Seconds(); span > 0 {
		r.EventsPerS = float64(len(lat)) / span
	}
	r.SyncSecondsMedian, r.SyncSecondsMax = median(syncs), percentileF(syncs, 1)
	r.ClientHeapPerObject = median(perObj)

	// Every watch of this run must have ended before the API server's
	// request counts are final.
	if d != nil {
		d.stop()
	}
	if err := waitWatchesGone(ctx, admin, before.longRunning); err != nil {
		return r, err
	}
	after, err := upstreamCounts(ctx, admin)
	if err != nil {
		return r, err
	}
	apiCPU1, err := procCPUSeconds(apiPID)
	if err != nil {
		return r, err
	}
	r.UpstreamLists = int(after.lists - before.lists)
	r.UpstreamWatches = int(after.watches - before.watches)
	r.APIServerCPUSeconds = apiCPU1 - apiCPU0
	return r, nil
}

// writeUpdates patches Updates ConfigMaps at Rate per second, each with its
// write time in stampAnnotation.
func (h *harness) writeUpdates(ctx context.Context, admin *kubernetes.Clientset) error {
	interval := time.Second / time.Duration(h.w.Rate)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8) // in flight, so that one slow write does not hold the rate
	next := time.Now()
	for i := range h.w.Updates {
		if d := time.Until(next); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return g.Wait()
			case <-t.C:
			}
		}
		next = next.Add(interval)
		g.Go(func() error {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, stampAnnotation, strconv.FormatInt(time.Now().UnixNano(), 10))
			_, err := admin.CoreV1().ConfigMaps(namespace).Patch(ctx, cmName(i%h.w.ConfigMaps), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		})
	}
	return g.Wait()
}

// counts are the API server's request counters for the watched resources.
type counts struct {
	lists, watches, longRunning float64
}

var watchedResources = []string{`resource="configmaps"`, `resource="pods"`}

func upstreamCounts(ctx context.Context, admin *kubernetes.Clientset) (counts, error) {
	b, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return counts{}, err
	}
	var c counts
	for _, res := range watchedResources {
		c.lists += metricSum(b, "apiserver_request_total", `verb="LIST"`, res)
		c.watches += metricSum(b, "apiserver_request_total", `verb="WATCH"`, res)
		c.longRunning += metricSum(b, "apiserver_longrunning_requests", `verb="WATCH"`, res)
	}
	return c, nil
}

// idleCPU returns the daemon's CPU seconds per minute over window, in
// which the harness changes nothing.
func idleCPU(ctx context.Context, d *daemon, window time.Duration) (float64, error) {
	cpu0, err := d.cpu()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := sleep(ctx, window); err != nil {
		return 0, err
	}
	cpu1, err := d.cpu()
	if err != nil {
		return 0, err
	}
	return (cpu1 - cpu0) * 60 / time.Since(start).Seconds(), nil
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitWatchesGone waits until the API server holds no more watches of the
// watched resources than it did before a run.
func waitWatchesGone(ctx context.Context, admin *kubernetes.Clientset, baseline float64) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := upstreamCounts(ctx, admin)
		return err == nil && c.longRunning <= baseline, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the run's watches to end: %w", err)
	}
	return nil
}

// daemon is one informerd process.
type daemon struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has ended
	dir     string
	socket  string
	metrics string
	once    sync.Once
}

// metricsPorts hands out the daemons' metrics ports below the kernel's
// ephemeral range (32768 and up), which the harness's and the clients'
// outgoing connections take from: a port found free there and handed to a
// daemon a moment later may be an outgoing connection's by then (bench
// fleet starts a hundred daemons beside hundreds of connections).
var metricsPorts struct {
	sync.Mutex
	next int
}

func freeMetricsAddress() (string, error) {
	metricsPorts.Lock()
	defer metricsPorts.Unlock()
	if metricsPorts.next == 0 {
		metricsPorts.next = 20000 + os.Getpid()%1000*10
	}
	for range 2000 {
		port := metricsPorts.next
		metricsPorts.next = 20000 + (port-20000+1)%12000
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			l.Close()
			return l.Addr().String(), nil
		}
	}
	return "", errors.New("no free port for a daemon's metrics between 20000 and 32000")
}

// startDaemon starts informerd against kubeconfig as the benchmarks run
// it (authentication on, pprof for forced GCs), with extra flags after
// those.
func startDaemon(ctx context.Context, bin, kubeconfig string, extra ...string) (*daemon, error) {
	dir, err := os.MkdirTemp("", "informerd-bench-")
	if err != nil {
		return nil, err
	}
	addr, err := freeMetricsAddress()
	if err != nil {
		return nil, err
	}
	d := &daemon{dir: dir, socket: filepath.Join(dir, "informerd.sock"), metrics: "http://" + addr, exited: make(chan struct{})}
	args := append([]string{"-kubeconfig", kubeconfig, "-socket", d.socket, "-metrics-address", addr, "-enable-pprof", "-log-level", "warn"}, extra...)
	d.cmd = exec.Command(bin, args...)
	d.cmd.Stdout, d.cmd.Stderr = os.Stderr, os.Stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = d.cmd.Wait(); close(d.exited) }() // ends with the daemon
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-d.exited:
			return false, fmt.Errorf("it exited: %s", d.cmd.ProcessState)
		default:
		}
		_, err := scrape(ctx, d.metrics+"/healthz", "")
		return err == nil, nil
	})
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("informerd did not come up: %w", err)
	}
	return d, nil
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// cpu returns the daemon's CPU seconds (user+system) so far.
func (d *daemon) cpu() (float64, error) { return procCPUSeconds(d.pid()) }

// heapLive forces two GCs in the daemon (heap profiles with gc=1) and
// returns the live heap the second found. One is not enough: a GC moves
// what sync.Pools hold into their victim caches, which stay live until
// the next, and after the clients' snapshots gRPC's pool holds the write
// buffers their connections flushed with (1.3 MB at N=50 in one profile),
// which no idle connection keeps.
func (d *daemon) heapLive(ctx context.Context, token string) (uint64, error) {
	for range 2 {
		if _, err := scrape(ctx, d.metrics+"/debug/pprof/heap?gc=1", token); err != nil {
			return 0, err
		}
	}
	b, err := scrape(ctx, d.metrics+"/metrics", token)
	if err != nil {
		return 0, err
	}
	return uint64(metricSum(b, "go_gc_heap_live_bytes")), nil
}

// stop ends the daemon (SIGTERM) and removes its directory; idempotent.
func (d *daemon) stop() {
	d.once.Do(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		<-d.exited
		os.RemoveAll(d.dir)
	})
}

// clientProc is one client process: stdout gives "synced", then its
// result; closing stdin asks for the result.
type clientProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startClient(ctx context.Context, self string, args []string) (*clientProc, error) {
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &clientProc{cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<20)}, nil
}

// waitSynced reads the "synced" line, or fails when ctx ends.
func (p *clientProc) waitSynced(ctx context.Context) error {
	line := make(chan string, 1)
	go func() { // ends when the line arrives or the process is killed
		s, _ := p.out.ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "synced" {
			return fmt.Errorf("client %d did not sync (it said %q)", p.cmd.Process.Pid, s)
		}
		return nil
	case <-ctx.Done():
		p.kill()
		<-line
		return fmt.Errorf("waiting for client %d to sync: %w", p.cmd.Process.Pid, ctx.Err())
	}
}

// result closes stdin and reads the client's report.
func (p *clientProc) result() (clientResult, error) {
	p.stdin.Close()
	var res clientResult
	if err := json.NewDecoder(p.out).Decode(&res); err != nil {
		return res, fmt.Errorf("reading the result of client %d: %w", p.cmd.Process.Pid, err)
	}
	if err := p.cmd.Wait(); err != nil {
		return res, fmt.Errorf("client %d: %w", p.cmd.Process.Pid, err)
	}
	return res, nil
}

func (p *clientProc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// snapshotResult compares a new client's snapshot of the ConfigMaps from
// informerd with a direct LIST of them, medians of snapshotReps each.
type snapshotResult struct {
	Objects int `json:"objects"`
	Reps    int `json:"reps"`
	// SharedMillis: dial, stream until SYNCED, every object's bytes in
	// hand. SharedDecodedMillis adds decoding each into Unstructured.
	SharedMillis        float64 `json:"sharedMillis"`
	SharedDecodedMillis float64 `json:"sharedDecodedMillis"`
	// DirectJSONMillis: one LIST as JSON, body read. DirectDecodedMillis:
	// the dynamic client's List (JSON decoded into Unstructured), as a
	// dynamic informer's first LIST. DirectProtobufMillis: the typed
	// client's List in protobuf, decoded into typed objects.
	DirectJSONMillis     float64 `json:"directJsonMillis"`
	DirectDecodedMillis  float64 `json:"directDecodedMillis"`
	DirectProtobufMillis float64 `json:"directProtobufMillis"`
}

const snapshotReps = 7

func (h *harness) snapshot(ctx context.Context) (snapshotResult, error) {
	r := snapshotResult{Reps: snapshotReps}
	d, err := startDaemon(ctx, h.informerd, h.cp.KubeconfigPath)
	if err != nil {
		return r, err
	}
	defer d.stop()
	// A holder keeps the informer synced between the measured clients,
	// which are one ServiceAccount: from the second on, its token and
	// decisions are cached, as for any client that has connected before.
	token, err := h.tokenFile(ctx, "snapshot", "informerd")
	if err != nil {
		return r, err
	}
	hold, err := client.Dial(d.socket, client.WithTokenFile(token))
	if err != nil {
		return r, err
	}
	defer hold.Close()
	opts := client.WatchOptions{Resource: resources[0], Namespace: namespace, ClientName: "holder"}
	s, err := hold.Stream(ctx, opts, "")
	if err != nil {
		return r, err
	}
	defer s.Close()
	if _, err := recvSnapshot(s, false); err != nil {
		return r, err
	}

	shared := func(decode bool) (time.Duration, error) {
		start := time.Now()
		c, err := client.Dial(d.socket, client.WithTokenFile(token))
		if err != nil {
			return 0, err
		}
		defer c.Close()
		s, err := c.Stream(ctx, client.WatchOptions{Resource: resources[0], Namespace: namespace, ClientName: "snapshot"}, "")
		if err != nil {
			return 0, err
		}
		defer s.Close()
		n, err := recvSnapshot(s, decode)
		r.Objects = n
		return time.Since(start), err
	}
	cfg := h.cp.RESTConfig()
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return r, err
	}
	pcfg := rest.CopyConfig(cfg)
	pcfg.ContentType = runtime.ContentTypeProtobuf
	typed, err := kubernetes.NewForConfig(pcfg)
	if err != nil {
		return r, err
	}
	httpc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return r, err
	}
	listURL := h.cp.APIServerURL + "/api/v1/namespaces/" + namespace + "/configmaps"
	directJSON := func() (time.Duration, error) {
		start := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, listURL, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return 0, err
		}
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("LIST: %s", resp.Status)
		}
		return time.Since(start), nil
	}
	directDecoded := func() (time.Duration, error) {
		start := time.Now()
		l, err := dc.Resource(resources[0]).Namespace(namespace).List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) != h.w.ConfigMaps {
			err = fmt.Errorf("LIST returned %d ConfigMaps, want %d", len(l.Items), h.w.ConfigMaps)
		}
		return time.Since(start), err
	}
	directProtobuf := func() (time.Duration, error) {
		start := time.Now()
		_, err := typed.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{})
		return time.Since(start), err
	}
	samples := make([][]float64, 5)
	for range snapshotReps {
		for i, f := range []func() (time.Duration, error){
			func() (time.Duration, error) { return shared(false) },
			func() (time.Duration, error) { return shared(true) },
			directJSON, directDecoded, directProtobuf,
		} {
			d, err := f()
			if err != nil {
				return r, err
			}
			samples[i] = append(samples[i], float64(d.Microseconds())/1e3)
		}
	}
	if r.Objects != h.w.ConfigMaps {
		return r, fmt.Errorf("the snapshot had %d ConfigMaps, want %d", r.Objects, h.w.ConfigMaps)
	}
	r.SharedMillis, r.SharedDecodedMillis = median(samples[0]), median(samples[1])
	r.DirectJSONMillis, r.DirectDecodedMillis, r.DirectProtobufMillis = median(samples[2]), median(samples[3]), median(samples[4])
	return r, nil
}

// recvSnapshot reads a stream up to SYNCED and returns the number of
// objects, decoding each into Unstructured if decode is set.
func recvSnapshot(s *client.Stream, decode bool) (int, error) {
	n := 0
	for {
		evs, err := s.Recv()
		if err != nil {
			return n, err
		}
		for _, ev := range evs {
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_SYNCED:
				return n, nil
			case informerdv1.EventType_EVENT_TYPE_ADDED:
				n++
				if decode {
					var u unstructured.Unstructured
					if err := u.UnmarshalJSON(ev.GetObject()); err != nil {
						return n, err
					}
				}
			}
		}
	}
}
