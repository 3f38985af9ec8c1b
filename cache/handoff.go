package cache

import (
	"context"
	"fmt"
	"iter"

	"github.com/google/btree"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/informerd/informerd/internal/handoff"
)

// A hot handoff (internal/handoff; docs/operations.md) moves a daemon's
// informers to its replacement without a LIST: the old daemon's Manager
// freezes its Sources (their stores change no more) and hands over each
// one's objects and position; the new daemon's Manager restores them,
// synced at that position, each watching the API server from it. Every
// subscriber of a frozen Source receives a Bookmark at its position, so
// that it resumes on the new daemon exactly there: from the log, without a
// Reset.

// seed is the state a handoff gave a Source.
type seed struct {
	objs []*Object
	rv   string
}

// takeSeed returns the Source's seed once (ok false: none).
func (s *Source) takeSeed() (objs []*Object, rv string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sd := s.seed
	if sd == nil {
		return nil, "", false
	}
	s.seed = nil
	return sd.objs, sd.rv, true
}

// opContext returns the context of one of run's requests: ctx, and ended
// by a freeze too; done releases it.
func (s *Source) opContext(ctx context.Context) (op context.Context, done func()) {
	op, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	if s.frozen != nil {
		cancel()
	} else {
		s.opCancel = cancel
	}
	s.mu.Unlock()
	return op, func() {
		s.mu.Lock()
		s.opCancel = nil
		s.mu.Unlock()
		cancel()
	}
}

// parkWhileFrozen waits while the Source is frozen. It reports false if
// ctx ended.
func (s *Source) parkWhileFrozen(ctx context.Context) bool {
	s.mu.Lock()
	frozen, parked := s.frozen, s.parked
	s.mu.Unlock()
	if frozen == nil {
		return ctx.Err() == nil
	}
	close(parked)
	select {
	case <-frozen:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// beginFreeze asks run to park, ending its current request. It reports
// false, asking nothing, unless the Source is synced at a numeric position
// and running: only such a state can be resumed elsewhere.
func (s *Source) beginFreeze() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced || s.opaque || s.terminal != nil || s.frozen != nil || s.events.lastPos == "" {
		return false
	}
	s.frozen, s.parked = make(chan struct{}), make(chan struct{})
	if s.opCancel != nil {
		s.opCancel()
	}
	return true
}

// awaitFreeze waits until run has parked, publishes a Bookmark at the
// Source's position and returns its frozen state; ok is false if the
// Source stopped first.
func (s *Source) awaitFreeze() (f Frozen, ok bool) {
	s.mu.Lock()
	parked := s.parked
	s.mu.Unlock()
	select {
	case <-parked:
	case <-s.done:
		return Frozen{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.events
	l.bookmark(l.last.rv, l.lastPos)
	s.broadcastLocked()
	return Frozen{Key: s.key, APIVersion: s.apiVersion, Kind: s.kind, ResourceVersion: l.lastPos, Len: l.len(), objs: l.frozenObjects()}, true
}

// thaw ends a freeze: run resumes its requests where it parked.
func (s *Source) thaw() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frozen != nil {
		close(s.frozen)
		s.frozen, s.parked = nil, nil
	}
}

// Frozen is a Source frozen for a handoff.
type Frozen struct {
	Key Key
	// APIVersion and Kind are the objects' type.
	APIVersion, Kind string
	// ResourceVersion is the position: the objects are the API server's
	// state at it.
	ResourceVersion string
	// Len is the number of objects.
	Len  int
	objs *btree.BTreeG[objItem]
}

// Objects returns the objects in key order. They are read from a copy of
// the store that no lock guards: any goroutine may read them, at its pace.
func (f Frozen) Objects() iter.Seq[*Object] {
	return func(yield func(*Object) bool) {
		f.objs.Ascend(func(it objItem) bool { return yield(it.object()) })
	}
}

// Freeze stops the upstream requests of every synced Source where they
// are, so that their stores change no more, publishes a Bookmark at each
// one's position to its subscribers, and returns them, for a handoff.
// Subscribers are served meanwhile (nothing new reaches them). thaw
// resumes every Source it froze, for a handoff that failed; after one that
// succeeded, Close the Manager.
func (m *Manager) Freeze() (frozen []Frozen, thaw func()) {
	m.mu.Lock()
	var asked []*Source
	for _, e := range m.sources {
		if e.src.beginFreeze() {
			asked = append(asked, e.src)
		}
	}
	m.mu.Unlock()
	for _, s := range asked {
		if f, ok := s.awaitFreeze(); ok {
			frozen = append(frozen, f)
		}
	}
	return frozen, func() {
		for _, s := range asked {
			s.thaw()
		}
	}
}

// Restore starts a Source for each state handed off (handoff.Read), at its
// position: synced with the handed-off objects as its store, watching the
// API server from that resourceVersion (listing again only if it answers
// 410 Gone), and lingering until a subscriber holds it, as a Source its
// last subscriber left. Call it before anything subscribes. Every object is
// decoded first: one that does not decode, or is not in its Key's format,
// fails the whole Restore, which then starts nothing. States beyond
// MaxSources, and those of a Key already running, are skipped. It returns
// the number of Sources started.
func (m *Manager) Restore(states []handoff.Handed) (int, error) {
	type restored struct {
		key  Key
		gvk  schema.GroupVersionKind
		seed *seed
	}
	all := make([]restored, 0, len(states))
	for _, st := range states {
		key := Key{
			GVR:       schema.GroupVersionResource{Group: st.Group, Version: st.Version, Resource: st.Resource},
			Namespace: st.Namespace, FieldSelector: st.FieldSelector, Protobuf: st.Protobuf,
		}
		gv, err := schema.ParseGroupVersion(st.APIVersion)
		if err != nil || st.Kind == "" {
			return 0, fmt.Errorf("cache: the handoff's %s has no type (apiVersion %q, kind %q)", key, st.APIVersion, st.Kind)
		}
		sd := &seed{objs: make([]*Object, 0, len(st.Objects)), rv: st.ResourceVersion}
		for i, data := range st.Objects {
			if IsProtobuf(data) != key.Protobuf {
				return 0, fmt.Errorf("cache: the handoff's %s holds an object in another format (object %d)", key, i)
			}
			o, _, err := decodeAnyObject(data, m.opts.StripManagedFields)
			if err != nil {
				return 0, fmt.Errorf("cache: the handoff's %s, object %d: %w", key, i, err)
			}
			m.intern.object(o)
			sd.objs = append(sd.objs, o)
		}
		all = append(all, restored{key: key, gvk: gv.WithKind(st.Kind), seed: sd})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrStopped
	}
	n := 0
	for _, r := range all {
		if m.sources[r.key] != nil || (m.opts.MaxSources > 0 && len(m.sources) >= m.opts.MaxSources) {
			continue
		}
		src := m.newSourceLocked(r.key, r.gvk)
		src.seed = r.seed
		src.start(m.ctx)
		e := &entry{src: src, holders: map[string]int{}, owners: map[string]int{}}
		m.sources[r.key] = e
		m.metrics.sources.Inc()
		m.lru.Add(r.key, e)
		n++
	}
	return n, nil
}

// HandedDiscovery is the API server's discovery as a Manager read it, for
// a handoff: the new daemon's Manager (Options.Discovery) maps resources
// from it without asking the API server, so that it serves the informers
// handed off while the API server is unreachable.
type HandedDiscovery struct {
	Groups *metav1.APIGroupList `json:"groups"`
	// Resources are the resources of each group version of Groups.
	Resources []*metav1.APIResourceList `json:"resources"`
}

// HandedDiscovery returns the discovery the Manager holds, without asking
// the API server; ok is false if it holds none whole: it was never read,
// or not as aggregated discovery (which every API server since 1.30
// serves), or some group version failed to be read.
func (m *Manager) HandedDiscovery() (d HandedDiscovery, ok bool) {
	st := m.disc.Load()
	cached, agg := st.discovery.(discovery.AggregatedDiscoveryInterface)
	if st.discovery == nil || !agg || !st.discovery.Fresh() {
		return HandedDiscovery{}, false
	}
	// Fresh: answered from the cache, no request.
	groups, resources, failed, err := cached.GroupsAndMaybeResources()
	if err != nil || resources == nil || len(failed) > 0 {
		return HandedDiscovery{}, false
	}
	d.Groups = groups
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			if rl, ok := resources[schema.GroupVersion{Group: g.Name, Version: v.Version}]; ok {
				d.Resources = append(d.Resources, rl)
			}
		}
	}
	return d, true
}

