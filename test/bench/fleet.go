package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
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
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

// `bench fleet` simulates K nodes of a cluster on one machine (issue 19,
// docs/scale.md): K informerd processes, each the daemon of one kwok node
// (-node-name), each with the local consumers of its profile (fleetRoles;
// "mix": two node agents watching their node's Pods, two proxies watching
// every Service and EndpointSlice, an applier watching its namespace's
// ConfigMaps; "mesh": a proxy for each of the node's Pods), against the
// same consumers as direct client-go informers. Every
// consumer is a typed informer in protobuf with a watch of its own, as a
// process of its own would have; consumers are grouped into at most
// fleetProcesses processes (fleetnode.go) so that the machine holds them.

const (
	fleetNamespaces = 10
	fleetProcesses  = 10
)

// The modes of `bench fleet`: the consumers direct; through informerd with
// the recovery window; through informerd without it (-recovery-window=0,
// each informer waits out its backoff, as before), which runs only the API
// server restart.
const (
	fleetDirect     = "direct"
	fleetInformerd  = "informerd"
	fleetNoRecovery = "informerd-norecovery"
)

var fleetModes = []string{fleetDirect, fleetInformerd, fleetNoRecovery}

type fleetWorkload struct {
	Profile         string        `json:"profile"`
	Nodes           int           `json:"clusterNodes"`
	PodsPerNode     int           `json:"podsPerNode"`
	Services        int           `json:"services"`
	EndpointsPer    int           `json:"endpointsPerSlice"`
	ConfigMapsPerNS int           `json:"configMapsPerNamespace"`
	Ks              []int         `json:"simulatedNodes"`
	Modes           []string      `json:"modes"`
	Rate            int           `json:"churnPerSecond"`
	Steady          time.Duration `json:"-"`
	Outage          time.Duration `json:"-"`
	RecoveryWindow  time.Duration `json:"-"`
	SteadySeconds   float64       `json:"steadySeconds"`
	OutageSeconds   float64       `json:"outageSeconds"`
	WindowSeconds   float64       `json:"recoveryWindowSeconds"`
	DaemonArgs      []string      `json:"daemonArgs,omitempty"`
}

type fleetReport struct {
	Machine  machine       `json:"machine"`
	Workload fleetWorkload `json:"workload"`
	Command  string        `json:"command"`
	Runs     []fleetRun    `json:"runs"`
}

// fleetRun is one mode at one K.
type fleetRun struct {
	Mode      string `json:"mode"`
	K         int    `json:"nodes"`
	Consumers int    `json:"consumers"`
	// Start: from the first consumer (or daemon) to every consumer synced.
	// StartLists counts LISTs and WatchLists; StartWatches, the watches
	// open once every consumer has synced, less those open before.
	SyncSeconds  float64 `json:"syncSeconds"`
	StartLists   float64 `json:"startLists"`
	StartWatches float64 `json:"startWatches"`
	// Steady: over the churn window with everything synced.
	Watches         map[string]float64 `json:"watchesByResource"`
	Lists           float64            `json:"lists"`
	OtherRequests   float64            `json:"otherRequests"` // neither lists nor watches: writes, reviews, probes
	APICPUSeconds   float64            `json:"apiserverCpuSeconds"`
	APIRSSBytes     uint64             `json:"apiserverRssBytes"`
	WatchEvents     float64            `json:"watchEvents"`
	WatchEventBytes float64            `json:"watchEventBytes"`
	// NodeEvents are the events the simulated nodes received from the API
	// server: direct, their consumers' informers; through informerd, their
	// daemons (informerd_events_in_total). FloorEvents are the events
	// they need, each once: for each node, one consumer of each distinct
	// watch (consumers of a kind on a node watch the same).
	NodeEvents  float64 `json:"nodeEvents"`
	FloorEvents float64 `json:"floorEvents"`
	// EventsByResource and EventBytesByResource split them by resource
	// (the API server's own watchers, such as the scheduler's and kwok's,
	// included).
	EventsByResource     map[string]float64 `json:"watchEventsByResource"`
	EventBytesByResource map[string]float64 `json:"watchEventBytesByResource"`
	DaemonCPU            float64            `json:"daemonsCpuSeconds"`
	DaemonRSS            uint64             `json:"daemonsRssBytes"`
	ConsumerCPU          float64            `json:"consumersCpuSeconds"`
	ConsumerRSS          uint64             `json:"consumersRssBytes"`
	SteadyLost           int                `json:"steadyLost"`
	Upgrade              *fleetDisruption   `json:"upgrade,omitempty"`
	// DownUpgrade is the rolling upgrade made while the API server is
	// down (mode informerd).
	DownUpgrade *fleetDisruption `json:"upgradeWhileDown,omitempty"`
	Restart     *fleetDisruption `json:"apiserverRestart,omitempty"`
}

// fleetDisruption is a rolling upgrade or an API server restart.
type fleetDisruption struct {
	Seconds float64 `json:"seconds"`
	// CatchUp: from the wave's restart (the API server ready again) until
	// every consumer of it has seen a write made then; max and median
	// over waves.
	CatchUpMaxSeconds    float64 `json:"catchUpMaxSeconds"`
	CatchUpMedianSeconds float64 `json:"catchUpMedianSeconds"`
	// Restart (a rolling upgrade): the part of each wave's catch-up until
	// its nodes were restarted (informerd: the new daemons serve and the
	// old ones handed off; direct: the consumers synced again), before
	// the write; max and median over waves.
	RestartMaxSeconds    float64 `json:"restartMaxSeconds,omitempty"`
	RestartMedianSeconds float64 `json:"restartMedianSeconds,omitempty"`
	// StartCPUSeconds (an upgrade by handoff): the CPU a new daemon had
	// used, on average, from its exec until the old one handed off to it.
	StartCPUSeconds float64 `json:"startCpuSeconds,omitempty"`
	// Peak rates over 1 s samples of the API server's request counter.
	PeakRequestsPerSecond float64 `json:"peakRequestsPerSecond"`
	PeakListsPerSecond    float64 `json:"peakListsPerSecond"`
	// Lists: the API server's LISTs (and WatchLists) during the phase, by
	// every client; DaemonLists (informerd mode) those of the daemons,
	// the new ones' informerd_upstream_lists_total.
	Lists         float64 `json:"lists"`
	DaemonLists   float64 `json:"daemonLists,omitempty"`
	APICPUSeconds float64 `json:"apiserverCpuSeconds"`
	PeakAPICPU    float64 `json:"peakApiserverCpu"`
	// Lost: objects some consumer's store does not hold at the API
	// server's resourceVersion once the churn has stopped.
	Lost int `json:"lost"`
	// Served (an upgrade while the API server is down): from a wave's
	// start until a new client of each of its nodes got the handed-off
	// state (SYNCED), max and median over nodes; Connected, the part of
	// it from that client's connecting (the new daemon serving) until its
	// SYNCED. Unserved counts the nodes whose new daemon did not serve it.
	ServedMaxSeconds       float64 `json:"servedMaxSeconds,omitempty"`
	ServedMedianSeconds    float64 `json:"servedMedianSeconds,omitempty"`
	ConnectedMaxSeconds    float64 `json:"connectedMaxSeconds,omitempty"`
	ConnectedMedianSeconds float64 `json:"connectedMedianSeconds,omitempty"`
	Unserved               int     `json:"unserved,omitempty"`
}

