package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/wrapconfig"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// The client modes: what one client process runs.
const (
	modeDirect      = "direct"         // a client-go dynamic informer per resource
	modeStore       = "shared-store"   // informerd's client.Watcher (a local store)
	modeNoStore     = "shared-nostore" // informerd's client.Stream, no store
	modeDirectTyped = "direct-typed"   // a client-go typed informer (protobuf) per resource
	modeSharedTyped = "shared-typed"   // typed informers on informerd's ListerWatcher, protobuf
	// The same typed informers as direct-typed, unmodified, over
	// wrapconfig.Wrap of the same config.
	modeWrappedTyped = "wrapped-typed"
	modeDirectCtrl   = "direct-ctrl"  // a controller-runtime cache's informers
	modeWrappedCtrl  = "wrapped-ctrl" // the same over wrapconfig.Wrap
)

var modes = []string{modeDirect, modeStore, modeNoStore, modeDirectTyped, modeSharedTyped, modeWrappedTyped, modeDirectCtrl, modeWrappedCtrl}

// wrapped reports whether mode reads through wrapconfig.Wrap: it needs
// an informerd token and one for the API server.
func wrapped(mode string) bool { return strings.HasPrefix(mode, "wrapped") }

// stampAnnotation carries the UnixNano time at which the writer sent an
// update; clients compute delivery latency from it.
const stampAnnotation = "bench.informerd.io/written"

var resources = []schema.GroupVersionResource{
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "pods"},
}

// typedExamples are the Go types of resources, for typed informers.
var typedExamples = []kruntime.Object{&corev1.ConfigMap{}, &corev1.Pod{}}

// handler records every event of an informer with rec.
func handler(rec *recorder) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { rec.event("") },
		UpdateFunc: func(_, obj any) {
			m, _ := meta.Accessor(obj)
			rec.event(m.GetAnnotations()[stampAnnotation])
		},
		DeleteFunc: func(any) { rec.event("") },
	}
}

// clientResult is what a client process reports on stdout when it ends.
type clientResult struct {
	SyncSeconds float64 `json:"syncSeconds"` // process start to every resource synced
	Objects     int     `json:"objects"`     // objects received by then
	Events      int64   `json:"events"`      // events handled after sync
	// LatenciesMicros are write-to-handler latencies of stamped updates.
	LatenciesMicros []int64 `json:"latenciesMicros"`
	LastEventUnix   int64   `json:"lastEventUnixNano"`
	// HeapLive* are the live heap after a forced GC, before the watches
	// started and after sync.
	HeapLiveBase   uint64 `json:"heapLiveBase"`
	HeapLiveSynced uint64 `json:"heapLiveSynced"`
	// CPUSeconds, RSSBytes and PeakRSSBytes are the process's own usage
	// when it reports.
	CPUSeconds   float64 `json:"cpuSeconds"`
	RSSBytes     uint64  `json:"rssBytes"`
	PeakRSSBytes uint64  `json:"peakRssBytes"`
}

// recorder collects one client's events; handlers may run concurrently.
type recorder struct {
	mu        sync.Mutex
	synced    bool
	objects   int
	events    int64
	latencies []int64
	last      int64
	want      int // stamped updates the writer will send
	done      chan struct{}
}

// event records one event after sync; stamp is the annotation or "".
func (r *recorder) event(stamp string) {
	now := time.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.synced {
		r.objects++
		return
	}
	r.events++
	r.last = now
	if stamp == "" {
		return
	}
	if ns, err := strconv.ParseInt(stamp, 10, 64); err == nil {
		r.latencies = append(r.latencies, (now-ns)/1e3)
		if len(r.latencies) == r.want {
			close(r.done)
		}
	}
}

func (r *recorder) markSynced() {
	r.mu.Lock()
	r.synced = true
	r.mu.Unlock()
}

// directConfig reaches the API server of kubeconfig as the ServiceAccount
// whose token is in tokenFile, as a pod would.
func directConfig(kubeconfig, tokenFile string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg = rest.AnonymousClientConfig(cfg)
	cfg.BearerTokenFile = tokenFile
	return cfg, nil
}

// modeConfig is the rest.Config of a direct or wrapped mode: the same
// config, wrapped with wrapconfig.Wrap over the daemon at socket for the
// wrapped modes.
func modeConfig(mode, kubeconfig, socket, tokenFile, apiTokenFile, name string) (*rest.Config, error) {
	if !wrapped(mode) {
		return directConfig(kubeconfig, tokenFile)
	}
	cfg, err := directConfig(kubeconfig, apiTokenFile)
	if err != nil {
		return nil, err
	}
	c, err := client.Dial(socket, client.WithTokenFile(tokenFile))
	if err != nil {
		return nil, err
	}
	return wrapconfig.Wrap(cfg, c, wrapconfig.Options{ClientName: name}), nil
}

