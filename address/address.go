package address

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/cache"
)

// Events is one subscription's stream of events, as a *cache.Subscription
// delivers them.
type Events interface {
	Next(ctx context.Context, max int) ([]*cache.Event, error)
	Close()
}

// Subscriber opens Events as cache.Manager.Subscribe does; CacheSubscriber
// adapts a Manager.
type Subscriber func(ctx context.Context, req cache.Request) (Events, error)

// CacheSubscriber returns a Subscriber of m.
func CacheSubscriber(m *cache.Manager) Subscriber {
	return func(ctx context.Context, req cache.Request) (Events, error) {
		s, err := m.Subscribe(ctx, req)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// RelatedKind is a kind of object that selects pods and ports, whose
// selecting objects answers list. Paths are dotted field paths, such as
// "spec.podSelector".
type RelatedKind struct {
	// Resource is the kind's resource. Required.
	Resource schema.GroupVersionResource
	// SelectorPath is the path of the pod label selector (a
	// metav1.LabelSelector). Required. An object without one selects no
	// pod; an empty one selects every pod of the object's namespace.
	SelectorPath string
	// PortPath is the path of the port selected, a number or a container
	// port name. Empty, or absent from an object: every port.
	PortPath string
	// Fields are the paths projected into answers.
	Fields []string
}

// maxFields bounds RelatedKind.Fields.
const maxFields = 16

func (k RelatedKind) validate() error {
	if k.Resource.Version == "" || k.Resource.Resource == "" {
		return errors.New("a version and a resource are required")
	}
	if k.SelectorPath == "" {
		return errors.New("the selector path is required")
	}
	paths := append([]string{k.SelectorPath}, k.Fields...)
	if k.PortPath != "" {
		paths = append(paths, k.PortPath)
	}
	for _, p := range paths {
		if slices.Contains(strings.Split(p, "."), "") {
			return fmt.Errorf("field path %q has an empty segment: write it as dot-separated names, for example %q", p, "spec.port")
		}
	}
	if len(k.Fields) > maxFields {
		return fmt.Errorf("%d projected fields, at most %d are allowed", len(k.Fields), maxFields)
	}
	return nil
}

// Options configure a Tracker. Zero values take the documented defaults.
type Options struct {
	// Subscribe opens the shared pod subscription and one per related kind.
	// Required.
	Subscribe Subscriber
	// Related are the related kinds answers list. Default none.
	Related []RelatedKind
	// Holder names the shared subscriptions in the cache's introspection.
	// Default "informerd/address".
	Holder string
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics. Default: none are registered.
	Registerer prometheus.Registerer
}

// Request is what a watcher asks for.
type Request struct {
	// Address is the IP and port. Its IP must be valid and its port not 0.
	Address netip.AddrPort
	// LabelKeys are the pod labels the watcher sees: changes to others are
	// not changes for it.
	LabelKeys []string
	// Withhold are related kinds the watcher may not see (its caller may
	// not read them), each with the reason: its answers never carry their
	// objects and name them Unavailable with that reason.
	Withhold []Unavailable
	// Workload asks for answers' Workload. The first watch that asks
	// starts reading ReplicaSets and Jobs in every namespace; the last one
	// to close stops it. Others never pay for them.
	Workload bool
}

// Tracker answers address watches from one shared set of subscriptions: it
// opens them on the first Watch and closes them when the last Watch is
// closed. Its methods are safe for concurrent use.
type Tracker struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics

	mu sync.Mutex // guards inst
	// inst serves every Watch; nil while there is none. A failed instance
	// is replaced on the next Watch and stops once its watches are closed.
	inst *instance
}

// New returns a Tracker. It starts nothing until the first Watch.
func New(opts Options) (*Tracker, error) {
	if opts.Subscribe == nil {
		return nil, errors.New("address: Options.Subscribe is required")
	}
	seen := map[schema.GroupVersionResource]bool{}
	for _, k := range opts.Related {
		if err := k.validate(); err != nil {
			return nil, fmt.Errorf("address: related kind %s: %w", k.Resource, err)
		}
		if seen[k.Resource] {
			return nil, fmt.Errorf("address: related kind %s is configured twice", k.Resource)
		}
		seen[k.Resource] = true
	}
	if opts.Holder == "" {
		opts.Holder = "informerd/address"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &Tracker{opts: opts, log: opts.Logger, metrics: m}, nil
}

// Watch starts watching req.Address. It does not block: the first answer,
// or the error that prevents one, comes from Next. The caller must Close
// the Watch.
func (t *Tracker) Watch(req Request) *Watch {
	t.mu.Lock()
	if t.inst == nil || t.inst.failed() {
		t.inst = t.start()
	}
	inst := t.inst
	inst.refs++
	t.mu.Unlock()

	keys := slices.Clone(req.LabelKeys)
	slices.Sort(keys)
	w := &Watch{t: t, inst: inst, keys: slices.Compact(keys), workload: req.Workload}
	for _, u := range req.Withhold {
		if w.withhold == nil {
			w.withhold = map[schema.GroupVersionResource]string{}
		}
		w.withhold[u.Resource] = u.Reason
	}
	w.e, w.wl = inst.add(netip.AddrPortFrom(req.Address.Addr().Unmap(), req.Address.Port()), req.Workload)
	if w.wl != nil {
		w.wlSynced = w.wl.synced
	}
	t.metrics.subscribers.Inc()
	return w
}

// release drops a hold on inst, stopping it with the last one.
func (t *Tracker) release(inst *instance) {
	t.mu.Lock()
	inst.refs--
	last := inst.refs == 0
	if last && t.inst == inst {
		t.inst = nil
	}
	t.mu.Unlock()
	if last {
		inst.stop()
	}
}

// Watch is one watcher of one address. Next must be called from one
// goroutine at a time; Close may be called from any, once or more.
type Watch struct {
	t    *Tracker
	inst *instance
	e    *entry
	keys []string
	// withhold maps the related kinds the watcher may not see to why.
	withhold map[schema.GroupVersionResource]string
	workload bool
	// wl is the workload readers this watch holds (nil if it did not ask,
	// or its instance had failed); wlSynced is closed once they have read
	// everything, and set to nil by Next once it has seen that.
	wl       *workloads
	wlSynced <-chan struct{}
	// shared is the shared answer Next saw last, and last the answer it
	// returned last (the watcher's view of a shared one); owned by Next's
	// caller.
	shared, last *Answer
	closeOnce    sync.Once
}

// Next blocks until the address's answer differs from the one Next
// returned last (seen through the request's label keys), or, the first
// time, until there is an answer, and returns it. Answers are shared: do
// not modify them. It returns an error when the tracker cannot answer (the
// pod subscription failed: the cause is wrapped, for example
// cache.ErrNotSynced or cache.ErrStopped; Watch again to retry), or
// ctx.Err(). A related kind, ReplicaSets or Jobs that cannot be read fail
// nothing: answers name them Unavailable.
//
// A watch that asked for workloads gets its first answer once the
// ReplicaSets and Jobs have been read too.
func (w *Watch) Next(ctx context.Context) (*Answer, error) {
	for {
		st := w.e.state.Load()
		if st.err != nil {
			return nil, st.err
		}
		if w.wlSynced != nil {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-st.changed:
			case <-w.wlSynced:
				w.wlSynced = nil
			}
			continue
		}
		if a := st.answer; a != nil && a != w.shared {
			w.shared = a
			v := w.view(a)
			if w.last == nil || !sameAnswer(w.last, v, w.keys, false) {
				w.last = v
				w.t.metrics.updates.Inc()
				return v, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-st.changed:
		}
	}
}

// view returns a shared answer as the watcher sees it: without the
// objects of the kinds it may not see, which it names Unavailable, and
// without the workload (or what it depends on) unless it asked.
func (w *Watch) view(a *Answer) *Answer {
	ownerMissing := slices.ContainsFunc(a.Unavailable, func(u Unavailable) bool { return slices.Contains(ownerResources[:], u.Resource) })
	if len(w.withhold) == 0 && (w.workload || a.Workload == nil && !ownerMissing) {
		return a
	}
	v := *a
	if !w.workload {
		v.Workload = nil
	}
	if len(w.withhold) > 0 {
		v.Related = slices.DeleteFunc(slices.Clone(a.Related), func(r Related) bool { _, ok := w.withhold[r.Resource]; return ok })
	}
	v.Unavailable = nil
	for _, k := range w.t.opts.Related {
		if reason, ok := w.withhold[k.Resource]; ok {
			v.Unavailable = append(v.Unavailable, Unavailable{Resource: k.Resource, Reason: reason})
		} else if i := slices.IndexFunc(a.Unavailable, func(u Unavailable) bool { return u.Resource == k.Resource }); i >= 0 {
			v.Unavailable = append(v.Unavailable, a.Unavailable[i])
		}
	}
	if w.workload {
		for _, u := range a.Unavailable {
			if slices.Contains(ownerResources[:], u.Resource) {
				v.Unavailable = append(v.Unavailable, u)
			}
		}
	}
	return &v
}

// LabelKeys returns the request's label keys, sorted, without duplicates.
func (w *Watch) LabelKeys() []string { return w.keys }

// Close ends the watch; the last Close of a Tracker's watches closes its
// subscriptions and waits for its goroutines. It is idempotent.
func (w *Watch) Close() {
	w.closeOnce.Do(func() {
		w.inst.remove(w.e, w.wl)
		w.t.metrics.subscribers.Dec()
		w.t.release(w.inst)
	})
}