func runFleetBench(args []string) error {
	quick := os.Getenv("BENCH_QUICK") == "1"
	w := fleetWorkload{Profile: profileMix, Nodes: 100, PodsPerNode: 30, Services: 50, EndpointsPer: 20, ConfigMapsPerNS: 100,
		Ks: []int{10, 50, 100}, Modes: fleetModes, Rate: 50, Steady: time.Minute, Outage: time.Minute, RecoveryWindow: 10 * time.Second}
	if quick {
		w.Ks, w.Steady, w.Outage = []int{10}, 20*time.Second, 30*time.Second
	}
	fs := flag.NewFlagSet("bench fleet", flag.ContinueOnError)
	bin := fs.String("bin", "_output/bin", "directory with the informerd binary")
	out := fs.String("out", "_output/bench/fleet.json", "where to write the results as JSON")
	ks := fs.String("k", joinInts(w.Ks), "comma-separated numbers of simulated nodes (each one informerd process)")
	modeList := fs.String("modes", strings.Join(w.Modes, ","), "comma-separated modes: "+strings.Join(fleetModes, ", "))
	fs.StringVar(&w.Profile, "profile", w.Profile, "node profile: mix (2 node agents, 2 proxies, an applier per node) or mesh (a proxy per Pod of the node: -pods-per-node)")
	fs.IntVar(&w.Nodes, "cluster-nodes", w.Nodes, "kwok nodes in the cluster, Pods spread over them (at least the largest -k)")
	fs.IntVar(&w.PodsPerNode, "pods-per-node", w.PodsPerNode, "Pods per node")
	fs.IntVar(&w.Rate, "rate", w.Rate, "writes per second of the churn (Pods half, EndpointSlices and ConfigMaps a quarter each)")
	fs.DurationVar(&w.Steady, "steady", w.Steady, "the measured churn window with every consumer synced")
	fs.DurationVar(&w.Outage, "outage", w.Outage, "how long the API server stays down after its kill -9")
	fs.DurationVar(&w.RecoveryWindow, "recovery-window", w.RecoveryWindow, "the daemons' -recovery-window in mode informerd")
	daemonArgs := fs.String("daemon-args", "", "extra informerd flags, space-separated (e.g. -scope=namespace)")
	cpuProfiles := fs.String("cpu-profiles", "", "directory to write the CPU profile of node 0's daemon over each steady window to (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	w.DaemonArgs = strings.Fields(*daemonArgs)
	var err error
	if w.Ks, err = parseInts(*ks); err != nil {
		return fmt.Errorf("-k: %w", err)
	}
	w.Modes = strings.Split(*modeList, ",")
	for _, m := range w.Modes {
		if !slices.Contains(fleetModes, m) {
			return fmt.Errorf("-modes: unknown mode %q (want one of %s)", m, strings.Join(fleetModes, ", "))
		}
	}
	switch {
	case !slices.Contains(fleetProfiles, w.Profile):
		return fmt.Errorf("-profile: unknown profile %q (want one of %s)", w.Profile, strings.Join(fleetProfiles, ", "))
	case slices.Max(w.Ks) > w.Nodes:
		return fmt.Errorf("-k %d is more than -cluster-nodes %d", slices.Max(w.Ks), w.Nodes)
	case w.PodsPerNode < 1 || w.Rate < 1 || w.Steady <= 0 || w.Outage <= 0 || w.RecoveryWindow <= 0:
		return errors.New("-pods-per-node and -rate must be at least 1; -steady, -outage and -recovery-window positive")
	}
	w.SteadySeconds, w.OutageSeconds, w.WindowSeconds = w.Steady.Seconds(), w.Outage.Seconds(), w.RecoveryWindow.Seconds()
	env, err := startBench(*bin, "etcd, kube-apiserver, kwok", controlplane.Options{FakeNode: true})
	if err != nil {
		return err
	}
	defer env.close()
	ctx, cp, informerd, self := env.ctx, env.cp, env.informerd, env.self
	h := &fleetHarness{cp: cp, w: w, self: self, informerd: informerd, cpuProfiles: *cpuProfiles}
	h.admin = kubernetes.NewForConfigOrDie(h.adminConfig())
	if h.dir, err = os.MkdirTemp("", "informerd-fleet-"); err != nil {
		return err
	}
	defer os.RemoveAll(h.dir)
	if err := h.populate(ctx); err != nil {
		return err
	}
	cmd := "make bench-fleet"
	if quick {
		cmd += " BENCH_QUICK=1"
	}
	rep := fleetReport{Machine: describeMachine(cp), Workload: w, Command: makeCommand(cmd, "BENCH_FLEET_FLAGS", args)}
	for _, k := range w.Ks {
		for _, mode := range w.Modes {
			say("fleet run: %s, %d nodes", mode, k)
			r, err := h.run(ctx, mode, k)
			if err != nil {
				return fmt.Errorf("%s with %d nodes: %w", mode, k, err)
			}
			rep.Runs = append(rep.Runs, r)
			printFleet(os.Stderr, []fleetRun{r})
		}
	}
	printFleet(os.Stdout, rep.Runs)
	return writeReport(*out, rep)
}

type fleetHarness struct {
	cp              *controlplane.ControlPlane
	w               fleetWorkload
	self, informerd string
	admin           *kubernetes.Clientset
	dir             string // sockets and token files
	cpuProfiles     string // where steady() writes node 0's daemon's CPU profile; "": nowhere
	scraper         string // a token for the daemons' /metrics and /debug/pprof
}

func (h *fleetHarness) adminConfig() *rest.Config {
	cfg := h.cp.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	return cfg
}

// The grants of the roles' ServiceAccounts: what their processes would
// have, for informerd as for the API server.
var (
	agentRule   = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}
	proxyRules  = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}}, {APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}}
	applierRule = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}}
	// The daemons run as a ServiceAccount with deploy/'s grants, as the
	// DaemonSet does, not as the cluster's admin (whom RBAC never stops,
	// not even while a restarted API server loads its roles).
	daemonRules = []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "services", "configmaps", "namespaces", "nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
)

// daemonSA is the daemons' ServiceAccount, in fleetNamespace(0).
const daemonSA = "fleet-informerd"

// fleetScraper reads the daemons' metrics and CPU profiles (-cpu-profiles).
const fleetScraper = "fleet-scraper"

var profileRule = rbacv1.PolicyRule{NonResourceURLs: []string{"/metrics", "/debug/pprof/profile"}, Verbs: []string{"get"}}

