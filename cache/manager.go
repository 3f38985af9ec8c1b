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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/internal/fieldsel"
)

// ScopeStrategy decides which upstream scope serves a namespaced request,
// as cli-utils' RESTScopeStrategy does for one applier.
type ScopeStrategy string

// Scope strategies.
const (
	// ScopeAutomatic watches each requested namespace separately while
	// the node's subscriptions of a resource ask for fewer than
	// Options.ClusterAt namespaces, and all namespaces with one informer
	// when they ask for more (or for all of them) and the daemon may list
	// and watch the resource cluster-wide; subscriptions move between the
	// two without a RESET (scope.go).
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
	// that reconnect or re-run cause no relist; and how long ScopeAutomatic
	// keeps a cluster-wide informer after its subscriptions came to ask
	// for at most half of ClusterAt namespaces. Default 2m.
	LingerTTL time.Duration
	// ClusterAt is the number of namespaces of a resource the node's
	// subscriptions ask for at which ScopeAutomatic watches it
	// cluster-wide. Default 8.
	ClusterAt int
	// MaxLingering bounds the number of unused Sources kept; the least
	// recently used is stopped first. Default 128.
	MaxLingering int
	// Log bounds each Source's event log.
	Log LogLimits
	// StripManagedFields removes metadata.managedFields from stored and
	// served objects. Default false: they are served as the API server
	// sends them, and what they repeat across objects is stored once.
	StripManagedFields bool
	// PageSize is the LIST page size. Default 500.
	PageSize int64
	// UpstreamTimeout bounds each LIST page and how long a watch may bring
	// nothing before it is abandoned and re-opened (the API server sends a
	// bookmark about every minute). Default 2m.
	UpstreamTimeout time.Duration
	// RecoveryWindow spreads the informers' retries after an outage: when
	// the API server is reported back (UpstreamRecovered), each informer
	// waiting to retry it does so after a random delay in [0,
	// RecoveryWindow), instead of after its backoff (up to 30 s). The
	// fleet's re-list rate after an API server restart is then about
	// nodes × informers per node / RecoveryWindow. Default 10s; negative:
	// at once.
	RecoveryWindow time.Duration
	// DisableWatchList lists with LIST instead of WatchList streaming.
	DisableWatchList bool
	// Discovery, if set, is the API server's discovery as another
	// daemon's Manager held it (HandedDiscovery, in a handoff): the
	// Manager reads it first instead of asking the API server, until a
	// lookup rereads discovery. Nil: discovery is read when first needed.
	Discovery *HandedDiscovery
	// MaxObjectBytes refuses objects whose encoding is larger: they are not
	// served (a stored object that grows past it is served as deleted),
	// and each is logged, counted and named in the informer's status.
	// Default 0: no limit.
	MaxObjectBytes int
	// MaxSources bounds the informers that run at once, lingering ones
	// included: when it is reached, the least recently used lingering one
	// is stopped for a new one, and if none lingers the request fails
	// with ErrLimit. Default 0: no limit.
	MaxSources int
	// MaxSourcesPerOwner bounds the distinct informers the requests of one
	// Request.Owner hold at once; more fail with ErrLimit. OwnerInternal
	// is not limited. Default 0: no limit.
	MaxSourcesPerOwner int
	// MaxLogBytes bounds the object bytes that the event logs of all
	// informers refer to together (each is also bounded by Log.MaxBytes):
	// a log over it drops its oldest events. Default 0: no bound beyond
	// each log's.
	MaxLogBytes int64
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
	// Resume is a resourceVersion to resume after; "" for a snapshot. A
	// resourceVersion that is not a number resumes with a snapshot.
	Resume string
	// NotOlderThan, a resourceVersion, makes the subscription wait (up to
	// a few seconds, then ErrTooNew) until its informer has reached it, as
	// Resume does: a client that has seen a state never receives an older
	// one, even from another informer.
	NotOlderThan string
	// Owner is the identity on whose behalf the request is made, counted
	// against Options.MaxSourcesPerOwner. Required: nothing subscribes
	// uncounted.
	Owner string
	// WaitForResource waits for an unknown resource to appear (for example
	// a CRD being created) instead of failing with ErrUnknownResource.
	WaitForResource bool
	// Holder names the subscriber in introspection.
	Holder string
	// AdmitNew, if set, is called (under the Manager's lock: it must not
	// block) before a Source is started for the request, and before a
	// lingering one is stopped to make room for it; its error fails the
	// request. The daemon spends the caller's rate of new informers with
	// it.
	AdmitNew func() error
	// Protobuf asks for built-in types in the API server's protobuf
	// encoding; other resources, which have none, come as JSON. Protobuf
	// and JSON subscribers of one resource are served by separate Sources.
	Protobuf bool
	// ExistingInformerOnly subscribes only to a Source that runs or
	// lingers for the Key, failing with ErrNoInformer instead of starting
	// one: for one-off reads that a new informer would serve at a higher
	// cost to the API server than the read itself.
	ExistingInformerOnly bool
}

