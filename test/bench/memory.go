package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

// The encodings `bench memory` stores Pods in: one client subscribes to
// all Pods in the JSON view, the protobuf view or the metadata view (the
// daemon stores JSON and projects it).
const (
	memJSON     = "json"
	memProtobuf = "protobuf"
	memMetadata = "metadata"
)

var memEncodings = []string{memJSON, memProtobuf, memMetadata}

// memoryWorkload is what `bench memory` runs: for each Pod count (Pods
// are added up to it), a daemon of its own per encoding with one
// subscriber of every Pod, and client-go Pod informers for comparison;
// then the same for ConfigMaps of 1 KiB (small objects, where what an
// object costs beyond its bytes weighs most), in a namespace of their own.
type memoryWorkload struct {
	Pods       []int    `json:"pods"`
	ConfigMaps int      `json:"configMaps"`
	Encodings  []string `json:"encodings"`
}

// cmNamespace holds the ConfigMaps of `bench memory`, apart from the Pods.
const cmNamespace = "bench-cm"

// memoryRun is one encoding at one object count, measured.
type memoryRun struct {
	Resource string `json:"resource"` // pods or configmaps
	Objects  int    `json:"objects"`
	Encoding string `json:"encoding"`
	// StoredBytesPerObject is the bytes of an object as the daemon serves
	// it: what the full view sends (the object as the API server sent it,
	// managedFields included, though the daemon stores what they repeat
	// across objects once); the metadata view stores the JSON objects.
	StoredBytesPerObject float64 `json:"storedBytesPerObject"`
	// The daemon's live heap (two forced GCs) and RSS with a stream of
	// the cluster's one Service (Empty: the daemon has loaded what it
	// loads once) and with the subscriber synced too (Synced); per object is the
	// difference over the objects, and Ratio is heap per object over
	// stored bytes per object.
	Empty              daemonState `json:"empty"`
	Synced             daemonState `json:"synced"`
	HeapBytesPerObject float64     `json:"heapBytesPerObject"`
	RSSBytesPerObject  float64     `json:"rssBytesPerObject"`
	Ratio              float64     `json:"ratio"`
	// SyncSeconds: from subscribing to SYNCED; DaemonCPUSeconds: the
	// daemon's CPU over the same time (the list and the snapshot).
	SyncSeconds      float64 `json:"syncSeconds"`
	DaemonCPUSeconds float64 `json:"daemonCpuSeconds"`
	// Address (JSON Pod runs only): one WatchAddress stream added, which
	// builds the address view of every Pod from the same Source; its heap
	// per Pod is what the view keeps beyond the store.
	Address *addressMemory `json:"address,omitempty"`
}

// addressMemory is what one WatchAddress stream added to the daemon.
type addressMemory struct {
	Heap             daemonState `json:"heap"`
	HeapBytesPerPod  float64     `json:"heapBytesPerPod"`
	DaemonCPUSeconds float64     `json:"daemonCpuSeconds"`
}

// informerRun is a client-go informer in a process of its own, at one
// object count: its live heap growth to sync and its RSS.
type informerRun struct {
	Resource           string  `json:"resource"`
	Objects            int     `json:"objects"`
	Mode               string  `json:"mode"`
	HeapBytes          uint64  `json:"heapBytes"`
	HeapBytesPerObject float64 `json:"heapBytesPerObject"`
	RSSBytes           uint64  `json:"rssBytes"`
	SyncSeconds        float64 `json:"syncSeconds"`
	CPUSeconds         float64 `json:"cpuSeconds"`
}

type memoryReport struct {
	Machine   machine        `json:"machine"`
	Workload  memoryWorkload `json:"workload"`
	Command   string         `json:"command"`
	Runs      []memoryRun    `json:"runs"`
	Informers []informerRun  `json:"informers"`
}

// informerModes are the client-go comparisons: typed informers in
// protobuf, and dynamic informers in JSON (client.go's modes).
var informerModes = []string{modeDirectTyped, modeDirect}

