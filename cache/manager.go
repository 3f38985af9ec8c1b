package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ScopeStrategy decides which upstream scope serves a namespaced request,
// as cli-utils' RESTScopeStrategy does for one applier.
type ScopeStrategy string

// Scope strategies.
const (
	// ScopeAutomatic watches all namespaces when the daemon may list and
	// watch the resource cluster-wide, else the requested namespace.
	ScopeAutomatic ScopeStrategy = "automatic"
	// ScopeCluster always watches all namespaces and filters.
	ScopeCluster ScopeStrategy = "cluster"
	// ScopeNamespace watches each requested namespace separately.
	ScopeNamespace ScopeStrategy = "namespace"
)

// Options configure a Manager. Zero values take the documented defaults.
type Options struct {
	// Config reaches the API server. Required.
	Config *rest.Config
	// Scope is the scope strategy. Default ScopeAutomatic.
	Scope ScopeStrategy
	// LingerTTL is how long an unused Source keeps running, so that clients
	// that reconnect or re-run cause no relist. Default 2m.
	LingerTTL time.Duration
	// MaxLingering bounds the number of unused Sources kept; the least
	// recently used is stopped first. Default 128.
	MaxLingering int
	// Log bounds each Source's event log.
	Log LogLimits
	// KeepManagedFields keeps metadata.managedFields. Default false.
	KeepManagedFields bool
	// PageSize is the LIST page size. Default 500.
	PageSize int64
	// UpstreamTimeout bounds each LIST page and how long a watch may bring
	// nothing before it is abandoned and re-opened (the API server sends a
	// bookmark about every minute). Default 2m.
	UpstreamTimeout time.Duration
	// DisableWatchList lists with LIST instead of WatchList streaming.
	DisableWatchList bool
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics. Default: none are registered.
	Registerer prometheus.Registerer
}

// Request is what a subscriber asks for. The daemon validates it first.
type Request struct {
	// GVR is the resource. With Kind set, GVR.Resource is ignored, the
	// group is Kind's and an empty version means the preferred one.
	GVR schema.GroupVersionResource
	// Kind, if set, names the resource by kind.
	Kind      string
	Namespace string
	Filter    Filter // Filter.Namespace is set from Namespace
	// FieldSelector, canonical, is evaluated by the API server.
	FieldSelector string
	// Resume is a resourceVersion to resume after; "" for a snapshot.
	Resume string
	// WaitForResource waits for an unknown resource to appear (for example
	// a CRD being created) instead of failing with ErrUnknownResource.
	WaitForResource bool
	// Holder names the subscriber in introspection.
	Holder string
	// Protobuf asks for built-in types in the API server's protobuf
	// encoding; other resources, which have none, come as JSON. Protobuf
	// and JSON subscribers of one resource are served by separate Sources.
	Protobuf bool
}

// Manager owns the Sources: it starts one per Key on the first
// subscription, keeps it while subscribed, lets it linger when unused, and
// stops it on eviction. Its methods are safe for concurrent use.
type Manager struct {
	opts    Options
	client  rest.Interface
	kube    kubernetes.Interface
	mapper  *restmapper.DeferredDiscoveryRESTMapper
	log     *slog.Logger
	metrics *metrics
	ctx     context.Context // parent of every Source; ended by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // eviction and stopping goroutines
	// closing is set before Close purges the LRU, so that the LRU's expiry
	// goroutine starts no more work.
	closing atomic.Bool

	mu      sync.Mutex // guards sources, closed and scopeCache; before lru's lock
	sources map[Key]*entry
	closed  bool
	// scopeCache remembers whether the daemon may watch a resource
	// cluster-wide (ScopeAutomatic), for a minute.
	scopeCache map[schema.GroupVersionResource]scopeDecision
	reviews    singleflight.Group // of reviewClusterAccess, by GVR
	lru        *expirable.LRU[Key, *entry]
}

// entry is one Source and who holds it.
type entry struct {
	src     *Source
	refs    int
	holders map[string]int
}

type scopeDecision struct {
	cluster bool
	at      time.Time
}

