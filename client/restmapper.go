package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/restmapper"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// RESTMapperTimeout bounds each discovery call of a RESTMapper to the
// daemon, including its wait for a resource whose CRD is Established.
const RESTMapperTimeout = 30 * time.Second

// RESTMapper maps kinds and resources from the daemon's discovery (the
// GetDiscovery RPC): a process that uses it makes no discovery requests
// and holds no discovery cache of its own. It fetches discovery on first
// use and again after Reset. Asked for a kind or resource its copy does
// not know, it asks the daemon for that one, which answers once its own
// discovery lists it (waiting for a CustomResourceDefinition it sees
// Established, as an applier that creates a CRD and its objects in one
// apply needs) or says the API server does not serve it, a meta.NoKindMatchError
// or meta.NoResourceMatchError as a discovery RESTMapper returns.
//
// It is safe for concurrent use and implements meta.ResettableRESTMapper.
type RESTMapper struct {
	c *Client

	mu sync.Mutex // guards mapper; held during the first fetch, so that callers share it
	// mapper maps from the discovery fetched last; nil before the first
	// fetch and after Reset.
	mapper meta.RESTMapper
}

var _ meta.ResettableRESTMapper = (*RESTMapper)(nil)

// NewRESTMapper returns a RESTMapper served by c's daemon: give it to
// cli-utils' ApplierBuilder.WithRestMapper, controller-runtime's
// client.Options.Mapper, or anything that takes a meta.RESTMapper.
func NewRESTMapper(c *Client) *RESTMapper { return &RESTMapper{c: c} }

// Reset forgets the discovery fetched so far.
func (m *RESTMapper) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mapper = nil
}

// current returns the mapper, fetching discovery first if there is none.
func (m *RESTMapper) current() (meta.RESTMapper, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mapper != nil {
		return m.mapper, nil
	}
	mapper, err := m.fetch(&informerdv1.GetDiscoveryRequest{})
	if err != nil {
		return nil, err
	}
	m.mapper = mapper
	return mapper, nil
}

// refetch fetches discovery once the daemon's lists need, and keeps it.
// Other lookups go on meanwhile with the mapper they have.
func (m *RESTMapper) refetch(need *informerdv1.GetDiscoveryRequest) (meta.RESTMapper, error) {
	mapper, err := m.fetch(need)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mapper = mapper
	return mapper, nil
}

func (m *RESTMapper) fetch(req *informerdv1.GetDiscoveryRequest) (meta.RESTMapper, error) {
	ctx, cancel := context.WithTimeout(context.Background(), RESTMapperTimeout)
	defer cancel()
	resp, err := m.c.api.GetDiscovery(ctx, req)
	if err != nil {
		return nil, err
	}
	return restmapper.NewDiscoveryRESTMapper(apiGroupResources(resp)), nil
}

// apiGroupResources converts the daemon's discovery to client-go's.
func apiGroupResources(resp *informerdv1.GetDiscoveryResponse) []*restmapper.APIGroupResources {
	out := make([]*restmapper.APIGroupResources, 0, len(resp.GetGroups()))
	for _, g := range resp.GetGroups() {
		agr := &restmapper.APIGroupResources{
			Group: metav1.APIGroup{
				Name:             g.GetName(),
				PreferredVersion: metav1.GroupVersionForDiscovery{GroupVersion: schema.GroupVersion{Group: g.GetName(), Version: g.GetPreferredVersion()}.String(), Version: g.GetPreferredVersion()},
			},
			VersionedResources: map[string][]metav1.APIResource{},
		}
		for _, v := range g.GetVersions() {
			gv := schema.GroupVersion{Group: g.GetName(), Version: v.GetVersion()}
			agr.Group.Versions = append(agr.Group.Versions, metav1.GroupVersionForDiscovery{GroupVersion: gv.String(), Version: v.GetVersion()})
			rs := make([]metav1.APIResource, 0, len(v.GetResources()))
			for _, r := range v.GetResources() {
				rs = append(rs, metav1.APIResource{
					Name: r.GetName(), SingularName: r.GetSingularName(), Kind: r.GetKind(), Namespaced: r.GetNamespaced(),
					Verbs: r.GetVerbs(), ShortNames: r.GetShortNames(), Categories: r.GetCategories(),
				})
			}
			agr.VersionedResources[v.GetVersion()] = rs
		}
		out = append(out, agr)
	}
	return out
}