// populate creates the cluster: namespaces, kwok nodes, Pods bound to
// them (Running), Services with an EndpointSlice each, ConfigMaps, the
// probe objects, and the roles' ServiceAccounts with their grants.
func (h *fleetHarness) populate(ctx context.Context) error {
	start := time.Now()
	a := h.admin
	for n := range fleetNamespaces {
		ns := fleetNamespace(n)
		if _, err := a.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := a.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	saNS := fleetNamespace(0)
	for _, g := range []struct {
		sa    string
		rules []rbacv1.PolicyRule
	}{{fleetSA("agent-0"), []rbacv1.PolicyRule{agentRule}}, {fleetSA("proxy-0"), proxyRules}, {daemonSA, daemonRules}, {fleetScraper, []rbacv1.PolicyRule{profileRule}}} {
		if _, err := controlplane.ServiceAccountToken(ctx, a, saNS, g.sa); err != nil {
			return err
		}
		if err := controlplane.Grant(ctx, a, saNS, g.sa, "", g.rules...); err != nil {
			return err
		}
	}
	if _, err := controlplane.ServiceAccountToken(ctx, a, saNS, fleetSA("applier")); err != nil {
		return err
	}
	for n := range fleetNamespaces {
		if err := controlplane.Grant(ctx, a, saNS, fleetSA("applier"), fleetNamespace(n), applierRule); err != nil {
			return err
		}
	}
	say("creating %d kwok nodes, %d Pods, %d Services and EndpointSlices, %d ConfigMaps", h.w.Nodes, h.w.Nodes*(h.w.PodsPerNode+1), h.w.Services, fleetNamespaces*(h.w.ConfigMapsPerNS+1))
	capacity := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1000")}
	if err := parallel(ctx, h.w.Nodes, func(ctx context.Context, k int) error {
		_, err := a.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fleetNodeName(k), Annotations: map[string]string{controlplane.KwokAnnotation: "fake"}, Labels: map[string]string{"type": "kwok"}},
			Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	perNode := h.w.PodsPerNode + 1 // and the node's probe Pod
	if err := parallel(ctx, h.w.Nodes*perNode, func(ctx context.Context, i int) error {
		k, j := i/perNode, i%perNode
		p := benchPod(i)
		p.Namespace, p.Spec.NodeName = fleetNamespace(k), fleetNodeName(k)
		if j == h.w.PodsPerNode {
			p.Name = "probe-" + fleetNodeName(k)
		} else {
			p.Name = fmt.Sprintf("p-%03d-%03d", k, j)
		}
		_, err := a.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	if err := parallel(ctx, h.w.Services+1, func(ctx context.Context, i int) error {
		ns, name := fleetNamespace(i), fmt.Sprintf("svc-%02d", i)
		if i == h.w.Services {
			ns, name = fleetNamespace(0), "probe-slice"
		} else {
			_, err := a.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": fmt.Sprintf("web-%02d", i%50)},
					Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
			}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
		}
		_, err := a.DiscoveryV1().EndpointSlices(ns).Create(ctx, fleetSlice(name, i, h.w.EndpointsPer), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	payload := strings.Repeat("x", 1024)
	if err := parallel(ctx, fleetNamespaces*(h.w.ConfigMapsPerNS+1), func(ctx context.Context, i int) error {
		n, j := i/(h.w.ConfigMapsPerNS+1), i%(h.w.ConfigMapsPerNS+1)
		name := fmt.Sprintf("cm-%03d", j)
		if j == h.w.ConfigMapsPerNS {
			name = "probe-cm"
		}
		_, err := a.CoreV1().ConfigMaps(fleetNamespace(n)).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"payload": payload},
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	err := wait.PollUntilContextTimeout(ctx, 5*time.Second, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := a.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Running"})
		if err == nil && len(l.Items) > 0 {
			say("%d Pods are not Running yet", len(l.Items))
		}
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the Pods to run: %w", err)
	}
	say("created in %s", time.Since(start).Round(time.Second))
	return nil
}

// fleetSlice is the EndpointSlice of Service name: n addresses, ready.
func fleetSlice(name string, i, n int) *discoveryv1.EndpointSlice {
	ready := true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "bench-fleet",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
	}
	for j := range n {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+i%100, j/250, 1+j%250)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   ptr(fleetNodeName(j)),
		})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// run is one mode at k nodes: start, steady churn, a rolling upgrade and
// an API server restart (informerd-norecovery: the restart only).
func (h *fleetHarness) run(ctx context.Context, mode string, k int) (fleetRun, error) {
	r := fleetRun{Mode: mode, K: k, Consumers: k * len(fleetRoles(h.w.Profile, h.w.PodsPerNode))}
	f := &fleet{h: h, mode: mode, k: k, daemons: make([]*daemon, k)}
	defer f.stop()
	if err := h.tokens(ctx); err != nil {
		return r, err
	}
	before, err := h.apiMetrics(ctx)
	if err != nil {
		return r, err
	}
	start := time.Now()
	if err := f.start(ctx); err != nil {
		return r, err
	}
	r.SyncSeconds = time.Since(start).Seconds()
	synced, err := h.apiMetrics(ctx)
	if err != nil {
		return r, err
	}
	r.StartLists, r.StartWatches = synced.lists-before.lists, synced.watches-before.watches
	say("%d consumers synced in %.1f s", r.Consumers, r.SyncSeconds)

	if mode != fleetNoRecovery {
		if err := f.steady(ctx, &r); err != nil {
			return r, fmt.Errorf("steady: %w", err)
		}
		if r.Upgrade, err = f.upgrade(ctx); err != nil {
			return r, fmt.Errorf("rolling upgrade: %w", err)
		}
	}
	if mode == fleetInformerd {
		if r.DownUpgrade, err = f.upgradeWhileDown(ctx); err != nil {
			return r, fmt.Errorf("upgrade while the API server is down: %w", err)
		}
	}
	if r.Restart, err = f.restartAPIServer(ctx); err != nil {
		return r, fmt.Errorf("API server restart: %w", err)
	}
	return r, nil
}

// tokens mints the roles' tokens for this run (they last an hour), and
// the daemons' kubeconfig.
func (h *fleetHarness) tokens(ctx context.Context) error {
	tok, err := controlplane.ServiceAccountToken(ctx, h.admin, fleetNamespace(0), daemonSA)
	if err != nil {
		return err
	}
	kc, err := clientcmd.LoadFromFile(h.cp.KubeconfigPath)
	if err != nil {
		return err
	}
	for _, ai := range kc.AuthInfos {
		*ai = clientcmdapi.AuthInfo{Token: tok}
	}
	if err := clientcmd.WriteToFile(*kc, h.daemonKubeconfig()); err != nil {
		return err
	}
	if h.scraper, err = controlplane.ServiceAccountToken(ctx, h.admin, fleetNamespace(0), fleetScraper, "informerd"); err != nil {
		return err
	}
	for _, role := range []string{"agent-0", "proxy-0", "applier"} {
		for aud, suffix := range map[string]string{"": "-api", "informerd": "-informerd"} {
			var auds []string
			if aud != "" {
				auds = []string{aud}
			}
			tok, err := controlplane.ServiceAccountToken(ctx, h.admin, fleetNamespace(0), fleetSA(role), auds...)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(h.dir, fleetSA(role)+suffix), []byte(tok), 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// apiSample is what the harness reads of the API server at one moment.
type apiSample struct {
	at time.Time
	// requests and lists count requests answered (LIST and WatchList:
	// a watch is counted in apiserver_request_total when it ends);
	// watches is those open now, byResource by resource.
	requests, lists, watches float64
	other                    float64 // answered requests neither LIST nor WATCH
	watchEvents, eventBytes  float64
	eventsBy, bytesBy        map[string]float64 // watchEvents and eventBytes by resource
	byResource               map[string]float64 // watches open now
	cpu                      float64
}

var fleetResources = []string{"pods", "services", "endpointslices", "configmaps"}

func (h *fleetHarness) apiMetrics(ctx context.Context) (apiSample, error) {
	b, err := h.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiSample{}, err
	}
	s := apiSample{at: time.Now(), byResource: map[string]float64{},
		requests:    metricSum(b, "apiserver_request_total"),
		lists:       metricSum(b, "apiserver_request_total", `verb="LIST"`) + metricSum(b, "apiserver_watch_list_duration_seconds_count"),
		watches:     metricSum(b, "apiserver_longrunning_requests", `verb="WATCH"`),
		watchEvents: metricSum(b, "apiserver_watch_events_total"),
		eventBytes:  metricSum(b, "apiserver_watch_events_sizes_sum"),
		eventsBy:    metricByLabel(b, "apiserver_watch_events_total", "resource"),
		bytesBy:     metricByLabel(b, "apiserver_watch_events_sizes_sum", "resource"),
	}
	s.other = s.requests - metricSum(b, "apiserver_request_total", `verb="LIST"`) - metricSum(b, "apiserver_request_total", `verb="WATCH"`)
	for _, res := range fleetResources {
		s.byResource[res] = metricSum(b, "apiserver_longrunning_requests", `verb="WATCH"`, `resource="`+res+`"`)
	}
	s.cpu, _ = procCPUSeconds(h.cp.PID("kube-apiserver"))
	return s, nil
}

// fleet is the daemons and consumer processes of one run.
type fleet struct {
	h       *fleetHarness
	mode    string
	k       int
	daemons []*daemon // by node; nil in direct mode
	procs   []*fleetProc
	// retiring stops the daemons that handed off (restartNodes); stop
	// waits for it.
	retiring sync.WaitGroup
	// startCPU sums the CPU seconds each new daemon of an upgrade by
	// handoff had used once the old one handed off (restartNodes).
	startCPU struct {
		sync.Mutex
		seconds float64
		n       int
	}
}

type fleetProc struct {
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	socket     string
	first, num int
	http       *http.Client
}

func (h *fleetHarness) daemonKubeconfig() string { return filepath.Join(h.dir, "informerd.kubeconfig") }

func (f *fleet) socket(k int) string { return filepath.Join(f.h.dir, fmt.Sprintf("node-%d.sock", k)) }

// startDaemon starts node k's daemon (again).
func (f *fleet) startDaemon(ctx context.Context, k int) error {
	window := f.h.w.RecoveryWindow
	if f.mode == fleetNoRecovery {
		window = 0
	}
	args := []string{"-socket", f.socket(k), "-node-name", fleetNodeName(k), "-recovery-window", window.String(), "-log-level", "error"}
	if f.mode == fleetInformerd {
		// As deploy/ runs it: an upgrade hands off (restartNodes).
		args = append(args, "-handoff-socket", filepath.Join(f.h.dir, "handoff", fmt.Sprintf("node-%d.sock", k)))
	}
	args = append(args, f.h.w.DaemonArgs...)
	d, err := startDaemon(ctx, f.h.informerd, f.h.daemonKubeconfig(), args...)
	if err != nil {
		return err
	}
	f.daemons[k] = d
	return nil
}

func (f *fleet) start(ctx context.Context) error {
	if f.mode != fleetDirect {
		if err := parallel(ctx, f.k, f.startDaemon); err != nil {
			return err
		}
	}
	nprocs := min(f.k, fleetProcesses)
	g, gctx := errgroup.WithContext(ctx)
	for p := range nprocs {
		first, end := p*f.k/nprocs, (p+1)*f.k/nprocs
		fp := &fleetProc{socket: filepath.Join(f.h.dir, fmt.Sprintf("proc-%d.sock", p)), first: first, num: end - first}
		fp.http = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", fp.socket)
		}}}
		fp.cmd = exec.Command(f.h.self, "fleetnodes", "-mode", f.mode, "-kubeconfig", f.h.cp.KubeconfigPath,
			"-socket-dir", f.h.dir, "-token-dir", f.h.dir, "-first-node", strconv.Itoa(first), "-nodes", strconv.Itoa(fp.num), "-listen", fp.socket,
			"-profile", f.h.w.Profile, "-pods-per-node", strconv.Itoa(f.h.w.PodsPerNode))
		fp.cmd.Stderr = os.Stderr
		fp.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var err error
		if fp.stdin, err = fp.cmd.StdinPipe(); err != nil {
			return err
		}
		out, err := fp.cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := fp.cmd.Start(); err != nil {
			return err
		}
		f.procs = append(f.procs, fp)
		g.Go(func() error {
			line := make(chan string, 1)
			go func() { s, _ := bufio.NewReader(out).ReadString('\n'); line <- s }() // ends at the line or the process's end
			select {
			case s := <-line:
				if strings.TrimSpace(s) != "synced" {
					return fmt.Errorf("consumer process of nodes %d-%d did not sync (it said %q)", first, end-1, s)
				}
				return nil
			case <-time.After(10 * time.Minute):
				return fmt.Errorf("consumer process of nodes %d-%d: not synced after 10 minutes", first, end-1)
			case <-gctx.Done():
				return gctx.Err()
			}
		})
	}
	return g.Wait()
}

func (f *fleet) stop() {
	f.retiring.Wait()
	for _, p := range f.procs {
		p.stdin.Close()
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }() // ends when the process does
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	}
	for _, d := range f.daemons {
		if d != nil {
			d.stop()
		}
	}
}

// usage sums the CPU seconds and RSS of the daemons and of the consumer
// processes.
func (f *fleet) usage() (dCPU float64, dRSS uint64, cCPU float64, cRSS uint64) {
	for _, d := range f.daemons {
		if d != nil {
			c, _ := d.cpu()
			m, _ := procRSS(d.pid())
			dCPU, dRSS = dCPU+c, dRSS+m
		}
	}
	for _, p := range f.procs {
		c, _ := procCPUSeconds(p.cmd.Process.Pid)
		m, _ := procRSS(p.cmd.Process.Pid)
		cCPU, cRSS = cCPU+c, cRSS+m
	}
	return
}

// steady churns for the steady window with everything synced and records
// what the API server and the node side spend.
func (f *fleet) steady(ctx context.Context, r *fleetRun) error {
	h := f.h
	dCPU0, _, cCPU0, _ := f.usage()
	before, err := h.apiMetrics(ctx)
	if err != nil {
		return err
	}
	states0, err := f.states()
	if err != nil {
		return err
	}
	daemonEvents0, err := f.daemonEvents(ctx)
	if err != nil {
		return err
	}
	churn := h.churn(ctx)
	profiled := f.profileCPU(ctx)
	if err := sleep(ctx, h.w.Steady); err != nil {
		return err
	}
	if err := profiled(); err != nil {
		return fmt.Errorf("CPU profile: %w", err)
	}
	after, err := h.apiMetrics(ctx)
	if err != nil {
		return err
	}
	if err := churn(); err != nil {
		return err
	}
	states1, err := f.states()
	if err != nil {
		return err
	}
	daemonEvents1, err := f.daemonEvents(ctx)
	if err != nil {
		return err
	}
	consumers, floor := nodeEvents(states0, states1)
	r.NodeEvents, r.FloorEvents = consumers, floor
	if f.mode != fleetDirect {
		r.NodeEvents = daemonEvents1 - daemonEvents0
	}
	dCPU1, dRSS, cCPU1, cRSS := f.usage()
	r.Watches = after.byResource
	r.Lists = after.lists - before.lists
	r.OtherRequests = after.other - before.other
	r.APICPUSeconds = after.cpu - before.cpu
	r.APIRSSBytes, _ = procRSS(h.cp.PID("kube-apiserver"))
	r.WatchEvents, r.WatchEventBytes = after.watchEvents-before.watchEvents, after.eventBytes-before.eventBytes
	r.EventsByResource, r.EventBytesByResource = mapDelta(after.eventsBy, before.eventsBy), mapDelta(after.bytesBy, before.bytesBy)
	r.DaemonCPU, r.DaemonRSS, r.ConsumerCPU, r.ConsumerRSS = dCPU1-dCPU0, dRSS, cCPU1-cCPU0, cRSS
	r.SteadyLost, err = f.lost(ctx)
	return err
}

// states reads every consumer's state from the consumer processes.
func (f *fleet) states() ([]consumerState, error) {
	var all []consumerState
	for _, p := range f.procs {
		resp, err := p.http.Get("http://fleet/state")
		if err != nil {
			return nil, err
		}
		var states []consumerState
		err = json.NewDecoder(resp.Body).Decode(&states)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		all = append(all, states...)
	}
	return all, nil
}

// daemonEvents sums informerd_events_in_total over the daemons: the
// events they received from the API server. It is 0 in mode direct.
func (f *fleet) daemonEvents(ctx context.Context) (float64, error) {
	return f.daemonsSum(ctx, "informerd_events_in_total")
}

// daemonsSum sums the metric name over the daemons' /metrics.
func (f *fleet) daemonsSum(ctx context.Context, name string) (float64, error) {
	var sum float64
	for _, d := range f.daemons {
		if d == nil {
			continue
		}
		b, err := scrape(ctx, d.metrics+"/metrics", f.h.scraper)
		if err != nil {
			return 0, err
		}
		sum += metricSum(b, name)
	}
	return sum, nil
}

// nodeEvents returns the events every consumer received between before
// and after, and the floor: for each node, the events of one consumer of
// each kind (roleKind), whose consumers on one node watch the same; the
// kinds watch different resources, so the floor is what a node needs,
// each event once.
func nodeEvents(before, after []consumerState) (all, floor float64) {
	type id struct {
		node int
		role string
	}
	was := map[id]int64{}
	for _, st := range before {
		was[id{st.Node, st.Role}] = st.Events
	}
	type kindOf struct {
		node int
		kind string
	}
	perKind := map[kindOf]int64{}
	for _, st := range after {
		n := st.Events - was[id{st.Node, st.Role}]
		all += float64(n)
		k := kindOf{st.Node, roleKind(st.Role)}
		perKind[k] = max(perKind[k], n)
	}
	for _, n := range perKind {
		floor += float64(n)
	}
	return all, floor
}

// profileCPU starts a CPU profile of node 0's daemon over the steady
// window, less a second, if -cpu-profiles asks for one; the function it
// returns waits for the profile and writes it.
func (f *fleet) profileCPU(ctx context.Context) func() error {
	h := f.h
	if h.cpuProfiles == "" || f.daemons == nil {
		return func() error { return nil }
	}
	d := f.daemons[0]
	done := make(chan error, 1)
	go func() { // ends with the profile's seconds or ctx
		url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", d.metrics, int((h.w.Steady - time.Second).Seconds()))
		b, err := scrape(ctx, url, h.scraper)
		if err == nil {
			file := filepath.Join(h.cpuProfiles, fmt.Sprintf("%s-%d.pprof", f.mode, f.k))
			if err = os.MkdirAll(h.cpuProfiles, 0o755); err == nil {
				err = os.WriteFile(file, b, 0o644)
			}
		}
		done <- err
	}()
	return func() error { return <-done }
}

// churn writes at the workload's rate until the returned function is
// called (again: a no-op), which returns the first write error.
func (h *fleetHarness) churn(ctx context.Context) func() error {
	ctx, cancel := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(ctx)
	ticks := make(chan int)
	g.Go(func() error {
		defer close(ticks)
		t := time.NewTicker(time.Second / time.Duration(h.w.Rate))
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
			}
			select {
			case ticks <- i:
			case <-gctx.Done():
				return nil
			}
		}
	})
	for range 8 {
		g.Go(func() error {
			for i := range ticks {
				if err := h.write(gctx, i); err != nil && gctx.Err() == nil {
					return err
				}
			}
			return nil
		})
	}
	return func() error { cancel(); return g.Wait() }
}

// write makes churn write i: a Pod half the time, an EndpointSlice or a
// ConfigMap a quarter each, each a change of an annotation.
func (h *fleetHarness) write(ctx context.Context, i int) error {
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"bench/seq":"%d"}}}`, i))
	a := h.admin
	var err error
	switch i % 4 {
	case 0, 1:
		k := rand.IntN(h.w.Nodes)
		_, err = a.CoreV1().Pods(fleetNamespace(k)).Patch(ctx, fmt.Sprintf("p-%03d-%03d", k, rand.IntN(h.w.PodsPerNode)), types.MergePatchType, patch, metav1.PatchOptions{})
	case 2:
		s := rand.IntN(h.w.Services)
		_, err = a.DiscoveryV1().EndpointSlices(fleetNamespace(s)).Patch(ctx, fmt.Sprintf("svc-%02d", s), types.MergePatchType, patch, metav1.PatchOptions{})
	default:
		n := rand.IntN(fleetNamespaces)
		_, err = a.CoreV1().ConfigMaps(fleetNamespace(n)).Patch(ctx, fmt.Sprintf("cm-%03d", rand.IntN(h.w.ConfigMapsPerNS)), types.MergePatchType, patch, metav1.PatchOptions{})
	}
	return err
}

// probe writes the probe objects of nodes (their Pods, their namespaces'
// ConfigMaps, the probe EndpointSlice) and returns the resourceVersions
// the writes returned, by state key. It retries while the API server
// comes back.
func (h *fleetHarness) probe(ctx context.Context, nodes []int) (map[string]int64, error) {
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"bench/probe":"%d"}}}`, time.Now().UnixNano()))
	var mu sync.Mutex
	out := map[string]int64{}
	put := func(key, rv string) {
		n, _ := strconv.ParseInt(rv, 10, 64)
		mu.Lock()
		out[key] = n
		mu.Unlock()
	}
	retry := func(ctx context.Context, fn func() error) error {
		return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return fn() == nil, nil
		})
	}
	namespaces := map[int]bool{}
	for _, k := range nodes {
		namespaces[k%fleetNamespaces] = true
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, k := range nodes {
		g.Go(func() error {
			return retry(gctx, func() error {
				p, err := h.admin.CoreV1().Pods(fleetNamespace(k)).Patch(gctx, "probe-"+fleetNodeName(k), types.MergePatchType, patch, metav1.PatchOptions{})
				if err == nil {
					put(probePodKey(k), p.ResourceVersion)
				}
				return err
			})
		})
	}
	for n := range namespaces {
		g.Go(func() error {
			return retry(gctx, func() error {
				c, err := h.admin.CoreV1().ConfigMaps(fleetNamespace(n)).Patch(gctx, "probe-cm", types.MergePatchType, patch, metav1.PatchOptions{})
				if err == nil {
					put(probeConfigMapKey(n), c.ResourceVersion)
				}
				return err
			})
		})
	}
	g.Go(func() error {
		return retry(gctx, func() error {
			s, err := h.admin.DiscoveryV1().EndpointSlices(fleetNamespace(0)).Patch(gctx, "probe-slice", types.MergePatchType, patch, metav1.PatchOptions{})
			if err == nil {
				put(probeSliceKey, s.ResourceVersion)
			}
			return err
		})
	})
	return out, g.Wait()
}

