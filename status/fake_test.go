package status

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/cache"
)

// fakeSource is an in-memory stand-in for cache.Manager with its
// semantics: a subscription reads a snapshot, Synced, then every change in
// order; a resource that stops being served ends its subscriptions with
// ErrResourceRemoved.
type fakeSource struct {
	mu      sync.Mutex // guards the fields below
	served  map[schema.GroupKind]schema.GroupVersionResource
	cluster map[schema.GroupKind]bool // cluster-scoped kinds
	denied  map[schema.GroupKind]error
	objects map[schema.GroupKind]map[string]*cache.Object // by namespace/name
	subs    map[*fakeSub]struct{}
	rv      int
	// subscribed counts Subscribe calls per kind: what starts informers.
	subscribed map[schema.GroupKind]int
	changed    chan struct{} // closed and replaced on every change
}

type fakeSub struct {
	src       *fakeSource
	gk        schema.GroupKind
	namespace string
	queue     []*cache.Event // guarded by src.mu
	err       error          // guarded by src.mu: returned once queue is drained
}

func newFakeSource() *fakeSource {
	return &fakeSource{
		served: map[schema.GroupKind]schema.GroupVersionResource{}, denied: map[schema.GroupKind]error{},
		objects: map[schema.GroupKind]map[string]*cache.Object{}, subs: map[*fakeSub]struct{}{},
		subscribed: map[schema.GroupKind]int{}, changed: make(chan struct{}),
	}
}

func (s *fakeSource) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// serve makes the API server serve gk as resource, version v1.
func (s *fakeSource) serve(gk schema.GroupKind, resource string) { s.serveVersion(gk, "v1", resource) }

// serveVersion makes the API server serve gk as resource of version.
func (s *fakeSource) serveVersion(gk schema.GroupKind, version, resource string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served[gk] = schema.GroupVersionResource{Group: gk.Group, Version: version, Resource: resource}
	s.broadcastLocked()
}

// unserve removes gk and its objects, as deleting a CRD does.
func (s *fakeSource) unserve(gk schema.GroupKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.served, gk)
	delete(s.objects, gk)
	for sub := range s.subs {
		if sub.gk == gk && sub.err == nil {
			sub.err = fmt.Errorf("%w: %s", cache.ErrResourceRemoved, gk)
		}
	}
	s.broadcastLocked()
}

func (s *fakeSource) deny(gk schema.GroupKind, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denied[gk] = err
}

func (s *fakeSource) subscriptions(gk schema.GroupKind) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subscribed[gk]
}

// data returns the bytes the source holds of an object.
func (s *fakeSource) data(gk schema.GroupKind, namespace, name string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objects[gk][namespace+"/"+name].Data
}

// put creates or updates u.
func (s *fakeSource) put(t testing.TB, u *unstructured.Unstructured) {
	t.Helper()
	data, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	gk := u.GroupVersionKind().GroupKind()
	o := &cache.Object{
		Namespace: u.GetNamespace(), Name: u.GetName(), ResourceVersion: strconv.Itoa(s.rv),
		Labels: u.GetLabels(), Data: data,
	}
	if s.objects[gk] == nil {
		s.objects[gk] = map[string]*cache.Object{}
	}
	typ := cache.Modified
	if s.objects[gk][o.Namespace+"/"+o.Name] == nil {
		typ = cache.Added
	}
	s.objects[gk][o.Namespace+"/"+o.Name] = o
	s.publishLocked(gk, &cache.Event{Type: typ, Object: o, ResourceVersion: o.ResourceVersion})
}

func (s *fakeSource) remove(gk schema.GroupKind, namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.objects[gk][namespace+"/"+name]
	delete(s.objects[gk], namespace+"/"+name)
	s.rv++
	s.publishLocked(gk, &cache.Event{Type: cache.Deleted, Object: o, ResourceVersion: strconv.Itoa(s.rv)})
}

