package cache

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
)

// crdGVR is the resource of CustomResourceDefinitions, as the daemon
// watches them (metadata only).
var crdGVR = crdResource.WithVersion("v1")

// Bounds of what crdWatch remembers of deleted CRDs: each for removedTTL
// after it was seen deleted (by then the discovery reread it triggers
// has long dropped its resource, and lookups say ErrUnknownResource
// without it), at most maxRemoved at once (the oldest is forgotten
// first). A CRD forgotten early costs what it did before crdWatch: one
// list that answers 404.
const (
	removedTTL = time.Minute
	maxRemoved = 1024
)

// crdWatch follows the API server's CustomResourceDefinitions, metadata
// only, so that the daemon learns at once that a custom resource is gone
// (its CRD deleted) or going (its CRD terminating: the API server serves
// it only while its finalizers run), instead of from its informers'
// watches, which the API server ends about a second later. Its store
// keeps each CRD's name, uid and deletionTimestamp, nothing else; what it
// remembers of deleted CRDs is bounded (removedTTL, maxRemoved).
//
// Its methods are safe for concurrent use. Its informer runs from the
// first start until the context given to start ends.
type crdWatch struct {
	client metadata.Interface
	// deleted is told, in order and from the informer's one goroutine, the
	// resource of each CRD deleted. It must not block.
	deleted func(schema.GroupResource)
	now     func() time.Time

	started atomic.Bool
	// store is the informer's: *metav1.PartialObjectMetadata by name,
	// slimmed by slimCRD.
	store    toolscache.Store
	informer toolscache.Controller

	mu sync.Mutex // guards removed
	// removed is when each CRD was seen deleted, by name.
	removed map[string]time.Time
}

func newCRDWatch(client metadata.Interface, deleted func(schema.GroupResource)) *crdWatch {
	w := &crdWatch{client: client, deleted: deleted, now: time.Now, removed: map[string]time.Time{}}
	crds := client.Resource(crdGVR)
	w.store, w.informer = toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: toolscache.ToListWatcherWithWatchListSemantics(&toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				return crds.List(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				return crds.Watch(ctx, opts)
			},
		}, client),
		ObjectType: &metav1.PartialObjectMetadata{},
		Transform:  slimCRD,
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    w.present,
			UpdateFunc: func(_, obj any) { w.present(obj) },
			DeleteFunc: w.gone,
		},
	})
	return w
}

// run runs the informer until ctx ends.
func (w *crdWatch) run(ctx context.Context) { w.informer.RunWithContext(ctx) }

// synced reports whether the informer has listed the CRDs once.
func (w *crdWatch) synced() bool { return w.informer.HasSynced() }

// slimCRD keeps of a CRD's metadata only what crdWatch reads, so that
// its store costs a few hundred bytes per CRD, whatever their
// annotations (kubectl's last-applied-configuration holds a whole CRD).
func slimCRD(obj any) (any, error) {
	o, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown: read by its key
	}
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion, DeletionTimestamp: o.DeletionTimestamp,
	}}, nil
}

// crdName returns the name of the CRD that serves gr, and false if no CRD
// can (a CRD's group has a dot, and its name is plural.group).
func crdName(gr schema.GroupResource) (string, bool) {
	if !strings.Contains(gr.Group, ".") || gr.Resource == "" {
		return "", false
	}
	return gr.Resource + "." + gr.Group, true
}

// crdResourceOf is the resource a CRD named name serves.
func crdResourceOf(name string) schema.GroupResource {
	plural, group, _ := strings.Cut(name, ".")
	return schema.GroupResource{Group: group, Resource: plural}
}

// present notes a CRD added or updated: one created again under a name
// seen deleted is served again.
func (w *crdWatch) present(obj any) {
	o, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	w.mu.Lock()
	delete(w.removed, o.Name)
	w.mu.Unlock()
}

// gone notes a CRD deleted, and tells w.deleted.
func (w *crdWatch) gone(obj any) {
	var name string
	switch o := obj.(type) {
	case *metav1.PartialObjectMetadata:
		name = o.Name
	case toolscache.DeletedFinalStateUnknown: // missed while the watch was down
		name = o.Key // cluster-scoped: the key is the name
	default:
		return
	}
	now := w.now()
	w.mu.Lock()
	if len(w.removed) >= maxRemoved {
		w.forgetLocked(now)
	}
	w.removed[name] = now
	w.mu.Unlock()
	w.deleted(crdResourceOf(name))
}

// forgetLocked drops what is older than removedTTL, and if that leaves
// maxRemoved, the oldest. w.mu must be held.
func (w *crdWatch) forgetLocked(now time.Time) {
	var oldest string
	for name, at := range w.removed {
		if now.Sub(at) >= removedTTL {
			delete(w.removed, name)
			continue
		}
		if oldest == "" || at.Before(w.removed[oldest]) {
			oldest = name
		}
	}
	if len(w.removed) >= maxRemoved {
		delete(w.removed, oldest)
	}
}

// removedErr returns the error of a request for gr if w saw its CRD
// deleted (less than removedTTL ago, and not created again since): it is
// ErrResourceRemoved and ErrUnknownResource. Otherwise nil.
func (w *crdWatch) removedErr(gr schema.GroupResource) error {
	name, ok := crdName(gr)
	if !ok {
		return nil
	}
	w.mu.Lock()
	at, removed := w.removed[name]
	if removed && w.now().Sub(at) >= removedTTL {
		delete(w.removed, name)
		removed = false
	}
	w.mu.Unlock()
	if !removed {
		return nil
	}
	return &removedError{msg: fmt.Sprintf("%v: the API server no longer serves %s: its CustomResourceDefinition %s was deleted", ErrResourceRemoved, gr, name)}
}

// terminatingErr returns ErrCRDTerminating, naming gr, if gr's CRD is
// being deleted (its deletionTimestamp is set). Otherwise nil.
func (w *crdWatch) terminatingErr(gr schema.GroupResource) error {
	name, ok := crdName(gr)
	if !ok {
		return nil
	}
	obj, exists, err := w.store.GetByKey(name)
	if err != nil || !exists {
		return nil
	}
	if o, ok := obj.(*metav1.PartialObjectMetadata); !ok || o.DeletionTimestamp == nil {
		return nil
	}
	return fmt.Errorf("%w: %s: its CustomResourceDefinition %s is being deleted; the API server serves it only until its finalizers are done: ask the API server", ErrCRDTerminating, gr, name)
}

// removedError is the error of a request for a resource whose CRD was
// deleted: ErrResourceRemoved, and ErrUnknownResource, since that is what
// discovery is about to say (so that whoever waits for an unknown
// resource to appear waits for this one).
type removedError struct{ msg string }

func (e *removedError) Error() string   { return e.msg }
func (e *removedError) Unwrap() []error { return []error{ErrResourceRemoved, ErrUnknownResource} }
