package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

// discoveryRetry is the least time between two rereads of discovery,
// whoever asks: however many requests name resources that do not exist,
// they cost the API server at most one reread (of /api and /apis) a
// second. A reread is read whole before it replaces what lookups read,
// so that it never leaves others an empty or failed discovery.
const discoveryRetry = time.Second

// discoveryState is one reading of the API server's discovery and the
// mappers over it. It is replaced whole, never emptied.
type discoveryState struct {
	mapper resettableMapper
	// discovery is the cached discovery that mapper reads; nil in tests.
	discovery discovery.CachedDiscoveryInterface
	// shortcuts expands short names (cm, deploy) from mapper's discovery,
	// as kubectl does; only for a resource mapper does not know, so the
	// common path never walks discovery. Nil: no short names (tests).
	shortcuts meta.RESTMapper
	// generation counts the rereads before this one.
	generation uint64
}

// newDiscoveryState returns a discoveryState that reads dc when first
// asked.
func newDiscoveryState(dc discovery.DiscoveryInterface) *discoveryState {
	cached := memory.NewMemCacheClient(dc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)
	return &discoveryState{mapper: mapper, discovery: cached, shortcuts: restmapper.NewShortcutExpander(mapper, cached, nil)}
}

// establishedWait bounds how long a request waits for discovery to list a
// resource whose CustomResourceDefinition the daemon's own informer of
// CRDs shows Established (the API server serves it; its discovery lags).
const establishedWait = 10 * time.Second

// lookup maps a request's resource (or kind) through discovery. The
// daemon answers for the API server, so it never says a resource is not
// served from a stale discovery: when the cached discovery does not know
// it, lookup rereads discovery (one reread, at most once per
// discoveryRetry, serves every request that was waiting for one) and asks
// again. Still unknown, it fails with ErrUnknownResource, unless
//   - req.WaitForResource: it rereads every discoveryRetry until the
//     resource appears or ctx ends;
//   - a CRD informer of the daemon holds the resource's CRD, Established:
//     it waits for discovery as above for up to establishedWait, then fails
//     with ErrNotSynced (retryable), since the API server serves it.
//
// A resource whose CRD the Manager's watch of CRDs saw deleted (and not
// created again) is ErrResourceRemoved (and ErrUnknownResource) at once,
// whether discovery still lists it (it is then reread in the background)
// or not (no reread is waited for); with req.WaitForResource it is waited
// for as an unknown one.
func (m *Manager) lookup(ctx context.Context, req Request) (*meta.RESTMapping, error) {
	what := gvrString(req.GVR)
	if req.Kind != "" {
		what = "kind " + schema.GroupKind{Group: req.GVR.Group, Kind: req.Kind}.String()
	}
	var established time.Time // when the resource's CRD was first seen Established
	for fresh := false; ; fresh = true {
		asked := time.Now()
		mapping, err := m.mapping(req)
		if err == nil {
			gr := mapping.Resource.GroupResource()
			m.watchCRDs(gr)
			if err = m.removedErr(gr); err == nil {
				return mapping, nil
			}
			m.rediscoverSoon()
			if !req.WaitForResource {
				return nil, err
			}
		} else if !meta.IsNoMatchError(err) {
			// The API server is unreachable or failing: retryable.
			return nil, fmt.Errorf("%w: discovering %s: %w", ErrNotSynced, what, err)
		} else if removed := m.removedErr(req.GVR.GroupResource()); removed != nil && req.Kind == "" && !req.WaitForResource {
			// Its CRD was seen deleted, and not created again since: no
			// reread can say otherwise.
			return nil, removed
		} else if fresh && !req.WaitForResource {
			if !m.crdEstablished(req) {
				return nil, fmt.Errorf("%w: the API server does not serve %s", ErrUnknownResource, what)
			}
			if established.IsZero() {
				established = time.Now()
			} else if time.Since(established) >= establishedWait {
				return nil, fmt.Errorf("%w: %s: its CustomResourceDefinition is Established, but the API server's discovery has not listed it for %s", ErrNotSynced, what, establishedWait)
			}
		}
		if err := m.rediscover(ctx, asked); err != nil {
			return nil, err
		}
	}
}

// Discovery returns the API server's discovery as the daemon holds it (as
// read the last time it was reread; see lookup). If req is not nil, its
// resource or kind is first looked up as Subscribe would: errors are
// ErrUnknownResource if the API server does not serve it, ErrNotSynced if
// discovery cannot be read (or lags an Established CRD), and ctx.Err().
func (m *Manager) Discovery(ctx context.Context, req *Request) ([]*restmapper.APIGroupResources, error) {
	if req != nil {
		if _, err := m.lookup(ctx, *req); err != nil {
			return nil, err
		}
	}
	d := m.disc.Load()
	if d.discovery == nil {
		return nil, errors.New("cache: the Manager has no discovery client")
	}
	groups, err := restmapper.GetAPIGroupResources(d.discovery)
	if err != nil {
		return nil, fmt.Errorf("%w: reading discovery: %w", ErrNotSynced, err)
	}
	return groups, nil
}