// seen waits until every consumer of nodes has seen its probe and returns
// the latest time one did.
func (f *fleet) seen(ctx context.Context, nodes []int, probes map[string]int64) (time.Time, error) {
	body, _ := json.Marshal(seenRequest{Probes: probes, Timeout: 3 * time.Minute})
	var latest time.Time
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range f.procs {
		if !slices.ContainsFunc(nodes, func(k int) bool { return k >= p.first && k < p.first+p.num }) {
			continue
		}
		g.Go(func() error {
			req, _ := http.NewRequestWithContext(gctx, http.MethodPost, "http://fleet/seen", bytes.NewReader(body))
			resp, err := p.http.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var rep seenReply
			if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
				return err
			}
			if len(rep.Missing) > 0 {
				return fmt.Errorf("%d consumers never saw their probe, e.g. %s", len(rep.Missing), rep.Missing[0])
			}
			mu.Lock()
			if rep.Latest.After(latest) {
				latest = rep.Latest
			}
			mu.Unlock()
			return nil
		})
	}
	return latest, g.Wait()
}

// lost waits (up to 2 minutes) until every consumer's store holds what
// the API server holds for its scope, at the same resourceVersions, and
// returns how many objects still differ then.
func (f *fleet) lost(ctx context.Context) (int, error) {
	var diff int
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		want, err := f.h.truth(ctx)
		if err != nil {
			return false, nil // the API server may be coming back
		}
		states, err := f.states()
		if err != nil {
			return false, err
		}
		diff = 0
		for _, st := range states {
			diff += mapDiff(st.Items, want.scope(st.Role, st.Node))
		}
		return diff == 0, nil
	})
	if wait.Interrupted(err) {
		say("%d objects differ from the API server's after 2 minutes", diff)
		return diff, nil
	}
	return diff, err
}