// runCtrlCache runs a controller-runtime cache of ConfigMaps and Pods in
// namespace, as a controller-runtime manager does, with rec's handler on
// its informers (wg tracks it); the channel closes once they have synced.
func runCtrlCache(ctx context.Context, wg *sync.WaitGroup, cfg *rest.Config, namespace string, rec *recorder, runErr chan<- error) (<-chan struct{}, error) {
	crc, err := crcache.New(cfg, crcache.Options{DefaultNamespaces: map[string]crcache.Config{namespace: {}}})
	if err != nil {
		return nil, err
	}
	for _, obj := range []crclient.Object{&corev1.ConfigMap{}, &corev1.Pod{}} {
		inf, err := crc.GetInformer(ctx, obj, crcache.BlockUntilSynced(false))
		if err != nil {
			return nil, err
		}
		if _, err := inf.AddEventHandler(handler(rec)); err != nil {
			return nil, err
		}
	}
	wg.Add(1)
	go func() { defer wg.Done(); runErr <- crc.Start(ctx) }() // ends with ctx
	ch := make(chan struct{})
	wg.Add(1)
	go func() { // ends when the cache syncs or ctx ends
		defer wg.Done()
		if crc.WaitForCacheSync(ctx) {
			close(ch)
		}
	}()
	return ch, nil
}

// runClient is the client role: watch the resources in namespace in the
// given mode, print "synced" once every resource is synced, and, once
// stdin closes, wait for the expected updates (or the timeout) and print a
// clientResult as JSON.
func runClient(args []string) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	mode := fs.String("mode", modeDirect, "direct, shared-store or shared-nostore")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (direct mode)")
	socket := fs.String("socket", "", "informerd socket (shared modes)")
	tokenFile := fs.String("token-file", "", "the client's ServiceAccount token: for informerd's audience (shared and wrapped modes) or the API server's (direct modes)")
	apiTokenFile := fs.String("api-token-file", "", "the client's ServiceAccount token for the API server (wrapped modes)")
	namespace := fs.String("namespace", "", "namespace to watch")
	name := fs.String("name", "bench", "client name")
	want := fs.Int("updates", 0, "stamped updates to wait for after stdin closes")
	wait := fs.Duration("timeout", time.Minute, "longest wait for the updates after stdin closes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	res := clientResult{HeapLiveBase: liveHeap()}
	rec := &recorder{want: *want, done: make(chan struct{})}
	if *want == 0 {
		close(rec.done)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		synced <-chan struct{}
		wg     sync.WaitGroup
		runErr = make(chan error, len(resources))
	)
	switch *mode {
	case modeDirect:
		cfg, err := directConfig(*kubeconfig, *tokenFile)
		if err != nil {
			return err
		}
		dc, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return err
		}
		f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dc, 0, *namespace, nil)
		var infs []cache.SharedIndexInformer
		for _, gvr := range resources {
			infs = append(infs, f.ForResource(gvr).Informer())
		}
		if synced, err = runInformers(ctx, &wg, infs, rec); err != nil {
			return err
		}
	case modeDirectTyped, modeWrappedTyped:
		cfg, err := modeConfig(*mode, *kubeconfig, *socket, *tokenFile, *apiTokenFile, *name)
		if err != nil {
			return err
		}
		cfg.ContentType = kruntime.ContentTypeProtobuf
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(*namespace))
		infs := []cache.SharedIndexInformer{f.Core().V1().ConfigMaps().Informer(), f.Core().V1().Pods().Informer()}
		if synced, err = runInformers(ctx, &wg, infs, rec); err != nil {
			return err
		}
	case modeDirectCtrl, modeWrappedCtrl:
		cfg, err := modeConfig(*mode, *kubeconfig, *socket, *tokenFile, *apiTokenFile, *name)
		if err != nil {
			return err
		}
		if synced, err = runCtrlCache(ctx, &wg, cfg, *namespace, rec, runErr); err != nil {
			return err
		}
	case modeSharedTyped:
		c, err := client.Dial(*socket, client.WithTokenFile(*tokenFile))
		if err != nil {
			return err
		}
		defer c.Close()
		var infs []cache.SharedIndexInformer
		for i, gvr := range resources {
			lw := client.NewListerWatcher(c, client.WatchOptions{Resource: gvr, Namespace: *namespace, ClientName: *name, Protobuf: true})
			infs = append(infs, cache.NewSharedIndexInformer(lw, typedExamples[i], 0, cache.Indexers{}))
		}
		if synced, err = runInformers(ctx, &wg, infs, rec); err != nil {
			return err
		}
	case modeStore, modeNoStore:
		c, err := client.Dial(*socket, client.WithTokenFile(*tokenFile))
		if err != nil {
			return err
		}
		defer c.Close()
		var left sync.WaitGroup
		left.Add(len(resources))
		ch := make(chan struct{})
		go func() { left.Wait(); close(ch) }() // ends when every resource synced
		for _, gvr := range resources {
			opts := client.WatchOptions{Resource: gvr, Namespace: *namespace, ClientName: *name}
			var once sync.Once
			onSynced := func() { once.Do(left.Done) }
			wg.Add(1)
			go func() {
				defer wg.Done()
				if *mode == modeStore {
					w := client.NewWatcher(c, opts, cache.ResourceEventHandlerFuncs{
						AddFunc:    func(any) { rec.event("") },
						UpdateFunc: func(_, obj any) { rec.event(obj.(*unstructured.Unstructured).GetAnnotations()[stampAnnotation]) },
						DeleteFunc: func(any) { rec.event("") },
					}, client.WatcherOptions{})
					go func() { // ends when the Watcher syncs or the run ends
						select {
						case <-w.Synced():
							onSynced()
						case <-ctx.Done():
						}
					}()
					runErr <- w.Run(ctx)
					return
				}
				runErr <- streamEvents(ctx, c, opts, rec, onSynced)
			}()
		}
		synced = ch
	default:
		return fmt.Errorf("-mode: unknown mode %q (want one of %s)", *mode, strings.Join(modes, ", "))
	}

	select {
	case <-synced:
	case err := <-runErr:
		return fmt.Errorf("watch ended before sync: %w", err)
	}
	rec.markSynced()
	res.SyncSeconds = time.Since(start).Seconds()
	res.HeapLiveSynced = liveHeap()
	fmt.Println("synced")

	// Stdin closes when the writer is done.
	_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	select {
	case <-rec.done:
	case <-time.After(*wait):
	case err := <-runErr:
		return fmt.Errorf("watch ended: %w", err)
	}
	cancel()
	wg.Wait()
	rec.mu.Lock()
	res.Objects, res.Events, res.LatenciesMicros, res.LastEventUnix = rec.objects, rec.events, rec.latencies, rec.last
	rec.mu.Unlock()
	res.CPUSeconds, res.RSSBytes, res.PeakRSSBytes = selfUsage()
	return json.NewEncoder(os.Stdout).Encode(res)
}

