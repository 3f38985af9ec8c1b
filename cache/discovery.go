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
	"k8s.io/client-go/restmapper"
)

// discoveryRetry is the least time between two rereads of discovery,
// whoever asks: however many requests name resources that do not exist,
// they cost the API server at most one reread (of /api and /apis) a
// second.
const discoveryRetry = time.Second

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
			return mapping, nil
		}
		if !meta.IsNoMatchError(err) {
			// The API server is unreachable or failing: retryable.
			return nil, fmt.Errorf("%w: discovering %s: %w", ErrNotSynced, what, err)
		}
		if fresh && !req.WaitForResource {
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
	if m.discovery == nil {
		return nil, errors.New("cache: the Manager has no discovery client")
	}
	groups, err := restmapper.GetAPIGroupResources(m.discovery)
	if err != nil {
		return nil, fmt.Errorf("%w: reading discovery: %w", ErrNotSynced, err)
	}
	return groups, nil
}

// rediscover returns once the cached discovery holds nothing read before
// since. If no one has forgotten it since then, it does, waiting first
// until discoveryRetry has passed since the last time; callers waiting
// meanwhile share that one reread. Errors: ctx.Err().
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
	m.mapper.Reset()
	return nil
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
	if meta.IsNoMatchError(err) && m.shortcuts != nil {
		gvk, err = m.shortcuts.KindFor(req.GVR)
	}
	if err != nil {
		return nil, err
	}
	return m.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
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