// OwnerInternal owns the subscriptions that informerd's own components
// (the status engine, the address tracker) make to serve what callers
// hold: it is counted but not limited, since each caller holds what they
// read (Manager.Hold) under its own Owner first.
const OwnerInternal = "informerd (internal)"

// errNoOwner: a Request without an Owner.
var errNoOwner = errors.New("cache: Request.Owner is required")

// Manager owns the Sources: it starts one per Key on the first
// subscription, keeps it while subscribed, lets it linger when unused, and
// stops it on eviction. Its methods are safe for concurrent use.
type Manager struct {
	opts Options
	kube kubernetes.Interface
	// disc is the discovery that lookups read (see rediscover); dc reads
	// a new one (nil in tests, which reset their mapper instead).
	disc atomic.Pointer[discoveryState]
	dc   discovery.DiscoveryInterface
	// discovering is held (a one-slot semaphore, so that waiting for it
	// heeds a context) by whoever decides to forget mapper's discovery;
	// forgotten, which it guards, is when that was last done.
	discovering chan struct{}
	forgotten   time.Time
	// crds watches the CustomResourceDefinitions (nil in tests that make
	// none), from the first lookup of a resource a CRD may serve.
	crds     *crdWatch
	recovery *recovery
	log      *slog.Logger
	metrics  *metrics
	budget   *logBudget
	// newUpstream makes the upstream of a Key (tests replace it).
	newUpstream func(Key) upstream
	// intern is what every upstream shares strings and managedFields
	// through (nil in tests), for the objects a handoff restores too.
	intern *interner
	ctx    context.Context // parent of every Source; ended by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // eviction and stopping goroutines
	// closing is set before Close purges the LRU, so that the LRU's expiry
	// goroutine starts no more work.
	closing atomic.Bool

	mu      sync.Mutex // guards the fields below; taken before lru's lock
	sources map[Key]*entry
	// owned counts the entries each Request.Owner holds.
	owned  map[string]int
	closed bool
	// rereading is set while rediscoverSoon's goroutine runs, and again
	// when it was asked for more while it did.
	rereading, again bool
	// scopeCache remembers whether the daemon may watch a resource
	// cluster-wide (ScopeAutomatic), for a minute.
	scopeCache map[schema.GroupVersionResource]scopeDecision
	reviews    singleflight.Group // of reviewClusterAccess, by GVR
	// scopes is what ScopeAutomatic knows of each namespaced resource
	// subscribed (scope.go), by its Key without a namespace.
	scopes map[Key]*scopeState
	lru    *expirable.LRU[Key, *entry]
}

// resettableMapper is a RESTMapper whose cached discovery can be dropped.
type resettableMapper interface {
	meta.RESTMapper
	Reset()
}

// entry is one Source and who holds it.
type entry struct {
	src     *Source
	refs    int
	holders map[string]int
	owners  map[string]int // holds per Request.Owner
}

type scopeDecision struct {
	cluster bool
	at      time.Time
}

