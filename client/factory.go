package client

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
)

// FactoryOptions configure an InformerFactory. Zero values take the
// defaults.
type FactoryOptions struct {
	// Namespace limits every informer to one namespace; "" is all.
	Namespace string
	// TweakListOptions, if set, edits the ListOptions of every list and
	// watch, as with client-go's factories: the label and field selectors
	// it sets are evaluated by the daemon.
	TweakListOptions func(*metav1.ListOptions)
	// Scheme maps Go types to kinds for InformerFor, and decodes the
	// kinds it knows into their types. Default: client-go's scheme.
	Scheme *runtime.Scheme
	// Protobuf receives built-in types in protobuf (see WatchOptions).
	Protobuf bool
	// ClientName identifies this process in the daemon's introspection.
	ClientName string
	// ResyncPeriod is every informer's resync period. Default 0: none.
	ResyncPeriod time.Duration
}

// InformerFactory makes client-go SharedIndexInformers whose lists and
// watches the daemon serves, one per resource (and view) for the whole
// process, as client-go's SharedInformerFactory does with the API server.
// Its methods are safe for concurrent use.
type InformerFactory struct {
	c    *Client
	opts FactoryOptions

	mu        sync.Mutex // guards the fields below
	informers map[informerKey]toolscache.SharedIndexInformer
	started   map[informerKey]bool
	shutdown  bool
	wg        sync.WaitGroup // the informers Start runs
}

// informerKey names one shared informer.
type informerKey struct {
	gvr      schema.GroupVersionResource
	gvk      schema.GroupVersionKind // typed informers: by kind
	metadata bool
}

// NewInformerFactory returns an InformerFactory over c.
func NewInformerFactory(c *Client, opts FactoryOptions) *InformerFactory {
	if opts.Scheme == nil {
		opts.Scheme = scheme.Scheme
	}
	return &InformerFactory{c: c, opts: opts, informers: map[informerKey]toolscache.SharedIndexInformer{}, started: map[informerKey]bool{}}
}

// ForResource returns the shared informer of gvr's objects as
// *unstructured.Unstructured, as dynamicinformer's factory does.
func (f *InformerFactory) ForResource(gvr schema.GroupVersionResource) informers.GenericInformer {
	return f.generic(informerKey{gvr: gvr}, gvr.GroupResource(), func() (*listWatch, runtime.Object) {
		lw := newListWatch(f.c, f.watchOptions(WatchOptions{Resource: gvr}))
		lw.decoder = nil
		return lw, &unstructured.Unstructured{}
	})
}

// ForMetadata returns the shared informer of gvr's objects' metadata, as
// *metav1.PartialObjectMetadata, as metadatainformer's factory does: the
// daemon sends only metadata.
func (f *InformerFactory) ForMetadata(gvr schema.GroupVersionResource) informers.GenericInformer {
	return f.generic(informerKey{gvr: gvr, metadata: true}, gvr.GroupResource(), func() (*listWatch, runtime.Object) {
		opts := f.watchOptions(WatchOptions{Resource: gvr, MetadataOnly: true})
		opts.Protobuf = false // metadata comes as JSON
		lw := newListWatch(f.c, opts)
		lw.decoder = metadataDecoder{}
		return lw, &metav1.PartialObjectMetadata{}
	})
}

// InformerFor returns the shared informer of objects of obj's type (for
// example &corev1.Pod{}), whose kind the factory's Scheme must know; the
// daemon finds its resource.
func (f *InformerFactory) InformerFor(obj runtime.Object) (toolscache.SharedIndexInformer, error) {
	gvks, _, err := f.opts.Scheme.ObjectKinds(obj)
	if err != nil {
		return nil, fmt.Errorf("informerd client: %w", err)
	}
	gvk := gvks[0]
	return f.informer(informerKey{gvk: gvk}, func() (*listWatch, runtime.Object) {
		opts := f.watchOptions(WatchOptions{Kind: gvk.Kind, Resource: schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version}})
		opts.Scheme = f.opts.Scheme
		return newListWatch(f.c, opts), obj.DeepCopyObject()
	}), nil
}