// NewManager returns a Manager; Close stops it.
func NewManager(opts Options) (*Manager, error) {
	if opts.Config == nil {
		return nil, errors.New("cache: Options.Config is required")
	}
	if opts.Scope == "" {
		opts.Scope = ScopeAutomatic
	}
	switch opts.Scope {
	case ScopeAutomatic, ScopeCluster, ScopeNamespace:
	default:
		return nil, fmt.Errorf("cache: unknown scope strategy %q (want automatic, cluster or namespace)", opts.Scope)
	}
	if opts.LingerTTL <= 0 {
		opts.LingerTTL = 2 * time.Minute
	}
	if opts.MaxLingering <= 0 {
		opts.MaxLingering = 128
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 500
	}
	if opts.UpstreamTimeout <= 0 {
		opts.UpstreamTimeout = 2 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cfg := rest.CopyConfig(opts.Config)
	cfg.GroupVersion = &schema.GroupVersion{}
	cfg.APIPath = "/"
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion() // decodes error Status only
	cfg.AcceptContentTypes = "application/json"
	client, err := rest.UnversionedRESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	kube, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	m := &Manager{
		opts: opts, client: client, kube: kube,
		mapper:     restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		log:        opts.Logger,
		metrics:    newMetrics(opts.Registerer),
		sources:    map[Key]*entry{},
		scopeCache: map[schema.GroupVersionResource]scopeDecision{},
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(sourceCollector{m}); err != nil {
			return nil, fmt.Errorf("cache: registering metrics: %w", err)
		}
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.lru = expirable.NewLRU[Key, *entry](opts.MaxLingering, m.onEvict, opts.LingerTTL)
	return m, nil
}

// Subscribe resolves req to a Key, acquires its Source (starting it if
// needed), waits until the Source has synced, and positions a Subscription
// after req.Resume. The caller must Close the Subscription.
//
// Errors: ErrUnknownResource (wrapped, naming the resource); ErrNotSynced
// wrapping the upstream cause when the first list failed; ctx.Err().
func (m *Manager) Subscribe(ctx context.Context, req Request) (*Subscription, error) {
	key, gvk, err := m.resolve(ctx, req)
	if err != nil {
		return nil, err
	}
	src, release, err := m.acquire(key, gvk, req.Holder)
	if err != nil {
		return nil, err
	}
	req.Filter.Namespace = req.Namespace
	sub := &Subscription{src: src, filter: req.Filter, release: release}
	if err := sub.start(ctx, req.Resume); err != nil {
		sub.Close()
		return nil, err
	}
	m.metrics.subscribers.Inc()
	sub.release = func() { m.metrics.subscribers.Dec(); release() }
	return sub, nil
}

// resolve maps a request to the Key that serves it.
func (m *Manager) resolve(ctx context.Context, req Request) (Key, schema.GroupVersionKind, error) {
	mapping, err := m.lookup(ctx, req)
	if err != nil {
		return Key{}, schema.GroupVersionKind{}, err
	}
	gvk := mapping.GroupVersionKind
	// Built-in types are the ones client-go knows: the API server encodes
	// them in protobuf. Custom resources have only JSON.
	key := Key{GVR: mapping.Resource, FieldSelector: req.FieldSelector, Protobuf: req.Protobuf && scheme.Scheme.Recognizes(gvk)}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace || req.Namespace == "" {
		return key, gvk, nil
	}
	switch m.opts.Scope {
	case ScopeNamespace:
		if !m.running(key) { // a running cluster-wide Source serves it already
			key.Namespace = req.Namespace
		}
	case ScopeAutomatic:
		if !m.mayWatchCluster(ctx, key.GVR) {
			key.Namespace = req.Namespace
		}
	}
	return key, gvk, nil
}

// running reports whether a Source for key runs and can serve.
func (m *Manager) running(key Key) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.sources[key]
	return e != nil && !e.src.stopped()
}

// discoveryRetry is how often a request waiting for its resource rereads
// discovery.
const discoveryRetry = time.Second

// lookup maps a request's resource (or kind) through discovery, rereading
// it once when the resource is unknown, and, if the request waits, every
// discoveryRetry until it appears or ctx ends.
func (m *Manager) lookup(ctx context.Context, req Request) (*meta.RESTMapping, error) {
	what := gvrString(req.GVR)
	if req.Kind != "" {
		what = "kind " + schema.GroupKind{Group: req.GVR.Group, Kind: req.Kind}.String()
	}
	for reset := false; ; reset = true {
		if reset {
			m.mapper.Reset()
		}
		mapping, err := m.mapping(req)
		if err == nil {
			return mapping, nil
		}
		if !meta.IsNoMatchError(err) {
			// The API server is unreachable or failing: retryable.
			return nil, fmt.Errorf("%w: discovering %s: %w", ErrNotSynced, what, err)
		}
		if !reset {
			continue
		}
		if !req.WaitForResource {
			return nil, fmt.Errorf("%w: the API server does not serve %s", ErrUnknownResource, what)
		}
		t := time.NewTimer(discoveryRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (m *Manager) mapping(req Request) (*meta.RESTMapping, error) {
	if req.Kind != "" {
		var versions []string
		if req.GVR.Version != "" {
			versions = append(versions, req.GVR.Version)
		}
		return m.mapper.RESTMapping(schema.GroupKind{Group: req.GVR.Group, Kind: req.Kind}, versions...)
	}
	gvk, err := m.mapper.KindFor(req.GVR)
	if err != nil {
		return nil, err
	}
	return m.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
}

func gvrString(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Resource + " (" + gvr.Version + ")"
	}
	return gvr.Resource + "." + gvr.Group + " (" + gvr.Version + ")"
}

// scopeTTL is how long a ScopeAutomatic decision is remembered.
const scopeTTL = time.Minute

// mayWatchCluster asks the API server whether the daemon itself may list
// and watch gvr in all namespaces.
func (m *Manager) mayWatchCluster(ctx context.Context, gvr schema.GroupVersionResource) bool {
	m.mu.Lock()
	d, ok := m.scopeCache[gvr]
	m.mu.Unlock()
	if ok && time.Since(d.at) < scopeTTL {
		return d.cluster
	}
	// Concurrent subscribers share one review: a burst of clients must not
	// become a burst of requests.
	v, _, _ := m.reviews.Do(gvr.String(), func() (any, error) { return m.reviewClusterAccess(ctx, gvr), nil })
	return v.(bool)
}

// reviewClusterAccess asks the question of mayWatchCluster and remembers
// a definite answer. An error answers "no" (the namespace scope is always
// safe) and is not remembered. The review outlives the asking subscriber,
// which may leave while others wait for the same answer.
func (m *Manager) reviewClusterAccess(ctx context.Context, gvr schema.GroupVersionResource) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.opts.UpstreamTimeout)
	defer cancel()
	allowed := true
	for _, verb := range []string{"list", "watch"} {
		r, err := m.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			m.log.Warn("access review failed; using the namespace scope", "resource", gvr.String(), "err", err)
			return false
		}
		if !r.Status.Allowed {
			allowed = false
			break
		}
	}
	m.mu.Lock()
	m.scopeCache[gvr] = scopeDecision{cluster: allowed, at: time.Now()}
	m.mu.Unlock()
	return allowed
}