// truth is the API server's objects, by state key.
type truth struct {
	podsByNode     map[string]map[string]string
	cluster        map[string]string // Services and EndpointSlices
	configMapsByNS map[string]map[string]string
}

func (t truth) scope(role string, node int) map[string]string {
	switch roleKind(role) {
	case "agent":
		return t.podsByNode[fleetNodeName(node)]
	case "proxy":
		return t.cluster
	default:
		return t.configMapsByNS[fleetNamespace(node)]
	}
}

func (h *fleetHarness) truth(ctx context.Context) (truth, error) {
	t := truth{podsByNode: map[string]map[string]string{}, cluster: map[string]string{}, configMapsByNS: map[string]map[string]string{}}
	pods, err := h.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return t, err
	}
	for _, p := range pods.Items {
		m := t.podsByNode[p.Spec.NodeName]
		if m == nil {
			m = map[string]string{}
			t.podsByNode[p.Spec.NodeName] = m
		}
		m[stateKey(podsGVR, p.Namespace, p.Name)] = p.ResourceVersion
	}
	svcs, err := h.admin.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return t, err
	}
	for _, s := range svcs.Items {
		t.cluster[stateKey(servicesGVR, s.Namespace, s.Name)] = s.ResourceVersion
	}
	eps, err := h.admin.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return t, err
	}
	for _, s := range eps.Items {
		t.cluster[stateKey(slicesGVR, s.Namespace, s.Name)] = s.ResourceVersion
	}
	cms, err := h.admin.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return t, err
	}
	for _, c := range cms.Items {
		m := t.configMapsByNS[c.Namespace]
		if m == nil {
			m = map[string]string{}
			t.configMapsByNS[c.Namespace] = m
		}
		m[stateKey(configMapGVR, c.Namespace, c.Name)] = c.ResourceVersion
	}
	return t, nil
}

