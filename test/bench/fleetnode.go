package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/informerd/informerd/client"
)

// The node profiles of `bench fleet`: what consumers one simulated node
// runs.
const (
	// profileMix: M = 5 processes of three kinds that real nodes run.
	profileMix = "mix"
	// profileMesh: a node of meshed Pods, each with a data-plane proxy
	// watching every Service and EndpointSlice.
	profileMesh = "mesh"
)

var fleetProfiles = []string{profileMix, profileMesh}

// fleetRoles are the consumers of one simulated node of profile: with
// profileMesh, one proxy per Pod of the node.
func fleetRoles(profile string, podsPerNode int) []string {
	if profile != profileMesh {
		return []string{"agent-0", "agent-1", "proxy-0", "proxy-1", "applier"}
	}
	roles := make([]string, podsPerNode)
	for i := range roles {
		roles[i] = fmt.Sprintf("proxy-%d", i)
	}
	return roles
}

// roleKind is what a role is: agent, proxy or applier.
func roleKind(role string) string {
	kind, _, _ := strings.Cut(role, "-")
	return kind
}

var (
	podsGVR      = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	servicesGVR  = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	slicesGVR    = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	configMapGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// fleetWatch is one informer of a consumer.
type fleetWatch struct {
	gvr                      schema.GroupVersionResource
	namespace, fieldSelector string
	example                  kruntime.Object
}

// fleetWatches is what a role watches on node.
func fleetWatches(role string, node int) []fleetWatch {
	switch roleKind(role) {
	case "agent": // a node agent: the Pods bound to its node
		return []fleetWatch{{gvr: podsGVR, fieldSelector: "spec.nodeName=" + fleetNodeName(node), example: &corev1.Pod{}}}
	case "proxy": // a data-plane proxy: every Service and EndpointSlice
		return []fleetWatch{{gvr: servicesGVR, example: &corev1.Service{}}, {gvr: slicesGVR, example: &discoveryv1.EndpointSlice{}}}
	default: // an applier or controller: the ConfigMaps of its namespace
		return []fleetWatch{{gvr: configMapGVR, namespace: fleetNamespace(node), example: &corev1.ConfigMap{}}}
	}
}

func fleetNodeName(k int) string  { return fmt.Sprintf("fleet-node-%03d", k) }
func fleetNamespace(k int) string { return fmt.Sprintf("fleet-%d", k%fleetNamespaces) }

// fleetSA is the ServiceAccount of a role kind, in fleetNamespace(0).
func fleetSA(role string) string { return "fleet-" + roleKind(role) }

// stateKey names an object in a consumer's state: resource/namespace/name.
func stateKey(gvr schema.GroupVersionResource, ns, name string) string {
	return gvr.Resource + "/" + ns + "/" + name
}

// consumer is one role of one node: its informers, run until stop.
type consumer struct {
	node    int
	role    string
	infs    []cache.SharedIndexInformer
	gvrs    []schema.GroupVersionResource
	stop    context.CancelFunc
	done    sync.WaitGroup
	closeFn func()

	// events counts the adds, updates and deletes its informers' handlers
	// received: what the API server (direct) or the daemon sent it.
	events atomic.Int64

	mu   sync.Mutex
	seen map[string]seenAt // probes: the newest resourceVersion and when
}

type seenAt struct {
	rv int64
	at time.Time
}

// fleetNodes is the role of one process holding the consumers of some
// nodes, direct or through each node's daemon. It prints "synced" when
// every informer has synced, then serves its state over HTTP on -listen
// until stdin closes.
type fleetNodes struct {
	mode, kubeconfig, socketDir, tokenDir string
	roles                                 []string // of each node

	mu        sync.Mutex
	consumers map[int][]*consumer // by node
}

func runFleetNodes(args []string) error {
	fs := flag.NewFlagSet("fleetnodes", flag.ContinueOnError)
	f := &fleetNodes{consumers: map[int][]*consumer{}}
	fs.StringVar(&f.mode, "mode", "direct", "direct, or informerd (any informerd mode)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	fs.StringVar(&f.socketDir, "socket-dir", "", "directory of the daemons' sockets, node-<k>.sock")
	fs.StringVar(&f.tokenDir, "token-dir", "", "directory of the roles' token files, <ServiceAccount>-api and <ServiceAccount>-informerd")
	first := fs.Int("first-node", 0, "first node index")
	count := fs.Int("nodes", 1, "number of nodes")
	listen := fs.String("listen", "", "Unix socket to serve /state, /seen and /restart on")
	profile := fs.String("profile", profileMix, "node profile: "+strings.Join(fleetProfiles, ", "))
	podsPerNode := fs.Int("pods-per-node", 30, "Pods per node (with -profile mesh, one proxy each)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f.roles = fleetRoles(*profile, *podsPerNode)
	// Reflectors log every failed watch (an API server restart: hundreds
	// of lines); the harness measures outcomes, not log lines.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for k := *first; k < *first+*count; k++ {
		if err := f.startNode(ctx, k); err != nil {
			return err
		}
	}
	fmt.Println("synced")
	l, err := net.Listen("unix", *listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", f.serveState)
	mux.HandleFunc("POST /seen", f.serveSeen)
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, r *http.Request) {
		k, err := strconv.Atoi(r.URL.Query().Get("node"))
		if err == nil {
			f.stopNode(k)
			err = f.startNode(r.Context(), k)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }() // ends at Close below
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	f.mu.Lock()
	nodes := make([]int, 0, len(f.consumers))
	for k := range f.consumers {
		nodes = append(nodes, k)
	}
	f.mu.Unlock()
	for _, k := range nodes {
		f.stopNode(k)
	}
	return nil
}

// startNode starts node k's consumers and waits until they have synced.
func (f *fleetNodes) startNode(ctx context.Context, k int) error {
	var cs []*consumer
	for _, role := range f.roles {
		c, err := f.startConsumer(k, role)
		if err != nil {
			return fmt.Errorf("node %d, %s: %w", k, role, err)
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		for _, inf := range c.infs {
			if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				return fmt.Errorf("node %d, %s: not synced", k, c.role)
			}
		}
	}
	f.mu.Lock()
	f.consumers[k] = cs
	f.mu.Unlock()
	return nil
}

func (f *fleetNodes) stopNode(k int) {
	f.mu.Lock()
	cs := f.consumers[k]
	delete(f.consumers, k)
	f.mu.Unlock()
	for _, c := range cs {
		c.stop()
		c.done.Wait()
		c.closeFn()
	}
}

// startConsumer starts one role's informers, as a process of its own
// would: its own connection, typed objects in protobuf.
func (f *fleetNodes) startConsumer(k int, role string) (*consumer, error) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{node: k, role: role, stop: cancel, closeFn: func() {}, seen: map[string]seenAt{}}
	watches := fleetWatches(role, k)
	if f.mode == "direct" {
		cfg, err := directConfig(f.kubeconfig, f.tokenDir+"/"+fleetSA(role)+"-api")
		if err != nil {
			return nil, err
		}
		cfg.ContentType = kruntime.ContentTypeProtobuf
		cfg.QPS, cfg.Burst = -1, 0 // a process of its own: no rate limiter shared with the others
		// Nor a connection: client-go shares one transport (and so one
		// HTTP/2 connection) among the clients of a process whose
		// configs match, unless a Proxy func makes them uncacheable. A
		// restarted consumer then connects (and shakes hands) anew, and
		// a stopped one closes its connection, as a process's exit does.
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return nil, err
		}
		c.closeFn = hc.CloseIdleConnections // its watches ended with stop
		kc, err := kubernetes.NewForConfigAndClient(cfg, hc)
		if err != nil {
			return nil, err
		}
		for _, w := range watches {
			fs := w.fieldSelector
			fac := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(w.namespace),
				informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = fs }))
			inf, err := fac.ForResource(w.gvr)
			if err != nil {
				return nil, err
			}
			c.add(inf.Informer(), w.gvr)
		}
	} else {
		cl, err := client.Dial(fmt.Sprintf("%s/node-%d.sock", f.socketDir, k), client.WithTokenFile(f.tokenDir+"/"+fleetSA(role)+"-informerd"))
		if err != nil {
			return nil, err
		}
		c.closeFn = func() { cl.Close() }
		for _, w := range watches {
			lw := client.NewListerWatcher(cl, client.WatchOptions{Resource: w.gvr, Namespace: w.namespace, FieldSelector: w.fieldSelector, ClientName: role, Protobuf: true})
			c.add(cache.NewSharedIndexInformer(lw, w.example, 0, cache.Indexers{}), w.gvr)
		}
	}
	for _, inf := range c.infs {
		c.done.Add(1)
		go func() { defer c.done.Done(); inf.Run(ctx.Done()) }() // ends with stop
	}
	return c, nil
}