// do runs f on the current mapper; if f finds no match, it asks the daemon
// for need and runs f once more on what the daemon answered. The daemon's
// NOT_FOUND is f's own no-match error.
func (m *RESTMapper) do(need *informerdv1.GetDiscoveryRequest, f func(meta.RESTMapper) error) error {
	mapper, err := m.current()
	if err != nil {
		return fmt.Errorf("informerd RESTMapper: %w", err)
	}
	err = f(mapper)
	if !meta.IsNoMatchError(err) {
		return err
	}
	noMatch := err
	mapper, err = m.refetch(need)
	if status.Code(err) == codes.NotFound {
		return noMatch
	}
	if err != nil {
		return fmt.Errorf("informerd RESTMapper: %w", err)
	}
	return f(mapper)
}

func byResource(r schema.GroupVersionResource) *informerdv1.GetDiscoveryRequest {
	return &informerdv1.GetDiscoveryRequest{Resource: &informerdv1.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource}}
}

func byKind(gk schema.GroupKind, versions []string) *informerdv1.GetDiscoveryRequest {
	req := &informerdv1.GetDiscoveryRequest{Resource: &informerdv1.GroupVersionResource{Group: gk.Group}, Kind: gk.Kind}
	if len(versions) == 1 {
		req.Resource.Version = versions[0]
	}
	return req
}

// KindFor implements meta.RESTMapper.
func (m *RESTMapper) KindFor(r schema.GroupVersionResource) (gvk schema.GroupVersionKind, err error) {
	err = m.do(byResource(r), func(mm meta.RESTMapper) error { gvk, err = mm.KindFor(r); return err })
	return gvk, err
}

// KindsFor implements meta.RESTMapper.
func (m *RESTMapper) KindsFor(r schema.GroupVersionResource) (gvks []schema.GroupVersionKind, err error) {
	err = m.do(byResource(r), func(mm meta.RESTMapper) error { gvks, err = mm.KindsFor(r); return err })
	return gvks, err
}

// ResourceFor implements meta.RESTMapper.
func (m *RESTMapper) ResourceFor(r schema.GroupVersionResource) (gvr schema.GroupVersionResource, err error) {
	err = m.do(byResource(r), func(mm meta.RESTMapper) error { gvr, err = mm.ResourceFor(r); return err })
	return gvr, err
}

// ResourcesFor implements meta.RESTMapper.
func (m *RESTMapper) ResourcesFor(r schema.GroupVersionResource) (gvrs []schema.GroupVersionResource, err error) {
	err = m.do(byResource(r), func(mm meta.RESTMapper) error { gvrs, err = mm.ResourcesFor(r); return err })
	return gvrs, err
}

// RESTMapping implements meta.RESTMapper.
func (m *RESTMapper) RESTMapping(gk schema.GroupKind, versions ...string) (mapping *meta.RESTMapping, err error) {
	err = m.do(byKind(gk, versions), func(mm meta.RESTMapper) error { mapping, err = mm.RESTMapping(gk, versions...); return err })
	return mapping, err
}

// RESTMappings implements meta.RESTMapper.
func (m *RESTMapper) RESTMappings(gk schema.GroupKind, versions ...string) (mappings []*meta.RESTMapping, err error) {
	err = m.do(byKind(gk, versions), func(mm meta.RESTMapper) error { mappings, err = mm.RESTMappings(gk, versions...); return err })
	return mappings, err
}

// ResourceSingularizer implements meta.RESTMapper.
func (m *RESTMapper) ResourceSingularizer(resource string) (singular string, err error) {
	mapper, err := m.current()
	if err != nil {
		return "", fmt.Errorf("informerd RESTMapper: %w", err)
	}
	return mapper.ResourceSingularizer(resource)
}
