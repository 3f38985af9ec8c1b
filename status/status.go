package status

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/cache"
)

// Sentinel errors; daemon maps them to gRPC codes.
var (
	// ErrStopped: the Engine was closed.
	ErrStopped = errors.New("status engine stopped")
	// ErrForbidden: the daemon itself may not list or watch a resource the
	// Watch needs. It wraps the API server's answer.
	ErrForbidden = errors.New("informerd may not read a resource")
)

// Options configure an Engine. Zero values take the documented defaults.
type Options struct {
	// Cache serves the informers. Required.
	Cache *cache.Manager
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics. Default: none are registered.
	Registerer prometheus.Registerer
}

// Request is what a Watch reports on.
type Request struct {
	// IDs are the objects; duplicates are ignored.
	IDs object.ObjMetadataSet
	// Strategy decides the namespace of each Access: "" (all namespaces)
	// under RESTScopeRoot, each object's namespace under
	// RESTScopeNamespace; RESTScopeAutomatic is root when the objects are
	// in more than one namespace (cluster-scoped ones count as ""), as in
	// cli-utils' DefaultStatusWatcher.
	Strategy watcher.RESTScopeStrategy
	// Holder names the caller in the informers' introspection.
	Holder string
}

// Access is one resource a Watch reads: its caller must be allowed to list
// and watch it.
type Access struct {
	GVR schema.GroupVersionResource
	// Namespace is "" for all namespaces or a cluster-scoped resource.
	Namespace string
}

// Batch is what Watch.Next returns: any of its parts may be empty.
type Batch struct {
	// Access lists resources to authorize; the Watch delivers nothing
	// computed from them until they are granted (Watch.Grant). Each is
	// reported once.
	Access []Access
	// Statuses are the latest status of each object that changed since
	// the last Batch, sorted by identifier. They are shared: do not modify
	// them.
	Statuses []Status
	// Synced is true once, in the Batch that completes the first status of
	// every object (after its Statuses).
	Synced bool
}

// Status is one object's status. Its Resource carries only the object's
// apiVersion, kind and metadata name, namespace, uid, generation and
// resourceVersion (nil when NotFound); generated resources carry no
// Resource. Objects holds the objects themselves.
type Status struct {
	*event.ResourceStatus
	// Objects are the JSON of the object and of each generated resource
	// the status was computed from, by identifier (nil when the object was
	// not found). They are the cache's bytes, shared by every Watch and
	// not copied: the Engine keeps, per object, those of its latest
	// status only. Do not modify them.
	Objects map[object.ObjMetadata][]byte
}

func (b Batch) empty() bool { return len(b.Access) == 0 && len(b.Statuses) == 0 && !b.Synced }

// Watch is one caller's view of a set of objects. Next must be called from
// one goroutine at a time; Grant and Close from any.
type Watch struct {
	e   *Engine
	req Request
	// strategy is req.Strategy with automatic resolved.
	strategy watcher.RESTScopeStrategy

	// Owned by the Engine's loop:
	targets []*target
	// access holds every Access reported to the caller: true once granted.
	access map[Access]bool
	// sent is the status of each target last pushed to the caller.
	sent map[*target]*event.ResourceStatus
	// ready counts the leading targets whose status was delivered, up to
	// the first that was not; syncedLoop is set once all were.
	ready      int
	syncedLoop bool

	mu sync.Mutex // guards pending, report, synced, syncedSent and err
	// pending is the latest undelivered status of each object.
	pending    map[object.ObjMetadata]Status
	report     []Access // not yet returned by Next
	synced     bool
	syncedSent bool
	err        error         // terminal, returned once pending is drained
	wake       chan struct{} // capacity 1: something above changed
}

// Next blocks until the Watch has something for its caller and returns it.
// It returns the Watch's terminal error (wrapping ErrForbidden or
// ErrStopped) once everything before it was returned, or ctx.Err().
func (w *Watch) Next(ctx context.Context) (Batch, error) {
	for {
		w.mu.Lock()
		var b Batch
		if len(w.pending) > 0 {
			b.Statuses = make([]Status, 0, len(w.pending))
			for _, rs := range w.pending {
				b.Statuses = append(b.Statuses, rs)
			}
			clear(w.pending)
			slices.SortFunc(b.Statuses, func(x, y Status) int { return compareIDs(x.Identifier, y.Identifier) })
		}
		b.Access, w.report = w.report, nil
		if w.synced && !w.syncedSent {
			b.Synced, w.syncedSent = true, true
		}
		err := w.err
		w.mu.Unlock()
		if !b.empty() {
			return b, nil
		}
		if err != nil {
			return Batch{}, err
		}
		select {
		case <-ctx.Done():
			return Batch{}, ctx.Err()
		case <-w.wake:
		}
	}
}

// Grant tells the Watch that its caller may read these resources (from
// Batch.Access). It returns ErrStopped if the Engine is closed.
func (w *Watch) Grant(ctx context.Context, access []Access) error {
	return w.e.send(ctx, func() { w.e.grant(w, access) })
}

// Close ends the Watch and releases what it held. It is idempotent.
func (w *Watch) Close() {
	// Close has no deadline: the loop always answers promptly, or is gone.
	_ = w.e.send(context.Background(), func() { w.e.unregister(w) })
}

// push records rs as w's latest status of its object and wakes the reader.
func (w *Watch) push(rs Status) {
	w.mu.Lock()
	w.pending[rs.Identifier] = rs
	w.mu.Unlock()
	w.poke()
}

// reportAccess queues accesses for the caller to authorize.
func (w *Watch) reportAccess(a Access) {
	w.mu.Lock()
	w.report = append(w.report, a)
	w.mu.Unlock()
	w.poke()
}

func (w *Watch) setSynced() {
	w.mu.Lock()
	w.synced = true
	w.mu.Unlock()
	w.poke()
}

func (w *Watch) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.poke()
}

func (w *Watch) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// accessOf is the Access through which w reads f: for the objects w
// asks about, in the namespace its scope strategy gives; for the objects
// generated from them (a Deployment's ReplicaSets and Pods), in their
// namespace whatever the strategy, as cli-utils' status readers list
// generated resources in the object's namespace only.
func (w *Watch) accessOf(f *feed, generated bool) Access {
	if generated {
		return Access{f.gvr, f.key.namespace}
	}
	return Access{f.gvr, w.scopeNamespace(f.key.namespace)}
}

// scopeNamespace is the namespace of the Access through which w reads
// namespace ns.
func (w *Watch) scopeNamespace(ns string) string {
	if w.strategy == watcher.RESTScopeRoot {
		return ""
	}
	return ns
}

// resolveStrategy resolves RESTScopeAutomatic as cli-utils does: root when
// the objects span more than one namespace.
func resolveStrategy(s watcher.RESTScopeStrategy, ids object.ObjMetadataSet) watcher.RESTScopeStrategy {
	if s != watcher.RESTScopeAutomatic {
		return s
	}
	for _, id := range ids {
		if id.Namespace != ids[0].Namespace {
			return watcher.RESTScopeRoot
		}
	}
	return watcher.RESTScopeNamespace
}

func compareIDs(a, b object.ObjMetadata) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.GroupKind.Group, b.GroupKind.Group),
		strings.Compare(a.GroupKind.Kind, b.GroupKind.Kind), strings.Compare(a.Name, b.Name))
}