// runMemoryBench is `bench memory`: the daemon's heap and RSS per stored
// Pod and ConfigMap, per encoding, against client-go's informers.
func runMemoryBench(args []string) error {
	w := memoryWorkload{Pods: []int{10000, 30000}, ConfigMaps: 10000, Encodings: memEncodings}
	if os.Getenv("BENCH_QUICK") == "1" {
		w.Pods, w.ConfigMaps = []int{2000}, 2000
	}
	fs := flag.NewFlagSet("bench memory", flag.ContinueOnError)
	bin := fs.String("bin", "_output/bin", "directory with the informerd binary")
	out := fs.String("out", "_output/bench/memory.json", "where to write the results as JSON")
	pods := fs.String("pods", joinInts(w.Pods), "comma-separated Pod counts, increasing (Pods are added up to each)")
	profiles := fs.String("heap-profiles", "", "directory to write each synced daemon's heap profile to (go tool pprof -sample_index=inuse_space)")
	fs.IntVar(&w.ConfigMaps, "configmaps", w.ConfigMaps, "ConfigMaps of 1 KiB to measure after the Pods (0: none)")
	encs := fs.String("encodings", strings.Join(w.Encodings, ","), "comma-separated encodings: "+strings.Join(memEncodings, ", "))
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if w.Pods, err = parseInts(*pods); err != nil {
		return fmt.Errorf("-pods: %w", err)
	}
	if !slices.IsSorted(w.Pods) {
		return fmt.Errorf("-pods: %s is not increasing", *pods)
	}
	if w.ConfigMaps < 0 {
		return fmt.Errorf("-configmaps: %d is negative", w.ConfigMaps)
	}
	w.Encodings = strings.Split(*encs, ",")
	for _, e := range w.Encodings {
		if !slices.Contains(memEncodings, e) {
			return fmt.Errorf("-encodings: unknown encoding %q (want one of %s)", e, strings.Join(memEncodings, ", "))
		}
	}
	env, err := startBench(*bin, "etcd, kube-apiserver, kwok with one fake node", controlplane.Options{FakeNode: true})
	if err != nil {
		return err
	}
	defer env.close()
	ctx, cp, informerd, self := env.ctx, env.cp, env.informerd, env.self
	h := &memoryHarness{harness: harness{cp: cp, self: self, informerd: informerd}, profiles: *profiles}
	if err := h.setup(ctx); err != nil {
		return err
	}
	defer os.RemoveAll(h.tokens)

	rep := memoryReport{Machine: describeMachine(cp), Workload: w, Command: memoryCommand(args)}
	// measure runs every encoding and informer at the n objects of gvr in
	// ns that the workload made, and any others there are.
	measure := func(gvr schema.GroupVersionResource, ns string, n int) error {
		for _, enc := range w.Encodings {
			say("run: %d %s, %s", n, gvr.Resource, enc)
			r, err := h.run(ctx, gvr, ns, n, enc)
			if err != nil {
				return fmt.Errorf("%d %s, %s: %w", n, gvr.Resource, enc, err)
			}
			rep.Runs = append(rep.Runs, r)
			n = r.Objects                                  // what the informers below find too
			if err := writeReport(*out, rep); err != nil { // what is done so far
				return err
			}
		}
		for _, mode := range informerModes {
			say("run: %d %s, client-go %s", n, gvr.Resource, mode)
			r, err := h.informer(ctx, ns, gvr.Resource, n, mode)
			if err != nil {
				return fmt.Errorf("%d %s, client-go %s: %w", n, gvr.Resource, mode, err)
			}
			rep.Informers = append(rep.Informers, r)
			if err := writeReport(*out, rep); err != nil {
				return err
			}
		}
		return nil
	}
	for _, n := range w.Pods {
		if err := h.createPods(ctx, n); err != nil {
			return err
		}
		if err := measure(podsGVR, namespace, n); err != nil {
			return err
		}
	}
	if w.ConfigMaps > 0 {
		if err := h.createConfigMaps(ctx, w.ConfigMaps); err != nil {
			return err
		}
		if err := measure(configMapGVR, cmNamespace, w.ConfigMaps); err != nil {
			return err
		}
	}
	rep.print(os.Stdout)
	return writeReport(*out, rep)
}

func memoryCommand(args []string) string {
	cmd := "make bench-memory"
	if os.Getenv("BENCH_QUICK") == "1" {
		cmd = "make bench-memory BENCH_QUICK=1"
	}
	return makeCommand(cmd, "BENCH_MEMORY_FLAGS", args)
}