// add registers inf, recording when it sees each probe object.
func (c *consumer) add(inf cache.SharedIndexInformer, gvr schema.GroupVersionResource) {
	record := func(obj any) {
		c.events.Add(1)
		m, err := meta.Accessor(obj)
		if err != nil || !isProbe(m.GetName()) {
			return
		}
		rv, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
		c.mu.Lock()
		defer c.mu.Unlock()
		key := stateKey(gvr, m.GetNamespace(), m.GetName())
		if rv > c.seen[key].rv {
			c.seen[key] = seenAt{rv: rv, at: time.Now()}
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: func(any) { c.events.Add(1) },
	})
	c.infs = append(c.infs, inf)
	c.gvrs = append(c.gvrs, gvr)
}

func isProbe(name string) bool { return len(name) >= 6 && name[:6] == "probe-" }

// consumerState is one consumer's store (state key -> resourceVersion)
// and the events its handlers received so far.
type consumerState struct {
	Node   int               `json:"node"`
	Role   string            `json:"role"`
	Items  map[string]string `json:"items"`
	Events int64             `json:"events"`
}

func (f *fleetNodes) serveState(w http.ResponseWriter, _ *http.Request) {
	var out []consumerState
	f.mu.Lock()
	for _, cs := range f.consumers {
		for _, c := range cs {
			st := consumerState{Node: c.node, Role: c.role, Items: map[string]string{}, Events: c.events.Load()}
			for i, inf := range c.infs {
				for _, obj := range inf.GetStore().List() {
					m, err := meta.Accessor(obj)
					if err == nil {
						st.Items[stateKey(c.gvrs[i], m.GetNamespace(), m.GetName())] = m.GetResourceVersion()
					}
				}
			}
			out = append(out, st)
		}
	}
	f.mu.Unlock()
	_ = json.NewEncoder(w).Encode(out)
}