// mapDiff counts the keys whose values differ between a and b.
func mapDiff(a, b map[string]string) int {
	n := 0
	for k, v := range a {
		if b[k] != v {
			n++
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			n++
		}
	}
	return n
}

// sampler records the API server's peak request rate and CPU, over 1 s
// samples, until stop (idempotent) returns; read the peaks after it.
type sampler struct {
	peakReq, peakLists, peakCPU float64
	stop                        func()
}

func (h *fleetHarness) sample(ctx context.Context) *sampler {
	s := &sampler{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // ends at stop
		defer close(done)
		var last apiSample
		for {
			cur, err := h.apiMetrics(ctx)
			if err == nil && !last.at.IsZero() && cur.requests >= last.requests {
				dt := cur.at.Sub(last.at).Seconds()
				s.peakReq = max(s.peakReq, (cur.requests-last.requests)/dt)
				s.peakLists = max(s.peakLists, (cur.lists-last.lists)/dt)
				if cur.cpu >= last.cpu {
					s.peakCPU = max(s.peakCPU, (cur.cpu-last.cpu)/dt)
				}
			}
			if err == nil {
				last = cur
			} else {
				last = apiSample{}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	s.stop = func() { cancel(); <-done }
	return s
}

// upgrade restarts every node's daemon (direct: its consumers) in waves
// of 10% under churn, as a DaemonSet's rolling update with maxUnavailable
// 10% does, and measures each wave's catch-up.
func (f *fleet) upgrade(ctx context.Context) (*fleetDisruption, error) {
	h := f.h
	d := &fleetDisruption{}
	before, err := h.apiMetrics(ctx)
	if err != nil {
		return nil, err
	}
	s := h.sample(ctx)
	defer s.stop()
	churn := h.churn(ctx)
	defer func() { _ = churn() }() // on an early return; the error is the wave's
	start := time.Now()
	var catchUps, restarts []float64
	for _, nodes := range f.waves() {
		t0 := time.Now()
		if err := f.restartNodes(ctx, nodes); err != nil {
			return nil, err
		}
		restarts = append(restarts, time.Since(t0).Seconds())
		probes, err := h.probe(ctx, nodes)
		if err != nil {
			return nil, err
		}
		latest, err := f.seen(ctx, nodes, probes)
		if err != nil {
			return nil, err
		}
		catchUps = append(catchUps, latest.Sub(t0).Seconds())
	}
	d.Seconds = time.Since(start).Seconds()
	if err := churn(); err != nil {
		return nil, err
	}
	s.stop()
	after, err := h.apiMetrics(ctx)
	if err != nil {
		return nil, err
	}
	d.Lists, d.APICPUSeconds = after.lists-before.lists, after.cpu-before.cpu
	d.PeakRequestsPerSecond, d.PeakListsPerSecond, d.PeakAPICPU = s.peakReq, s.peakLists, s.peakCPU
	if f.mode == fleetInformerd {
		// Every daemon is a new one now, started by this upgrade.
		if d.DaemonLists, err = f.daemonsSum(ctx, "informerd_upstream_lists_total"); err != nil {
			return nil, err
		}
		f.startCPU.Lock()
		if f.startCPU.n > 0 {
			d.StartCPUSeconds = f.startCPU.seconds / float64(f.startCPU.n)
		}
		f.startCPU.seconds, f.startCPU.n = 0, 0
		f.startCPU.Unlock()
	}
	slices.Sort(catchUps)
	d.CatchUpMaxSeconds, d.CatchUpMedianSeconds = catchUps[len(catchUps)-1], catchUps[len(catchUps)/2]
	slices.Sort(restarts)
	d.RestartMaxSeconds, d.RestartMedianSeconds = restarts[len(restarts)-1], restarts[len(restarts)/2]
	d.Lost, err = f.lost(ctx)
	return d, err
}

// upgradeWhileDown kills the API server (-9) and, while it is down, rolls
// every node's daemon by handoff in waves of 10%, measuring how soon a new
// client of each node is served the handed-off state; then it starts the
// API server and measures until every consumer has seen a write made once
// it was ready, the LISTs that cost, and what was lost.
func (f *fleet) upgradeWhileDown(ctx context.Context) (*fleetDisruption, error) {
	h := f.h
	d := &fleetDisruption{}
	say("upgrade while the API server is down: kill -9, then %d nodes by handoff", f.k)
	h.cp.KillAPIServer()
	down := time.Now()
	start := time.Now()
	var served, connected []float64
	var mu sync.Mutex
	for _, nodes := range f.waves() {
		t0 := time.Now()
		if err := f.restartNodes(ctx, nodes); err != nil {
			return nil, err
		}
		err := parallel(ctx, len(nodes), func(ctx context.Context, i int) error {
			c0 := time.Now()
			if err := f.newClientSyncs(ctx, nodes[i]); err != nil {
				say("node %d not served while the API server is down: %v", nodes[i], err)
				mu.Lock()
				d.Unserved++
				mu.Unlock()
				return nil
			}
			mu.Lock()
			served = append(served, time.Since(t0).Seconds())
			connected = append(connected, time.Since(c0).Seconds())
			mu.Unlock()
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	d.Seconds = time.Since(start).Seconds()
	if len(served) > 0 {
		slices.Sort(served)
		d.ServedMaxSeconds, d.ServedMedianSeconds = served[len(served)-1], served[len(served)/2]
		slices.Sort(connected)
		d.ConnectedMaxSeconds, d.ConnectedMedianSeconds = connected[len(connected)-1], connected[len(connected)/2]
	}
	if err := sleep(ctx, max(0, h.w.Outage-time.Since(down))); err != nil {
		return nil, err
	}
	if err := h.cp.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	t0 := time.Now()
	latest, err := f.allSeen(ctx)
	if err != nil {
		return nil, err
	}
	d.CatchUpMaxSeconds = latest.Sub(t0).Seconds()
	d.CatchUpMedianSeconds = d.CatchUpMaxSeconds
	// The new daemons' own LISTs: each informer relists once if the
	// restarted API server answers its watch 410 Gone (its watch cache
	// begins after the handoff's position).
	if d.DaemonLists, err = f.daemonsSum(ctx, "informerd_upstream_lists_total"); err != nil {
		return nil, err
	}
	d.Lost, err = f.lost(ctx)
	return d, err
}

// waves splits the nodes into waves of 10%, as a DaemonSet's rolling
// update with maxSurge or maxUnavailable 10% does.
func (f *fleet) waves() [][]int {
	wave := max(1, f.k/10)
	var out [][]int
	for first := 0; first < f.k; first += wave {
		nodes := make([]int, 0, wave)
		for k := first; k < min(first+wave, f.k); k++ {
			nodes = append(nodes, k)
		}
		out = append(out, nodes)
	}
	return out
}

// allSeen writes every node's probes and returns the latest time one of
// their consumers saw its probe.
func (f *fleet) allSeen(ctx context.Context) (time.Time, error) {
	all := make([]int, f.k)
	for k := range all {
		all[k] = k
	}
	probes, err := f.h.probe(ctx, all)
	if err != nil {
		return time.Time{}, err
	}
	return f.seen(ctx, all, probes)
}

// newClientSyncs opens a stream of node k's daemon as a new client of the
// node's last role (a token its consumers use) and waits, at most 10 s,
// for its SYNCED.
func (f *fleet) newClientSyncs(ctx context.Context, k int) error {
	roles := fleetRoles(f.h.w.Profile, f.h.w.PodsPerNode)
	role := roles[len(roles)-1]
	w := fleetWatches(role, k)[0]
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cl, err := client.Dial(f.socket(k), client.WithTokenFile(filepath.Join(f.h.dir, fleetSA(role)+"-informerd")))
	if err != nil {
		return err
	}
	defer cl.Close()
	s, err := cl.Stream(ctx, client.WatchOptions{Resource: w.gvr, Namespace: w.namespace, FieldSelector: w.fieldSelector, ClientName: "bench-new-client", Protobuf: true}, "")
	if err != nil {
		return err
	}
	defer s.Close()
	for {
		evs, err := s.Recv()
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if ev.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED {
				return nil
			}
		}
	}
}

// restartNodes restarts the daemons of nodes; in direct mode, those nodes'
// consumers. In informerd mode, as deploy/'s surge upgrade does: a new
// daemon starts beside the old one and takes over by handoff, and it
// returns then, the old one, unready once it handed off, being stopped in
// the background (f.retiring). In informerd-norecovery
// mode (no handoff socket): SIGTERM, then a new daemon on the same socket.
func (f *fleet) restartNodes(ctx context.Context, nodes []int) error {
	return parallel(ctx, len(nodes), func(ctx context.Context, i int) error {
		k := nodes[i]
		if f.mode == fleetDirect {
			for _, p := range f.procs {
				if k >= p.first && k < p.first+p.num {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://fleet/restart?node="+strconv.Itoa(k), nil)
					resp, err := p.http.Do(req)
					if err != nil {
						return err
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						return fmt.Errorf("restarting node %d's consumers: %s", k, b)
					}
				}
			}
			return nil
		}
		old := f.daemons[k]
		if f.mode != fleetInformerd {
			old.stop()
			return f.startDaemon(ctx, k)
		}
		if err := f.startDaemon(ctx, k); err != nil {
			return err
		}
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, old.metrics+"/readyz", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusServiceUnavailable, nil
		})
		if err != nil {
			old.stop()
			return fmt.Errorf("node %d's old daemon never handed off: %w", k, err)
		}
		if cpu, err := f.daemons[k].cpu(); err == nil {
			f.startCPU.Lock()
			f.startCPU.seconds += cpu
			f.startCPU.n++
			f.startCPU.Unlock()
		}
		// Handed off, the old daemon serves nobody: the kubelet stops it
		// beside what follows, and no client waits for its end.
		f.retiring.Go(old.stop)
		return nil
	})
}

// restartAPIServer kills the API server (-9), keeps it down for the
// outage, starts it and measures until every consumer has seen a write
// made once it was ready.
func (f *fleet) restartAPIServer(ctx context.Context) (*fleetDisruption, error) {
	h := f.h
	d := &fleetDisruption{}
	say("API server: kill -9, down for %s", h.w.Outage)
	h.cp.KillAPIServer()
	if err := sleep(ctx, h.w.Outage); err != nil {
		return nil, err
	}
	if err := h.cp.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	t0 := time.Now()
	before, err := h.apiMetrics(ctx)
	if err != nil {
		return nil, err
	}
	s := h.sample(ctx)
	defer s.stop()
	latest, err := f.allSeen(ctx)
	if err != nil {
		return nil, err
	}
	d.Seconds = latest.Sub(t0).Seconds()
	d.CatchUpMaxSeconds, d.CatchUpMedianSeconds = d.Seconds, d.Seconds
	// The re-lists keep coming within the recovery window after the
	// probes are seen: sample until it has passed.
	if err := sleep(ctx, max(0, h.w.RecoveryWindow+5*time.Second-time.Since(t0))); err != nil {
		return nil, err
	}
	s.stop()
	after, err := h.apiMetrics(ctx)
	if err != nil {
		return nil, err
	}
	d.Lists, d.APICPUSeconds = after.lists-before.lists, after.cpu-before.cpu
	d.PeakRequestsPerSecond, d.PeakListsPerSecond, d.PeakAPICPU = s.peakReq, s.peakLists, s.peakCPU
	d.Lost, err = f.lost(ctx)
	return d, err
}

func printFleet(w io.Writer, runs []fleetRun) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tK\twatches p/s/es/cm\tLIST+WATCH at start\tAPI CPU s\tAPI RSS MiB\twatch events\twatch MB\tnode events\tfloor\tdaemons CPU s\tdaemons MiB\tconsumers CPU s\tconsumers MiB\tsync s\tlost\tupgrade catch-up max/med s\tof which restart max/med s\tupgrade peak req/s\tupgrade lists (daemons')\trestart converge s\trestart peak req/s\trestart lists\tlost (upg/restart)\t")
	for _, r := range runs {
		if r.Watches == nil { // the restart only
			fmt.Fprintf(tw, "%s\t%d\t-\t%.0f+%.0f\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%.1f\t-\t-\t-\t-\t-\t%.1f\t%.0f\t%.0f\t-/%d\t\n",
				r.Mode, r.K, r.StartLists, r.StartWatches, r.SyncSeconds, r.Restart.Seconds, r.Restart.PeakRequestsPerSecond, r.Restart.Lists, r.Restart.Lost)
			continue
		}
		upg := "-\t-\t-\t-\t"
		lostU := "-"
		if u := r.Upgrade; u != nil {
			lists := fmt.Sprintf("%.0f", u.Lists)
			if r.Mode == fleetInformerd {
				lists += fmt.Sprintf(" (%.0f; %.2f CPU s a start)", u.DaemonLists, u.StartCPUSeconds)
			}
			upg = fmt.Sprintf("%.1f/%.1f\t%.1f/%.1f\t%.0f\t%s\t", u.CatchUpMaxSeconds, u.CatchUpMedianSeconds, u.RestartMaxSeconds, u.RestartMedianSeconds, u.PeakRequestsPerSecond, lists)
			lostU = strconv.Itoa(u.Lost)
		}
		rs := "-\t-\t-\t"
		lostR := "-"
		if x := r.Restart; x != nil {
			rs = fmt.Sprintf("%.1f\t%.0f\t%.0f\t", x.Seconds, x.PeakRequestsPerSecond, x.Lists)
			lostR = strconv.Itoa(x.Lost)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f/%.0f/%.0f/%.0f\t%.0f+%.0f\t%.1f\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t%.1f\t%.0f\t%.1f\t%.0f\t%.1f\t%d\t%s%s%s/%s\t\n",
			r.Mode, r.K, r.Watches["pods"], r.Watches["services"], r.Watches["endpointslices"], r.Watches["configmaps"],
			r.StartLists, r.StartWatches, r.APICPUSeconds, float64(r.APIRSSBytes)/(1<<20), r.WatchEvents, r.WatchEventBytes/1e6, r.NodeEvents, r.FloorEvents,
			r.DaemonCPU, float64(r.DaemonRSS)/(1<<20), r.ConsumerCPU, float64(r.ConsumerRSS)/(1<<20), r.SyncSeconds, r.SteadyLost,
			upg, rs, lostU, lostR)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	header := false
	for _, r := range runs {
		d := r.DownUpgrade
		if d == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nupgrade while the API server is down (served: from a wave's start, and from the client's connecting, until a new client of each node synced):")
			fmt.Fprintln(tw, "mode\tK\tserved max/med s\tafter connecting max/med s\tnodes unserved\tconverge after the API server s\tdaemons' lists\tlost\t")
			header = true
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f/%.2f\t%.3f/%.3f\t%d\t%.1f\t%.0f\t%d\t\n", r.Mode, r.K, d.ServedMaxSeconds, d.ServedMedianSeconds,
			d.ConnectedMaxSeconds, d.ConnectedMedianSeconds, d.Unserved, d.CatchUpMaxSeconds, d.DaemonLists, d.Lost)
	}
	tw.Flush()
}