// DiscoveryGeneration counts the rereads of discovery: what Discovery
// returns changes only with it (but for API groups that failed to be read,
// which are read again when asked for).
func (m *Manager) DiscoveryGeneration() uint64 { return m.disc.Load().generation }

// rediscover returns once the discovery that lookups read holds nothing
// read before since. If no one has reread it since then, it does, waiting
// first until discoveryRetry has passed since the last time; callers
// waiting meanwhile share that one reread. The reread is read whole
// before it replaces the previous one, which stays if it fails. Errors:
// ErrNotSynced if discovery cannot be read, ctx.Err().
func (m *Manager) rediscover(ctx context.Context, since time.Time) error {
	select {
	case m.discovering <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-m.discovering }()
	if !m.forgotten.Before(since) {
		return nil
	}
	if wait := discoveryRetry - time.Since(m.forgotten); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	m.forgotten = time.Now()
	old := m.disc.Load()
	if m.dc == nil { // tests: a mapper of their own
		old.mapper.Reset()
		m.disc.Store(&discoveryState{mapper: old.mapper, generation: old.generation + 1})
		return nil
	}
	fresh := newDiscoveryState(m.dc)
	if _, _, err := fresh.discovery.ServerGroupsAndResources(); err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return fmt.Errorf("%w: rereading discovery: %w", ErrNotSynced, err)
	}
	fresh.generation = old.generation + 1
	m.disc.Store(fresh)
	return nil
}

func (m *Manager) mapping(req Request) (*meta.RESTMapping, error) {
	d := m.disc.Load()
	if req.Kind != "" {
		var versions []string
		if req.GVR.Version != "" {
			versions = append(versions, req.GVR.Version)
		}
		return d.mapper.RESTMapping(schema.GroupKind{Group: req.GVR.Group, Kind: req.Kind}, versions...)
	}
	gvk, err := d.mapper.KindFor(req.GVR)
	if meta.IsNoMatchError(err) && d.shortcuts != nil {
		gvk, err = d.shortcuts.KindFor(req.GVR)
	}
	if err != nil {
		return nil, err
	}
	return d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
}

func gvrString(gvr schema.GroupVersionResource) string {
	s := gvr.Resource
	if gvr.Group != "" {
		s += "." + gvr.Group
	}
	if gvr.Version != "" {
		s += " (" + gvr.Version + ")"
	}
	return s
}

// crdResource is the resource of CustomResourceDefinitions.
var crdResource = schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}

// crdEstablished reports whether a synced informer of every
// CustomResourceDefinition runs in the daemon (one does while some client
// watches CRDs, as appliers do) and holds an Established CRD that serves
// what req names: its group and resource (or kind), and its version if
// req names one. It makes no request to the API server.
func (m *Manager) crdEstablished(req Request) bool {
	if !strings.Contains(req.GVR.Group, ".") { // a CRD's group has a dot
		return false
	}
	var src *Source
	m.mu.Lock()
	for key, e := range m.sources {
		if key.GVR.GroupResource() == crdResource && key.FieldSelector == "" && !e.src.stopped() {
			src = e.src
			break
		}
	}
	m.mu.Unlock()
	if src == nil {
		return false
	}
	src.mu.Lock()
	synced := src.synced
	objs := src.events.frozenObjects()
	src.mu.Unlock()
	if !synced {
		return false
	}
	if req.Kind == "" {
		it, ok := objs.Get(objAt("", req.GVR.Resource+"."+req.GVR.Group))
		return ok && crdServes(it.object(), req)
	}
	found := false
	objs.Ascend(func(it objItem) bool {
		found = strings.HasSuffix(it.object().Name, "."+req.GVR.Group) && crdServes(it.object(), req)
		return !found
	})
	return found
}

// crdView is what crdServes reads of a CustomResourceDefinition.
type crdView struct {
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Plural string `json:"plural"`
			Kind   string `json:"kind"`
		} `json:"names"`
		Versions []struct {
			Name   string `json:"name"`
			Served bool   `json:"served"`
		} `json:"versions"`
	} `json:"spec"`
	Status struct {
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// crdServes reports whether o, a CustomResourceDefinition as JSON, is
// Established and serves req's group, resource or kind, and version.
func crdServes(o *Object, req Request) bool {
	var crd crdView
	if err := json.Unmarshal(o.Data, &crd); err != nil || crd.Spec.Group != req.GVR.Group {
		return false
	}
	if req.Kind != "" && crd.Spec.Names.Kind != req.Kind || req.Kind == "" && crd.Spec.Names.Plural != req.GVR.Resource {
		return false
	}
	served := false
	for _, v := range crd.Spec.Versions {
		served = served || v.Served && (req.GVR.Version == "" || v.Name == req.GVR.Version)
	}
	established := false
	for _, c := range crd.Status.Conditions {
		established = established || c.Type == "Established" && c.Status == "True"
	}
	return served && established
}