// seenRequest asks when each consumer saw the probes: Probes maps a state
// key to the resourceVersion its last write returned. A consumer is asked
// about each probe in its scope.
type seenRequest struct {
	Probes  map[string]int64 `json:"probes"`
	Timeout time.Duration    `json:"timeout"`
}

// seenReply is the latest time any asked consumer saw its probe, or the
// consumers that had not by the timeout.
type seenReply struct {
	Latest  time.Time `json:"latest"`
	Missing []string  `json:"missing,omitempty"`
}

func (f *fleetNodes) serveSeen(w http.ResponseWriter, r *http.Request) {
	var req seenRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	deadline := time.Now().Add(req.Timeout)
	for {
		rep := f.seen(req.Probes)
		if len(rep.Missing) == 0 || time.Now().After(deadline) {
			_ = json.NewEncoder(w).Encode(rep)
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (f *fleetNodes) seen(probes map[string]int64) seenReply {
	var rep seenReply
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cs := range f.consumers {
		for _, c := range cs {
			for _, key := range c.probeKeys() {
				want, ok := probes[key]
				if !ok {
					continue
				}
				c.mu.Lock()
				s := c.seen[key]
				c.mu.Unlock()
				switch {
				case s.rv < want:
					rep.Missing = append(rep.Missing, fmt.Sprintf("node %d %s: %s at %d (has %d)", c.node, c.role, key, want, s.rv))
				case s.at.After(rep.Latest):
					rep.Latest = s.at
				}
			}
		}
	}
	return rep
}

// probeKeys are the probe objects in c's scope (fleet.go writes them).
func (c *consumer) probeKeys() []string {
	switch roleKind(c.role) {
	case "agent":
		return []string{probePodKey(c.node)}
	case "proxy":
		return []string{probeSliceKey}
	default:
		return []string{probeConfigMapKey(c.node)}
	}
}

func probePodKey(k int) string {
	return stateKey(podsGVR, fleetNamespace(k), "probe-"+fleetNodeName(k))
}

var probeSliceKey = stateKey(slicesGVR, fleetNamespace(0), "probe-slice")

func probeConfigMapKey(k int) string { return stateKey(configMapGVR, fleetNamespace(k), "probe-cm") }