// dualDiscovery is a discovery client of both interfaces, as client-go's
// DiscoveryClient is: its memory cache uses the one with contexts.
type dualDiscovery interface {
	discovery.DiscoveryInterface
	discovery.DiscoveryInterfaceWithContext
}

// over returns a discovery client that answers groups and resources from d
// (as aggregated discovery, in one call) and everything else from dc.
func (d *HandedDiscovery) over(dc dualDiscovery) discovery.DiscoveryInterface {
	res := make(map[schema.GroupVersion]*metav1.APIResourceList, len(d.Resources))
	for _, rl := range d.Resources {
		if gv, err := schema.ParseGroupVersion(rl.GroupVersion); err == nil {
			res[gv] = rl
		}
	}
	groups := d.Groups
	if groups == nil {
		groups = &metav1.APIGroupList{}
	}
	return &handedDiscovery{dualDiscovery: dc, groups: groups, resources: res}
}

// handedDiscovery is HandedDiscovery.over's client. The Manager's cached
// discovery reads it once (GroupsAndMaybeResources), and a reread of
// discovery replaces it with the API server's.
type handedDiscovery struct {
	dualDiscovery
	groups    *metav1.APIGroupList
	resources map[schema.GroupVersion]*metav1.APIResourceList
}

func (h *handedDiscovery) GroupsAndMaybeResources() (*metav1.APIGroupList, map[schema.GroupVersion]*metav1.APIResourceList, map[schema.GroupVersion]error, error) {
	return h.groups, h.resources, nil, nil
}

func (h *handedDiscovery) GroupsAndMaybeResourcesWithContext(context.Context) (*metav1.APIGroupList, map[schema.GroupVersion]*metav1.APIResourceList, map[schema.GroupVersion]error, error) {
	return h.GroupsAndMaybeResources()
}