// withDefaults returns opts with the documented defaults filled in.
func (opts Options) withDefaults() (Options, error) {
	if opts.Scope == "" {
		opts.Scope = ScopeAutomatic
	}
	switch opts.Scope {
	case ScopeAutomatic, ScopeCluster, ScopeNamespace:
	default:
		return opts, fmt.Errorf("cache: unknown scope strategy %q (want automatic, cluster or namespace)", opts.Scope)
	}
	if opts.LingerTTL <= 0 {
		opts.LingerTTL = 2 * time.Minute
	}
	if opts.ClusterAt <= 0 {
		opts.ClusterAt = 8
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
	if opts.RecoveryWindow == 0 {
		opts.RecoveryWindow = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return opts, nil
}

// NewManager returns a Manager; Close stops it.
func NewManager(opts Options) (*Manager, error) {
	if opts.Config == nil {
		return nil, errors.New("cache: Options.Config is required")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
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
	mc, err := metadata.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	intern := newInterner() // shared by every Source
	newUpstream := func(key Key) upstream {
		return &restUpstream{
			client: client, path: collectionPath(key), fieldSel: key.FieldSelector,
			pageSize: opts.PageSize, timeout: opts.UpstreamTimeout,
			stripMF: opts.StripManagedFields, intern: intern, watchList: !opts.DisableWatchList, protobuf: key.Protobuf,
		}
	}
	m := newManager(opts, nil, newUpstream)
	m.intern = intern
	m.kube = kube
	m.dc = dc
	m.crds = newCRDWatch(mc, m.crdDeleted)
	if opts.Discovery != nil {
		m.disc.Store(newDiscoveryState(opts.Discovery.over(dc)))
	} else {
		m.disc.Store(newDiscoveryState(dc))
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(sourceCollector{m}); err != nil {
			m.Close()
			return nil, fmt.Errorf("cache: registering metrics: %w", err)
		}
	}
	return m, nil
}

// newManager returns a Manager of defaulted opts that maps resources with
// mapper and reaches the API server through newUpstream.
func newManager(opts Options, mapper resettableMapper, newUpstream func(Key) upstream) *Manager {
	m := &Manager{
		opts: opts, newUpstream: newUpstream,
		discovering: make(chan struct{}, 1),
		recovery:    newRecovery(opts.RecoveryWindow),
		log:         opts.Logger,
		metrics:     newMetrics(opts.Registerer),
		budget:      &logBudget{max: opts.MaxLogBytes},
		sources:     map[Key]*entry{},
		owned:       map[string]int{},
		scopeCache:  map[schema.GroupVersionResource]scopeDecision{},
		scopes:      map[Key]*scopeState{},
	}
	m.disc.Store(&discoveryState{mapper: mapper})
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.lru = expirable.NewLRU[Key, *entry](opts.MaxLingering, m.onEvict, opts.LingerTTL)
	return m
}

// Subscribe resolves req to a Key, acquires its Source (starting it if
// needed), waits until the Source has synced, and positions a Subscription
// after req.Resume. The caller must Close the Subscription.
//
// Errors: ErrUnknownResource (wrapped, naming the resource); ErrNotSynced
// wrapping the upstream cause when the first list failed;
// ErrResourceRemoved when the API server no longer serves the resource
// (discovery is then reread); ErrCRDTerminating, unless req.Owner is
// OwnerInternal, while the resource's CustomResourceDefinition is being
// deleted; ctx.Err().
func (m *Manager) Subscribe(ctx context.Context, req Request) (*Subscription, error) {
	if req.Owner == "" {
		return nil, errNoOwner
	}
	key, gvk, automatic, err := m.resolve(ctx, req)
	if err != nil {
		return nil, err
	}
	if name, ok := fieldsel.OneObject(key.FieldSelector, req.Namespace); ok {
		// One object's field selector: an informer of them all serves it
		// if one runs, and no informer of its own lingers for it.
		if broad, ok := m.broader(key, req.Namespace); ok {
			key, req.Filter.Name = broad, name
		}
	}
	if req.Owner != OwnerInternal {
		// Whatever its informer holds, the API server may answer 404 any
		// moment now. The daemon's own components read on: their
		// informers end when the CRD is gone, as their readers expect.
		if err := m.terminatingErr(key.GVR.GroupResource()); err != nil {
			return nil, err
		}
	}
	src, release, started, err := m.acquire(key, gvk, req)
	if err != nil {
		return nil, err
	}
	if err := m.removedErr(key.GVR.GroupResource()); err != nil {
		// The CRD was deleted after the lookup, and crdDeleted may have
		// looked for the resource's Sources before acquire added this one.
		if started {
			src.removed(err)
		}
		release()
		return nil, err
	}
	req.Filter.Namespace = req.Namespace
	sub := &Subscription{filter: req.Filter, release: release, started: started}
	sub.src.Store(src)
	if err := sub.start(ctx, req.Resume, req.NotOlderThan); err != nil {
		sub.Close()
		if errors.Is(err, ErrResourceRemoved) {
			// Discovery mapped req to a resource the API server no longer
			// serves (a CRD deleted, or created again serving another
			// version): reread it, or every retry maps req there again.
			_ = m.rediscover(ctx, time.Now())
		}
		return nil, err
	}
	m.metrics.subscribers.Inc()
	sub.onClose = m.metrics.subscribers.Dec
	if automatic && req.Filter.Name == "" {
		// Its namespace counts for the scope; it moves when the Source
		// that serves that namespace changes.
		sub.mover = func(key Key, like *Source) (*Source, func(), error) {
			return m.acquireMove(key, like, req.Holder, req.Owner)
		}
		uncount := m.addDemand(baseOf(key), gvk, req.Namespace, sub)
		sub.onClose = func() { m.metrics.subscribers.Dec(); uncount() }
	}
	return sub, nil
}

// Hold acquires the Source that would serve req for req.Owner (starting
// it if none runs), as Subscribe does but without subscribing or waiting
// for it to sync: a caller holds what another component reads on its
// behalf, so that it counts against the caller's MaxSourcesPerOwner and
// shows as the caller's in introspection. Under ScopeAutomatic the hold
// moves with the subscriptions of its namespace (scope.go). Errors: those
// of Subscribe's discovery, and ErrLimit.
func (m *Manager) Hold(ctx context.Context, req Request) (*Held, error) {
	if req.Owner == "" {
		return nil, errNoOwner
	}
	key, gvk, automatic, err := m.resolve(ctx, req)
	if err != nil {
		return nil, err
	}
	h := hold{holder: req.Holder, owner: req.Owner, admitNew: req.AdmitNew, limited: true} // a hold always starts its Source
	m.mu.Lock()
	defer m.mu.Unlock()
	held := &Held{m: m, key: key}
	if automatic {
		held.scoped, held.release, err = m.holdLocked(baseOf(key), key, gvk, req.Namespace, h)
	} else {
		_, held.release, _, err = m.acquireLocked(key, gvk, h)
	}
	if err != nil {
		return nil, err
	}
	return held, nil
}

// Held is a hold on a Source (Manager.Hold).
type Held struct {
	m       *Manager
	key     Key
	scoped  *scopeHold // nil: the hold never moves
	release func()
}

// Key returns the Key of the Source held now.
func (h *Held) Key() Key {
	if h.scoped == nil {
		return h.key
	}
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	return h.scoped.key
}

// Release releases the hold. It is idempotent.
func (h *Held) Release() { h.release() }

// Get returns the object name in req.Namespace as the informer that
// serves req stores it, once that informer has synced (and reached
// req.NotOlderThan): O(log n) when the informer runs, which it keeps doing
// for Options.LingerTTL after. Errors: those of Subscribe, and
// ErrObjectNotFound.
func (m *Manager) Get(ctx context.Context, req Request, name string) (*Object, error) {
	req.Resume = ""
	sub, err := m.Subscribe(ctx, req)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	o, ok := sub.Get(req.Namespace, name)
	if !ok {
		return nil, fmt.Errorf("%w: %s %q in %s", ErrObjectNotFound, sub.Key().GVR.GroupResource(), name, namespaceOrCluster(req.Namespace))
	}
	return o, nil
}

func namespaceOrCluster(ns string) string {
	if ns == "" {
		return "the cluster"
	}
	return "namespace " + ns
}

// Resolve returns the Key that Subscribe would serve req from, without
// starting anything; with req.WaitForResource it waits for the resource
// to appear. Errors are Subscribe's.
func (m *Manager) Resolve(ctx context.Context, req Request) (Key, error) {
	key, _, _, err := m.resolve(ctx, req)
	return key, err
}

// ResolveResource returns the resource that req names (by resource, or by kind
// through discovery, waiting for it as Subscribe would if
// req.WaitForResource) and whether it is namespaced, without subscribing:
// what a caller must be authorized for before Subscribe starts anything.
// Errors are those of Subscribe's discovery.
func (m *Manager) ResolveResource(ctx context.Context, req Request) (schema.GroupVersionResource, bool, error) {
	mapping, err := m.lookup(ctx, req)
	if err != nil {
		return schema.GroupVersionResource{}, false, err
	}
	return mapping.Resource, mapping.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

// resolve maps a request to the Key that serves it.
func (m *Manager) resolve(ctx context.Context, req Request) (Key, schema.GroupVersionKind, bool, error) {
	mapping, err := m.lookup(ctx, req)
	if err != nil {
		return Key{}, schema.GroupVersionKind{}, false, err
	}
	gvk := mapping.GroupVersionKind
	// Built-in types are the ones client-go knows: the API server encodes
	// them in protobuf. Custom resources have only JSON.
	key := Key{GVR: mapping.Resource, FieldSelector: req.FieldSelector, Protobuf: req.Protobuf && scheme.Scheme.Recognizes(gvk)}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return key, gvk, false, nil
	}
	automatic := m.opts.Scope == ScopeAutomatic
	if req.Namespace == "" {
		return key, gvk, automatic, nil
	}
	switch m.opts.Scope {
	case ScopeNamespace:
		if !m.running(key) { // a running cluster-wide Source serves it already
			key.Namespace = req.Namespace
		}
	case ScopeAutomatic:
		key.Namespace = m.automaticNamespace(ctx, key, req)
	}
	return key, gvk, automatic, nil
}

// broader returns the Key of a running Source without key's field
// selector that holds what key selects in namespace: one of namespace, or
// of every namespace.
func (m *Manager) broader(key Key, namespace string) (Key, bool) {
	for _, ns := range []string{namespace, ""} {
		if k := (Key{GVR: key.GVR, Namespace: ns, Protobuf: key.Protobuf}); m.running(k) {
			return k, true
		}
		if namespace == "" {
			break
		}
	}
	return Key{}, false
}

// running reports whether a Source for key runs and can serve.
func (m *Manager) running(key Key) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.sources[key]
	return e != nil && !e.src.stopped()
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

// acquire returns the running Source for key, starting one if none runs
// (unless req.ExistingInformerOnly: ErrNoInformer), a func that releases
// the hold, and whether it started the Source. It enforces MaxSources and
// MaxSourcesPerOwner, and asks req.AdmitNew before it starts a Source.
func (m *Manager) acquire(key Key, gvk schema.GroupVersionKind, req Request) (_ *Source, _ func(), started bool, _ error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.acquireLocked(key, gvk, hold{holder: req.Holder, owner: req.Owner, existingOnly: req.ExistingInformerOnly, admitNew: req.AdmitNew, limited: true})
}

// hold is who acquires a Source, and how.
type hold struct {
	holder, owner string
	existingOnly  bool
	admitNew      func() error
	// limited: MaxSourcesPerOwner applies. A subscription that moves
	// between Sources (scope.go) is not: it held one already.
	limited bool
}

// acquireLocked is acquire, with m.mu held.
func (m *Manager) acquireLocked(key Key, gvk schema.GroupVersionKind, h hold) (_ *Source, _ func(), started bool, _ error) {
	holder, owner := h.holder, h.owner
	if m.closed {
		return nil, nil, false, ErrStopped
	}
	e := m.sources[key]
	if e != nil && e.src.stopped() {
		// Its holders still drain it; a new subscriber gets a new Source
		// (for example for a CRD that was deleted and created again).
		m.removeLocked(key, e)
		e = nil
	}
	if e == nil && h.existingOnly {
		return nil, nil, false, fmt.Errorf("%w: %s, and the request asked not to start one", ErrNoInformer, key)
	}
	if h.limited && owner != OwnerInternal && (e == nil || e.owners[owner] == 0) {
		if max := m.opts.MaxSourcesPerOwner; max > 0 && m.owned[owner] >= max {
			return nil, nil, false, fmt.Errorf("%w: %s already holds %d informers, the most one caller may hold at once; close some streams first", ErrLimit, owner, max)
		}
	}
	if e == nil {
		if h.admitNew != nil {
			if err := h.admitNew(); err != nil {
				return nil, nil, false, err
			}
		}
		if err := m.makeRoomLocked(); err != nil {
			return nil, nil, false, err
		}
		started = true
		src := m.newSourceLocked(key, gvk)
		src.start(m.ctx)
		e = &entry{src: src, holders: map[string]int{}, owners: map[string]int{}}
		m.sources[key] = e
		m.metrics.sources.Inc()
	} else if e.refs == 0 {
		m.lru.Remove(key) // onEvict sees refs > 0 and leaves it running
	}
	e.refs++
	e.holders[holder]++
	if e.owners[owner]++; e.owners[owner] == 1 {
		m.owned[owner]++
	}
	var once sync.Once
	return e.src, func() { once.Do(func() { m.release(key, e, holder, owner) }) }, started, nil
}

// newSourceLocked returns a new Source of key, whose objects are of gvk,
// not started.
func (m *Manager) newSourceLocked(key Key, gvk schema.GroupVersionKind) *Source {
	src := newSource(key, m.newUpstream(key), sourceConfig{
		limits: m.opts.Log, budget: m.budget, idleTimeout: m.opts.UpstreamTimeout,
		maxObjectBytes: m.opts.MaxObjectBytes, log: m.log, metrics: m.metrics, recovery: m.recovery,
	})
	src.apiVersion, src.kind = gvk.GroupVersion().String(), gvk.Kind
	return src
}

// makeRoomLocked makes room for one more Source under MaxSources, stopping
// the least recently used lingering one if it must.
func (m *Manager) makeRoomLocked() error {
	max := m.opts.MaxSources
	if max <= 0 || len(m.sources) < max {
		return nil
	}
	key, e, ok := m.lru.GetOldest()
	if !ok {
		return fmt.Errorf("%w: the daemon runs its maximum of %d informers and every one is in use; retry later", ErrLimit, max)
	}
	m.lru.Remove(key) // its onEvict finds it gone and does nothing
	if m.sources[key] == e {
		m.removeLocked(key, e)
	}
	return nil
}

func (m *Manager) release(key Key, e *entry, holder, owner string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releaseLocked(key, e, holder, owner)
}

// releaseLocked is release, with m.mu held.
func (m *Manager) releaseLocked(key Key, e *entry, holder, owner string) {
	e.refs--
	if e.holders[holder]--; e.holders[holder] == 0 {
		delete(e.holders, holder)
	}
	if e.owners[owner]--; e.owners[owner] == 0 {
		delete(e.owners, owner)
		if m.owned[owner]--; m.owned[owner] == 0 {
			delete(m.owned, owner)
		}
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

// crdDeleted ends the Sources of gr, whose CustomResourceDefinition was
// deleted, with ErrResourceRemoved, and rereads discovery in the
// background. Their subscribers get what was published before, then the
// error, as when a Source finds its resource gone itself (its watch ends,
// and the API server answers 404); the entries stay until released, as
// those do. It holds m.mu only to find them, and takes no Source's lock.
func (m *Manager) crdDeleted(gr schema.GroupResource) {
	err := &removedError{msg: fmt.Sprintf("%v: %s is no longer served by the API server: its CustomResourceDefinition was deleted", ErrResourceRemoved, gr)}
	var srcs []*Source
	m.mu.Lock()
	for key, e := range m.sources {
		if key.GVR.GroupResource() == gr {
			srcs = append(srcs, e.src)
		}
	}
	m.mu.Unlock()
	for _, src := range srcs {
		src.removed(err)
	}
	m.log.Info("CustomResourceDefinition deleted: its resource is not served, its informers end", "resource", gr.String(), "informers", len(srcs))
	m.rediscoverSoon()
}

// removedErr is the error of a request for gr if its CRD was seen
// deleted (see crdWatch.removedErr), else nil.
func (m *Manager) removedErr(gr schema.GroupResource) error {
	if m.crds == nil {
		return nil
	}
	return m.crds.removedErr(gr)
}

// terminatingErr is ErrCRDTerminating if gr's CRD is being deleted, else
// nil.
func (m *Manager) terminatingErr(gr schema.GroupResource) error {
	if m.crds == nil {
		return nil
	}
	return m.crds.terminatingErr(gr)
}

// watchCRDs starts the watch of CRDs if gr may be a custom resource (its
// group has a dot and is not one of client-go's built-in groups) and it
// has not started: a daemon whose clients read only built-in resources
// never watches CRDs.
func (m *Manager) watchCRDs(gr schema.GroupResource) {
	if m.crds == nil || m.crds.started.Load() {
		return
	}
	if _, ok := crdName(gr); !ok || scheme.Scheme.IsGroupRegistered(gr.Group) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.crds.started.Load() {
		return
	}
	m.crds.started.Store(true)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.crds.run(m.ctx)
	}()
}

// rediscoverSoon rereads discovery in the background (see rediscover)
// and returns at once. One goroutine rereads; asked again while it does,
// it rereads once more after (at rediscover's pace), so that a reread
// begins after every request.
func (m *Manager) rediscoverSoon() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	if m.rereading {
		m.again = true
		return
	}
	m.rereading = true
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			if err := m.rediscover(m.ctx, time.Now()); err != nil && m.ctx.Err() == nil {
				m.log.Warn("rereading discovery failed; lookups retry it", "err", err)
			}
			m.mu.Lock()
			again := m.again && m.ctx.Err() == nil
			m.again, m.rereading = false, again
			m.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// removeLocked stops a Source and forgets it.
func (m *Manager) removeLocked(key Key, e *entry) {
	delete(m.sources, key)
	m.metrics.sources.Dec()
	e.src.cancel(nil) // run ends promptly; Close waits for it
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
	for _, st := range m.scopes {
		st.clearBelow()
	}
	for key, e := range m.sources {
		m.removeLocked(key, e)
	}
	m.mu.Unlock()
	m.cancel()
	m.lru.Purge()
	m.wg.Wait()
}
