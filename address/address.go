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
	w := &Watch{t: t, inst: inst, keys: slices.Compact(keys)}
	w.e = inst.add(netip.AddrPortFrom(req.Address.Addr().Unmap(), req.Address.Port()))
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
	// last is the answer Next returned last; owned by Next's caller.
	last      *Answer
	closeOnce sync.Once
}

// Next blocks until the address's answer differs from the one Next
// returned last (seen through the request's label keys), or, the first
// time, until there is an answer, and returns it. Answers are shared: do
// not modify them. It returns an error when the tracker cannot answer (the
// pod or a related subscription failed: the cause is wrapped, for example
// cache.ErrNotSynced or cache.ErrStopped; Watch again to retry), or
// ctx.Err().
func (w *Watch) Next(ctx context.Context) (*Answer, error) {
	for {
		st := w.e.state.Load()
		if st.err != nil {
			return nil, st.err
		}
		if a := st.answer; a != nil && a != w.last {
			changed := w.last == nil || !sameAnswer(w.last, a, w.keys, false)
			w.last = a
			if changed {
				w.t.metrics.updates.Inc()
				return a, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-st.changed:
		}
	}
}

// LabelKeys returns the request's label keys, sorted, without duplicates.
func (w *Watch) LabelKeys() []string { return w.keys }

// Close ends the watch; the last Close of a Tracker's watches closes its
// subscriptions and waits for its goroutines. It is idempotent.
func (w *Watch) Close() {
	w.closeOnce.Do(func() {
		w.inst.remove(w.e)
		w.t.metrics.subscribers.Dec()
		w.t.release(w.inst)
	})
}