// acquire returns the running Source for key, starting one if none runs,
// and a func that releases the hold.
func (m *Manager) acquire(key Key, gvk schema.GroupVersionKind, holder string) (*Source, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, ErrStopped
	}
	e := m.sources[key]
	if e != nil && e.src.stopped() {
		// Its holders still drain it; a new subscriber gets a new Source
		// (for example for a CRD that was deleted and created again).
		m.removeLocked(key, e)
		e = nil
	}
	if e == nil {
		up := &restUpstream{
			client: m.client, path: collectionPath(key), fieldSel: key.FieldSelector,
			pageSize: m.opts.PageSize, timeout: m.opts.UpstreamTimeout,
			stripMF: !m.opts.KeepManagedFields, watchList: !m.opts.DisableWatchList, protobuf: key.Protobuf,
		}
		e = &entry{src: newSource(key, up, m.opts.Log, m.opts.UpstreamTimeout, m.log, m.metrics), holders: map[string]int{}}
		e.src.apiVersion, e.src.kind = gvk.GroupVersion().String(), gvk.Kind
		e.src.start(m.ctx)
		m.sources[key] = e
		m.metrics.sources.Inc()
	} else if e.refs == 0 {
		m.lru.Remove(key) // onEvict sees refs > 0 and leaves it running
	}
	e.refs++
	e.holders[holder]++
	var once sync.Once
	return e.src, func() { once.Do(func() { m.release(key, e, holder) }) }, nil
}

func (m *Manager) release(key Key, e *entry, holder string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.refs--
	if e.holders[holder]--; e.holders[holder] == 0 {
		delete(e.holders, holder)
	}
	if e.refs > 0 || m.closed || m.sources[key] != e {
		return // still held, shutting down, or already replaced
	}
	if e.src.stopped() {
		m.removeLocked(key, e)
		return
	}
	m.lru.Add(key, e)
}

// onEvict runs under the LRU's lock, which must not wait for m.mu: it hands
// the entry to a goroutine that stops it if it is still unused.
func (m *Manager) onEvict(key Key, e *entry) {
	if m.closing.Load() {
		return // Close stops every Source itself
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.mu.Lock()
		defer m.mu.Unlock()
		if e.refs > 0 || m.sources[key] != e || m.lru.Contains(key) {
			return // re-acquired, or lingering again
		}
		m.removeLocked(key, e)
	}()
}

// removeLocked stops a Source and forgets it.
func (m *Manager) removeLocked(key Key, e *entry) {
	delete(m.sources, key)
	m.metrics.sources.Dec()
	e.src.cancel() // run ends promptly; Close waits for it
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		<-e.src.done
	}()
}

// SourceInfo describes one Source for introspection.
type SourceInfo struct {
	Status
	RefCount int
	Holders  []string
}

// Sources lists the Sources, sorted by Key.
func (m *Manager) Sources() []SourceInfo {
	m.mu.Lock()
	infos := make([]SourceInfo, 0, len(m.sources))
	srcs := make([]*Source, 0, len(m.sources))
	for _, e := range m.sources {
		info := SourceInfo{RefCount: e.refs}
		for h := range e.holders {
			info.Holders = append(info.Holders, h)
		}
		slices.Sort(info.Holders)
		infos = append(infos, info)
		srcs = append(srcs, e.src)
	}
	m.mu.Unlock()
	for i, s := range srcs {
		infos[i].Status = s.status()
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key.String() < infos[j].Key.String() })
	return infos
}

// Close stops every Source; their subscribers get ErrStopped. It waits for
// every goroutine the Manager started, except the LRU's own expiry
// goroutine, which golang-lru/v2 never stops.
func (m *Manager) Close() {
	m.closing.Store(true)
	m.mu.Lock()
	m.closed = true
	for key, e := range m.sources {
		m.removeLocked(key, e)
	}
	m.mu.Unlock()
	m.cancel()
	m.lru.Purge()
	m.wg.Wait()
}