// resetWithout deletes an object without an event, as happens while a
// subscriber's position is lost, then resets gk's subscriptions: a Reset,
// a snapshot and Synced.
func (s *fakeSource) resetWithout(gk schema.GroupKind, namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objects[gk], namespace+"/"+name)
	for sub := range s.subs {
		if sub.gk != gk || sub.err != nil {
			continue
		}
		sub.queue = append(sub.queue, &cache.Event{Type: cache.Reset})
		for _, o := range s.objects[gk] {
			if sub.namespace == "" || o.Namespace == sub.namespace {
				sub.queue = append(sub.queue, &cache.Event{Type: cache.Added, Object: o})
			}
		}
		sub.queue = append(sub.queue, &cache.Event{Type: cache.Synced, ResourceVersion: strconv.Itoa(s.rv)})
	}
	s.broadcastLocked()
}

func (s *fakeSource) publishLocked(gk schema.GroupKind, ev *cache.Event) {
	for sub := range s.subs {
		if sub.gk == gk && (sub.namespace == "" || sub.namespace == ev.Object.Namespace) && sub.err == nil {
			sub.queue = append(sub.queue, ev)
		}
	}
	s.broadcastLocked()
}

func requestGK(req cache.Request) schema.GroupKind {
	return schema.GroupKind{Group: req.GVR.Group, Kind: req.Kind}
}

func (s *fakeSource) ResolveResource(ctx context.Context, req cache.Request) (schema.GroupVersionResource, bool, error) {
	gk := requestGK(req)
	for {
		s.mu.Lock()
		gvr, ok := s.served[gk]
		namespaced := !s.cluster[gk]
		ch := s.changed
		s.mu.Unlock()
		switch {
		case ok:
			return gvr, namespaced, nil
		case !req.WaitForResource:
			return schema.GroupVersionResource{}, false, fmt.Errorf("%w: kind %s", cache.ErrUnknownResource, gk)
		}
		select {
		case <-ctx.Done():
			return schema.GroupVersionResource{}, false, ctx.Err()
		case <-ch:
		}
	}
}

func (s *fakeSource) Subscribe(_ context.Context, req cache.Request) (subscription, error) {
	gk := requestGK(req)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.denied[gk]; err != nil {
		return nil, fmt.Errorf("%w: %s: %w", cache.ErrNotSynced, gk, err)
	}
	if gvr, ok := s.served[gk]; !ok || (req.GVR.Version != "" && req.GVR.Version != gvr.Version) {
		return nil, fmt.Errorf("%w: kind %s version %q", cache.ErrUnknownResource, gk, req.GVR.Version)
	}
	s.subscribed[gk]++
	sub := &fakeSub{src: s, gk: gk, namespace: req.Namespace}
	for _, o := range s.objects[gk] {
		if sub.namespace == "" || o.Namespace == sub.namespace {
			sub.queue = append(sub.queue, &cache.Event{Type: cache.Added, Object: o})
		}
	}
	sub.queue = append(sub.queue, &cache.Event{Type: cache.Synced, ResourceVersion: strconv.Itoa(s.rv)})
	s.subs[sub] = struct{}{}
	return sub, nil
}

func (f *fakeSub) Next(ctx context.Context, max int) ([]*cache.Event, error) {
	s := f.src
	for {
		s.mu.Lock()
		if n := min(max, len(f.queue)); n > 0 {
			out := f.queue[:n:n]
			f.queue = f.queue[n:]
			s.mu.Unlock()
			return out, nil
		}
		err, ch := f.err, s.changed
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

func (f *fakeSub) Get(namespace, name string) (*cache.Object, bool) {
	f.src.mu.Lock()
	defer f.src.mu.Unlock()
	o, ok := f.src.objects[f.gk][namespace+"/"+name]
	return o, ok
}

func (f *fakeSub) Close() {
	f.src.mu.Lock()
	defer f.src.mu.Unlock()
	delete(f.src.subs, f)
}