// runInformers adds rec's handler to each informer and runs them until ctx
// ends (wg tracks them); the channel closes once all have synced.
func runInformers(ctx context.Context, wg *sync.WaitGroup, infs []cache.SharedIndexInformer, rec *recorder) (<-chan struct{}, error) {
	var hasSynced []cache.InformerSynced
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(handler(rec)); err != nil {
			return nil, err
		}
		hasSynced = append(hasSynced, inf.HasSynced)
		wg.Add(1)
		go func() { defer wg.Done(); inf.RunWithContext(ctx) }()
	}
	ch := make(chan struct{})
	wg.Add(1)
	go func() { // ends when the caches sync or ctx ends
		defer wg.Done()
		if cache.WaitForCacheSync(ctx.Done(), hasSynced...) {
			close(ch)
		}
	}()
	return ch, nil
}

// streamEvents reads one stream and decodes only the stamp annotation of
// each object: a client without a store, such as a proxy that reacts to
// changes.
func streamEvents(ctx context.Context, c *client.Client, opts client.WatchOptions, rec *recorder, onSynced func()) error {
	s, err := c.Stream(ctx, opts, "")
	if err != nil {
		return err
	}
	defer s.Close()
	for {
		evs, err := s.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, ev := range evs {
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_SYNCED:
				onSynced()
			case informerdv1.EventType_EVENT_TYPE_BOOKMARK:
			case informerdv1.EventType_EVENT_TYPE_RESET:
				return errors.New("unexpected RESET")
			default:
				var h struct {
					Metadata struct {
						Annotations map[string]string `json:"annotations"`
					} `json:"metadata"`
				}
				if err := json.Unmarshal(ev.GetObject(), &h); err != nil {
					return err
				}
				rec.event(h.Metadata.Annotations[stampAnnotation])
			}
		}
	}
}

// liveHeap forces two GCs and returns the live heap the second found: the
// first leaves what sync.Pools held live in their victim caches (see the
// daemon's heapLive).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