func (f *InformerFactory) watchOptions(o WatchOptions) WatchOptions {
	o.Namespace, o.ClientName, o.Protobuf = f.opts.Namespace, f.opts.ClientName, f.opts.Protobuf
	return o
}

func (f *InformerFactory) generic(key informerKey, gr schema.GroupResource, build func() (*listWatch, runtime.Object)) informers.GenericInformer {
	return genericInformer{f.informer(key, build), gr}
}

// informer returns the informer of key, making it the first time.
func (f *InformerFactory) informer(key informerKey, build func() (*listWatch, runtime.Object)) toolscache.SharedIndexInformer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if inf, ok := f.informers[key]; ok {
		return inf
	}
	lw, example := build()
	var src toolscache.ListerWatcher = lw
	if f.opts.TweakListOptions != nil {
		src = tweaked{lw, f.opts.TweakListOptions}
	}
	inf := toolscache.NewSharedIndexInformerWithOptions(src, example, toolscache.SharedIndexInformerOptions{
		ResyncPeriod: f.opts.ResyncPeriod,
		Indexers:     toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc},
	})
	f.informers[key] = inf
	return inf
}

// Start runs every informer made so far that is not running yet, until
// ctx ends or Shutdown. Call it again after making more.
func (f *InformerFactory) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shutdown {
		return
	}
	for key, inf := range f.informers {
		if f.started[key] {
			continue
		}
		f.started[key] = true
		f.wg.Add(1)
		go func() { // ends with ctx
			defer f.wg.Done()
			inf.RunWithContext(ctx)
		}()
	}
}

// WaitForCacheSync waits until every started informer has synced, or ctx
// ends; it reports whether all did.
func (f *InformerFactory) WaitForCacheSync(ctx context.Context) bool {
	f.mu.Lock()
	var synced []toolscache.InformerSynced
	for key, inf := range f.informers {
		if f.started[key] {
			synced = append(synced, inf.HasSynced)
		}
	}
	f.mu.Unlock()
	return toolscache.WaitForCacheSync(ctx.Done(), synced...)
}

// Shutdown waits for every informer Start ran to stop (end their
// contexts first); no informer starts afterwards.
func (f *InformerFactory) Shutdown() {
	f.mu.Lock()
	f.shutdown = true
	f.mu.Unlock()
	f.wg.Wait()
}

// genericInformer is client-go's GenericInformer over one informer.
type genericInformer struct {
	inf toolscache.SharedIndexInformer
	gr  schema.GroupResource
}

func (g genericInformer) Informer() toolscache.SharedIndexInformer { return g.inf }

func (g genericInformer) Lister() toolscache.GenericLister {
	return toolscache.NewGenericLister(g.inf.GetIndexer(), g.gr)
}

// tweaked applies a factory's TweakListOptions to every list and watch.
type tweaked struct {
	lw    *listWatch
	tweak func(*metav1.ListOptions)
}

var _ ListerWatcher = tweaked{}

func (t tweaked) List(o metav1.ListOptions) (runtime.Object, error) {
	t.tweak(&o)
	return t.lw.List(o)
}

func (t tweaked) Watch(o metav1.ListOptions) (watch.Interface, error) {
	t.tweak(&o)
	return t.lw.Watch(o)
}

func (t tweaked) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	t.tweak(&o)
	return t.lw.ListWithContext(ctx, o)
}

func (t tweaked) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	t.tweak(&o)
	return t.lw.WatchWithContext(ctx, o)
}

// metadataDecoder decodes the metadata view (JSON: apiVersion, kind,
// metadata) into *metav1.PartialObjectMetadata.
type metadataDecoder struct{}

func (metadataDecoder) Decode(b []byte, _ *schema.GroupVersionKind, _ runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	m := &metav1.PartialObjectMetadata{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, nil, err
	}
	gvk := m.GroupVersionKind()
	return m, &gvk, nil
}