type memoryHarness struct {
	harness
	created    int
	subscriber string // token file: informerd, every Pod and ConfigMap in every namespace
	apiToken   string // token file: the API server, Pods and ConfigMaps in namespace and cmNamespace
	profiles   string // where to write heap profiles; "": nowhere
}

// setup creates the namespaces, the subscriber's and the informers'
// ServiceAccounts and the scraper.
func (h *memoryHarness) setup(ctx context.Context) error {
	admin := h.admin()
	for _, ns := range []string{namespace, cmNamespace} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if _, err := admin.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	services := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}}
	for _, g := range []struct {
		name, ns string
		rules    []rbacv1.PolicyRule
	}{
		{"memory", "", []rbacv1.PolicyRule{readRule, services}},
		{"memory-informer", namespace, []rbacv1.PolicyRule{readRule}},
		{"memory-informer", cmNamespace, []rbacv1.PolicyRule{readRule}},
		{"scraper", "", []rbacv1.PolicyRule{scrapeRule}},
	} {
		if _, err := controlplane.ServiceAccountToken(ctx, admin, namespace, g.name); err != nil {
			return err
		}
		if err := controlplane.Grant(ctx, admin, namespace, g.name, g.ns, g.rules...); err != nil {
			return err
		}
	}
	var err error
	if h.scraper, err = controlplane.ServiceAccountToken(ctx, admin, namespace, "scraper", "informerd"); err != nil {
		return err
	}
	if h.tokens, err = os.MkdirTemp("", "informerd-bench-tokens-"); err != nil {
		return err
	}
	if h.subscriber, err = h.tokenFile(ctx, "memory", "informerd"); err != nil {
		return err
	}
	h.apiToken, err = h.tokenFile(ctx, "memory-informer", "")
	return err
}

