package daemon

import (
	"context"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/restmapper"

	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// GetDiscovery implements the GetDiscovery RPC: the daemon's discovery, to
// any authenticated caller (the API server serves discovery to every
// authenticated user), once it lists what the request names, if anything.
// The answer is built once per reread of discovery and shared by every
// call until the next.
func (s *Server) GetDiscovery(ctx context.Context, req *informerdv1.GetDiscoveryRequest) (_ *informerdv1.GetDiscoveryResponse, err error) {
	var need *cache.Request
	if r := req.GetResource(); r != nil || req.GetKind() != "" {
		if err := validateResource(r, req.GetKind(), ""); err != nil {
			return nil, s.reject(err)
		}
		need = &cache.Request{GVR: schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()}, Kind: req.GetKind()}
	}
	c, err := s.begin(ctx, "discovery")
	if err != nil {
		return nil, err
	}
	defer func() { err = c.end(err) }()
	if need != nil {
		if _, _, err := s.opts.Cache.ResolveResource(c.ctx, *need); err != nil {
			return nil, err
		}
	}
	return s.discovery.get(c.ctx, s.opts.Cache)
}

// discoveryAnswer is the GetDiscovery answer of one generation of the
// cache's discovery.
type discoveryAnswer struct {
	mu         sync.Mutex // guards generation and resp
	generation uint64
	resp       *informerdv1.GetDiscoveryResponse // read-only once built; nil: none yet
}

// get returns the answer of mgr's current discovery generation, building
// it if it has not been.
func (a *discoveryAnswer) get(ctx context.Context, mgr *cache.Manager) (*informerdv1.GetDiscoveryResponse, error) {
	gen := mgr.DiscoveryGeneration()
	a.mu.Lock()
	defer a.mu.Unlock() // concurrent callers wait for one build
	if a.resp != nil && a.generation == gen {
		return a.resp, nil
	}
	groups, err := mgr.Discovery(ctx, nil)
	if err != nil {
		return nil, err
	}
	a.resp, a.generation = buildDiscovery(groups), gen
	return a.resp, nil
}

// buildDiscovery returns the GetDiscovery answer of groups.
func buildDiscovery(groups []*restmapper.APIGroupResources) *informerdv1.GetDiscoveryResponse {
	resp := &informerdv1.GetDiscoveryResponse{Groups: make([]*informerdv1.APIGroup, 0, len(groups))}
	for _, g := range groups {
		out := &informerdv1.APIGroup{Name: g.Group.Name, PreferredVersion: g.Group.PreferredVersion.Version}
		for _, v := range g.Group.Versions {
			gv := &informerdv1.APIGroupVersion{Version: v.Version}
			for _, r := range g.VersionedResources[v.Version] {
				if r.Name == "" || strings.Contains(r.Name, "/") { // subresources are not mapped
					continue
				}
				gv.Resources = append(gv.Resources, &informerdv1.APIResource{
					Name: r.Name, SingularName: r.SingularName, Kind: r.Kind, Namespaced: r.Namespaced,
					Verbs: r.Verbs, ShortNames: r.ShortNames, Categories: r.Categories,
				})
			}
			out.Versions = append(out.Versions, gv)
		}
		resp.Groups = append(resp.Groups, out)
	}
	return resp
}