// createPods adds Pods until there are n, and waits until kwok runs them
// all, so that what is measured is a cluster at rest.
func (h *memoryHarness) createPods(ctx context.Context, n int) error {
	admin := h.admin()
	start := time.Now()
	say("creating Pods %d to %d", h.created, n-1)
	if err := parallel(ctx, n-h.created, func(ctx context.Context, i int) error {
		_, err := admin.CoreV1().Pods(namespace).Create(ctx, benchPod(h.created+i), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	h.created = n
	err := wait.PollUntilContextTimeout(ctx, 5*time.Second, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Running"})
		if err == nil && len(l.Items) > 0 {
			say("%d of %d Pods are not Running yet", len(l.Items), n)
		}
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the pods to run: %w", err)
	}
	say("%d Pods running after %s", n, time.Since(start).Round(time.Second))
	return nil
}

// createConfigMaps creates n ConfigMaps of 1 KiB in cmNamespace.
func (h *memoryHarness) createConfigMaps(ctx context.Context, n int) error {
	admin := h.admin()
	start := time.Now()
	say("creating %d ConfigMaps", n)
	if err := parallel(ctx, n, func(ctx context.Context, i int) error {
		_, err := admin.CoreV1().ConfigMaps(cmNamespace).Create(ctx, benchConfigMap(i, 1024), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	say("%d ConfigMaps created after %s", n, time.Since(start).Round(time.Second))
	return nil
}

// run measures one encoding on a daemon of its own, subscribed to every
// object of gvr in ns ("": all): at least n, and per object over those
// there are (a namespace has its kube-root-ca.crt ConfigMap too).
func (h *memoryHarness) run(ctx context.Context, gvr schema.GroupVersionResource, ns string, n int, enc string) (memoryRun, error) {
	r := memoryRun{Resource: gvr.Resource, Encoding: enc}
	d, err := startDaemon(ctx, h.informerd, h.cp.KubeconfigPath)
	if err != nil {
		return r, err
	}
	defer d.stop()
	c, err := client.Dial(d.socket, client.WithTokenFile(h.subscriber))
	if err != nil {
		return r, err
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A first stream, of the cluster's one Service in the same view, loads
	// what a daemon loads once, whatever it stores (discovery, the
	// RESTMapper, encoders): the baseline is a daemon that serves.
	opts := client.WatchOptions{Resource: servicesGVR, ClientName: "memory-baseline", Protobuf: enc == memProtobuf, MetadataOnly: enc == memMetadata}
	warm, err := c.Stream(ctx, opts, "")
	if err != nil {
		return r, err
	}
	defer warm.Close()
	if _, _, err := recvUntilSynced(warm); err != nil {
		return r, fmt.Errorf("the baseline stream: %w", err)
	}
	if r.Empty, err = h.state(ctx, d); err != nil {
		return r, err
	}

	cpu0, err := d.cpu()
	if err != nil {
		return r, err
	}
	start := time.Now()
	opts.Resource, opts.Namespace, opts.ClientName = gvr, ns, "memory"
	s, err := c.Stream(ctx, opts, "")
	if err != nil {
		return r, err
	}
	defer s.Close()
	objects, bytes, err := recvUntilSynced(s)
	if err != nil {
		return r, err
	}
	if objects < n {
		return r, fmt.Errorf("the snapshot had %d %s, want at least %d", objects, gvr.Resource, n)
	}
	r.Objects, n = objects, objects
	r.SyncSeconds = time.Since(start).Seconds()
	cpu1, err := d.cpu()
	if err != nil {
		return r, err
	}
	r.DaemonCPUSeconds = cpu1 - cpu0
	if r.Synced, err = h.state(ctx, d); err != nil {
		return r, err
	}
	if h.profiles != "" {
		file := filepath.Join(h.profiles, fmt.Sprintf("%s-%d-%s.pprof", gvr.Resource, objects, enc))
		if err := h.heapProfile(ctx, d, file); err != nil {
			return r, err
		}
	}
	r.HeapBytesPerObject = (float64(r.Synced.HeapLiveBytes) - float64(r.Empty.HeapLiveBytes)) / float64(n)
	r.RSSBytesPerObject = (float64(r.Synced.RSSBytes) - float64(r.Empty.RSSBytes)) / float64(n)
	if enc == memMetadata {
		// The daemon stores the JSON objects and projects them: fetch them
		// in the full JSON view for their size.
		if _, bytes, err = h.fullJSON(ctx, c, gvr, ns); err != nil {
			return r, err
		}
	}
	r.StoredBytesPerObject = float64(bytes) / float64(n)
	r.Ratio = r.HeapBytesPerObject / r.StoredBytesPerObject
	if enc == memJSON && gvr == podsGVR {
		if r.Address, err = h.address(ctx, d, c, n, r.Synced); err != nil {
			return r, fmt.Errorf("address view: %w", err)
		}
	}
	return r, nil
}

// fullJSON streams every object of gvr in ns in the full JSON view once
// and returns their count and bytes.
func (h *memoryHarness) fullJSON(ctx context.Context, c *client.Client, gvr schema.GroupVersionResource, ns string) (int, int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Stream(ctx, client.WatchOptions{Resource: gvr, Namespace: ns, ClientName: "memory-size"}, "")
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	return recvUntilSynced(s)
}

// recvUntilSynced reads a stream's snapshot and returns its objects and
// their bytes.
func recvUntilSynced(s *client.Stream) (objects, bytes int, err error) {
	for {
		evs, err := s.Recv()
		if err != nil {
			return objects, bytes, err
		}
		for _, ev := range evs {
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_SYNCED:
				return objects, bytes, nil
			case informerdv1.EventType_EVENT_TYPE_ADDED:
				objects++
				bytes += len(ev.GetObject())
			}
		}
	}
}

// address opens one WatchAddress stream for a Pod's IP:port next to the
// JSON subscriber, whose Source it shares, and returns what the address
// view added to the daemon.
func (h *memoryHarness) address(ctx context.Context, d *daemon, c *client.Client, n int, before daemonState) (*addressMemory, error) {
	pod, err := h.admin().CoreV1().Pods(namespace).Get(ctx, benchPod(0).Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	ap, err := netip.ParseAddrPort(pod.Status.PodIP + ":" + strconv.Itoa(addressPort))
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cpu0, err := d.cpu()
	if err != nil {
		return nil, err
	}
	answered := make(chan *informerdv1.WatchAddressResponse, 1)
	aw := client.NewAddressWatcher(c, client.AddressOptions{Address: ap, ClientName: "memory-address"}, func(a *informerdv1.WatchAddressResponse) {
		select {
		case answered <- a:
		default:
		}
	}, client.AddressWatcherOptions{})
	done := make(chan error, 1)
	go func() { done <- aw.Run(ctx) }() // ends with ctx (cancel, deferred)
	defer func() {
		cancel()
		if err := <-done; err != nil { // Run returns nil when ctx ends
			say("WatchAddress: %v", err)
		}
	}()
	select {
	case a := <-answered:
		if a.GetPod() == nil {
			return nil, fmt.Errorf("no pod behind %s in the first answer", ap)
		}
	case err := <-done:
		return nil, fmt.Errorf("WatchAddress ended: %w", err)
	case <-time.After(5 * time.Minute):
		return nil, errors.New("no answer from WatchAddress within 5 minutes")
	}
	cpu1, err := d.cpu()
	if err != nil {
		return nil, err
	}
	st, err := h.state(ctx, d)
	if err != nil {
		return nil, err
	}
	return &addressMemory{
		Heap:             st,
		HeapBytesPerPod:  (float64(st.HeapLiveBytes) - float64(before.HeapLiveBytes)) / float64(n),
		DaemonCPUSeconds: cpu1 - cpu0,
	}, nil
}

// heapProfile writes d's heap profile to file.
func (h *memoryHarness) heapProfile(ctx context.Context, d *daemon, file string) error {
	b, err := scrape(ctx, d.metrics+"/debug/pprof/heap", h.scraper)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// state reads the daemon's live heap and RSS.
func (h *memoryHarness) state(ctx context.Context, d *daemon) (daemonState, error) {
	heap, err := d.heapLive(ctx, h.scraper)
	if err != nil {
		return daemonState{}, err
	}
	rss, err := procRSS(d.pid())
	return daemonState{HeapLiveBytes: heap, RSSBytes: rss}, err
}

// informer runs client-go informers of ns's Pods and ConfigMaps (n
// objects of resource; none of the other) in a client process of mode,
// and returns what they hold once synced: their stores are complete then,
// though their handlers may not have seen every object yet.
func (h *memoryHarness) informer(ctx context.Context, ns, resource string, n int, mode string) (informerRun, error) {
	r := informerRun{Resource: resource, Objects: n, Mode: mode}
	p, err := startClient(ctx, h.self, []string{"client", "-mode", mode, "-namespace", ns, "-updates", "0",
		"-kubeconfig", h.cp.KubeconfigPath, "-token-file", h.apiToken, "-name", "memory-" + mode})
	if err != nil {
		return r, err
	}
	defer p.kill()
	if err := p.waitSynced(ctx); err != nil {
		return r, err
	}
	res, err := p.result()
	if err != nil {
		return r, err
	}
	r.HeapBytes = res.HeapLiveSynced - res.HeapLiveBase
	r.HeapBytesPerObject = float64(r.HeapBytes) / float64(n)
	r.RSSBytes, r.SyncSeconds, r.CPUSeconds = res.RSSBytes, res.SyncSeconds, res.CPUSeconds
	return r, nil
}

func (rep memoryReport) print(out io.Writer) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "objects\tresource\tencoding\tstored B/object\theap B/object\tratio\tRSS B/object\theap MiB\tRSS MiB\tsync s\tdaemon CPU s\t")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.0f\t%.0f\t%.2f\t%.0f\t%.1f\t%.1f\t%.1f\t%.2f\t\n", r.Objects, r.Resource, r.Encoding, r.StoredBytesPerObject,
			r.HeapBytesPerObject, r.Ratio, r.RSSBytesPerObject, mib(r.Synced.HeapLiveBytes), mib(r.Synced.RSSBytes), r.SyncSeconds, r.DaemonCPUSeconds)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "pods\taddress view\theap B/pod\tdaemon CPU s\t")
	for _, r := range rep.Runs {
		if r.Address != nil {
			fmt.Fprintf(tw, "%d\tWatchAddress\t%.0f\t%.2f\t\n", r.Objects, r.Address.HeapBytesPerPod, r.Address.DaemonCPUSeconds)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "objects\tresource\tclient-go\theap B/object\theap MiB\tRSS MiB\tsync s\tCPU s\t")
	for _, r := range rep.Informers {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.0f\t%.1f\t%.1f\t%.1f\t%.2f\t\n", r.Objects, r.Resource, r.Mode, r.HeapBytesPerObject, mib(float64(r.HeapBytes)), mib(r.RSSBytes), r.SyncSeconds, r.CPUSeconds)
	}
	tw.Flush()
}

func mib[T uint64 | float64](b T) float64 { return float64(b) / (1 << 20) }
