package cache

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The automatic scope strategy keeps each node at its floor: it receives
// each upstream event its subscribers need once. While the node's
// subscriptions of a namespaced resource (one Key without its namespace:
// resource, field selector, encoding) ask for few namespaces, each
// namespace has an informer of its own, which receives only that
// namespace's events; once they ask for Options.ClusterAt namespaces or
// more, or one asks for every namespace, one cluster-wide informer serves
// them all (ClusterAt watches cost the API server more than one, and
// their events are most of the resource's anyway). It goes back to an
// informer per namespace once they ask for at most half as many, and have
// for Options.LingerTTL, so that it does not flap. Either way the
// subscriptions move between informers without noticing (moves.go), and
// each caller is still authorized for what it asked, never for the
// informer that serves it.

// scopeHolder names the automatic scope's own hold on a cluster-wide
// informer in introspection.
const scopeHolder = "informerd (automatic scope)"

// scopeState is what the automatic scope knows of one resource.
type scopeState struct {
	// demand counts the open subscriptions per namespace they asked for
	// ("" for every namespace).
	demand map[string]int
	// holds are the Holds of the resource, which move as subscriptions
	// do.
	holds map[*scopeHold]struct{}
	// cluster: the cluster-wide Source serves the namespaced
	// subscriptions; hold is the scope's own hold on it meanwhile.
	cluster bool
	hold    *entry
	// below is when the demand fell to half of ClusterAt or less while
	// cluster (zero: it did not); timer rebalances once it has for
	// LingerTTL.
	below time.Time
	timer *time.Timer
	// gvk is the resource's kind, for the Sources the scope starts.
	gvk schema.GroupVersionKind
}

// scopeHold is one Hold of a namespace of the resource; key and e are
// what it holds now. Guarded by Manager.mu.
type scopeHold struct {
	namespace, holder, owner string
	key                      Key
	e                        *entry
}

// baseOf returns key without its namespace: the resource whose scope the
// automatic strategy decides.
func baseOf(key Key) Key {
	key.Namespace = ""
	return key
}

// automaticNamespace returns the namespace of the Key that serves req
// under ScopeAutomatic ("" for the cluster-wide one), for base, the
// resource's Key: the cluster-wide informer while the resource is watched
// cluster-wide, or when req makes the namespaces asked for reach
// ClusterAt (and the daemon may watch it cluster-wide); else req's
// namespace's. A request that resumes is served by whichever of the two
// runs and holds its resume point, if the other does not: it moves later.
func (m *Manager) automaticNamespace(ctx context.Context, base Key, req Request) string {
	nsKey := base
	nsKey.Namespace = req.Namespace
	cluster := m.wantsCluster(base, req.Namespace) && m.mayWatchCluster(ctx, base.GVR)
	if req.Resume != "" {
		chosen, other := nsKey, base
		if cluster {
			chosen, other = base, nsKey
		}
		if !m.canResume(chosen, req.Resume) && m.canResume(other, req.Resume) {
			cluster = !cluster
		}
	}
	if cluster {
		return ""
	}
	return req.Namespace
}

// wantsCluster reports whether a subscription of base in namespace would
// be served cluster-wide, as far as the demand tells.
func (m *Manager) wantsCluster(base Key, namespace string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.scopes[base]
	if st == nil {
		return m.opts.ClusterAt <= 1
	}
	if st.cluster || st.demand[""] > 0 {
		return true
	}
	n := st.namespaces()
	if st.demand[namespace] == 0 {
		n++
	}
	return n >= m.opts.ClusterAt
}

// canResume reports whether the Source of key runs and its log or its
// compacted history resumes after rv exactly.
func (m *Manager) canResume(key Key, rv string) bool {
	n, ok := parseRV(rv)
	if !ok {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.sources[key]
	if e == nil || e.src.stopped() {
		return false
	}
	s := e.src
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced || s.opaque {
		return false
	}
	if _, ok := s.events.resumeAt(n); ok {
		return true
	}
	return n <= s.events.last.rv && s.events.canCatchUp(atRV(n))
}

// namespaces returns how many namespaces the demand asks for.
func (st *scopeState) namespaces() int {
	n := len(st.demand)
	if _, ok := st.demand[""]; ok {
		n--
	}
	return n
}

// stateLocked returns base's state, made if need be.
func (m *Manager) stateLocked(base Key, gvk schema.GroupVersionKind) *scopeState {
	st := m.scopes[base]
	if st == nil {
		st = &scopeState{demand: map[string]int{}, holds: map[*scopeHold]struct{}{}, gvk: gvk}
		m.scopes[base] = st
	}
	return st
}

// forgetLocked drops base's state once nothing of it is left.
func (m *Manager) forgetLocked(base Key, st *scopeState) {
	if len(st.demand) == 0 && len(st.holds) == 0 && !st.cluster {
		st.clearBelow()
		delete(m.scopes, base)
	}
}

// addDemand counts sub, of base in namespace, and rebalances; if sub's
// Source is not the one that now serves its namespace (it resumed where
// the other could not), it asks sub to move there. The func it returns
// uncounts sub (once).
func (m *Manager) addDemand(base Key, gvk schema.GroupVersionKind, namespace string, sub *Subscription) func() {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stateLocked(base, gvk)
	st.demand[namespace]++
	m.rebalanceLocked(base, st, time.Now())
	want := base
	if !st.cluster {
		want.Namespace = namespace
	}
	if src := sub.source(); src.key != want {
		src.mu.Lock()
		sub.requestMoveLocked(want)
		src.mu.Unlock()
	}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if st.demand[namespace]--; st.demand[namespace] == 0 {
			delete(st.demand, namespace)
		}
		if m.scopes[base] == st {
			m.rebalanceLocked(base, st, time.Now())
			m.forgetLocked(base, st)
		}
	}
}

// holdLocked acquires key, of base in namespace, for a Hold that moves
// with the scope, and returns it and its release.
func (m *Manager) holdLocked(base, key Key, gvk schema.GroupVersionKind, namespace string, h hold) (*scopeHold, func(), error) {
	if _, _, _, err := m.acquireLocked(key, gvk, h); err != nil {
		return nil, nil, err
	}
	st := m.stateLocked(base, gvk)
	sh := &scopeHold{namespace: namespace, holder: h.holder, owner: h.owner, key: key, e: m.sources[key]}
	st.holds[sh] = struct{}{}
	done := false
	release := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if done {
			return
		}
		done = true
		m.releaseLocked(sh.key, sh.e, sh.holder, sh.owner)
		delete(st.holds, sh)
		if m.scopes[base] == st {
			m.forgetLocked(base, st)
		}
	}
	return sh, release, nil
}

// rebalance is rebalanceLocked, for the timer.
func (m *Manager) rebalance(base Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.scopes[base]; st != nil {
		st.timer = nil
		m.rebalanceLocked(base, st, time.Now())
		m.forgetLocked(base, st)
	}
}

// rebalanceLocked serves base's namespaced subscriptions cluster-wide or
// per namespace, as its demand now asks (see the top of this file), and
// moves them if that changed.
func (m *Manager) rebalanceLocked(base Key, st *scopeState, now time.Time) {
	if m.closed {
		return
	}
	n := st.namespaces()
	want := false
	switch {
	case !m.clusterAllowedLocked(base):
	case st.demand[""] > 0, n >= m.opts.ClusterAt:
		want = true
	case !st.cluster:
	case n > m.opts.ClusterAt/2:
		want = true
	default:
		if st.below.IsZero() {
			st.below = now
		}
		if wait := m.opts.LingerTTL - now.Sub(st.below); wait > 0 {
			if st.timer == nil {
				st.timer = time.AfterFunc(wait, func() { m.rebalance(base) })
			}
			return
		}
	}
	st.clearBelow()
	switch {
	case want == st.cluster:
	case want:
		m.toClusterLocked(base, st)
	default:
		m.toNamespacesLocked(base, st)
	}
}

func (st *scopeState) clearBelow() {
	st.below = time.Time{}
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// clusterAllowedLocked reports whether the daemon may watch base
// cluster-wide: its cluster-wide informer runs (a subscriber of every
// namespace started it), or the last access review of mayWatchCluster
// said so.
func (m *Manager) clusterAllowedLocked(base Key) bool {
	if e := m.sources[base]; e != nil && !e.src.stopped() {
		return true
	}
	return m.scopeCache[base.GVR].cluster
}

// toClusterLocked serves base's namespaced subscriptions from its
// cluster-wide Source, which it holds (starting it if need be), and asks
// them and the Holds to move there.
func (m *Manager) toClusterLocked(base Key, st *scopeState) {
	if _, _, _, err := m.acquireLocked(base, st.gvk, hold{holder: scopeHolder, owner: OwnerInternal}); err != nil {
		m.log.Info("automatic scope: keeping an informer per namespace", "resource", base.String(), "namespaces", st.namespaces(), "err", err)
		return
	}
	st.cluster, st.hold = true, m.sources[base]
	m.metrics.scopeChanges.WithLabelValues("cluster").Inc()
	m.log.Info("automatic scope: one cluster-wide informer serves the namespaces", "resource", base.String(), "namespaces", st.namespaces())
	for key, e := range m.sources {
		if key.Namespace != "" && baseOf(key) == base {
			e.src.mu.Lock()
			for sub := range e.src.subs {
				sub.requestMoveLocked(base)
			}
			e.src.mu.Unlock()
		}
	}
	m.moveHoldsLocked(st, func(h *scopeHold) Key { return base })
}

// toNamespacesLocked serves base's namespaced subscriptions from an
// informer per namespace again: it asks them and the Holds to move, and
// drops its own hold on the cluster-wide Source.
func (m *Manager) toNamespacesLocked(base Key, st *scopeState) {
	st.cluster = false
	m.metrics.scopeChanges.WithLabelValues("namespace").Inc()
	m.log.Info("automatic scope: an informer per namespace again", "resource", base.String(), "namespaces", st.namespaces())
	if e := m.sources[base]; e != nil {
		e.src.mu.Lock()
		for sub := range e.src.subs {
			if ns := sub.filter.Namespace; ns != "" {
				key := base
				key.Namespace = ns
				sub.requestMoveLocked(key)
			}
		}
		e.src.mu.Unlock()
	}
	m.moveHoldsLocked(st, func(h *scopeHold) Key {
		key := base
		key.Namespace = h.namespace
		return key
	})
	if st.hold != nil {
		m.releaseLocked(base, st.hold, scopeHolder, OwnerInternal)
		st.hold = nil
	}
}

// moveHoldsLocked moves each of st's Holds to the Key to returns for it;
// one that cannot be had (MaxSources) stays where it is.
func (m *Manager) moveHoldsLocked(st *scopeState, to func(*scopeHold) Key) {
	for h := range st.holds {
		key := to(h)
		if key == h.key {
			continue
		}
		if _, _, _, err := m.acquireLocked(key, st.gvk, hold{holder: h.holder, owner: h.owner}); err != nil {
			continue
		}
		m.releaseLocked(h.key, h.e, h.holder, h.owner)
		h.key, h.e = key, m.sources[key]
	}
}

// acquireMove acquires key for a subscription that moves there from a
// Source like, for holder and owner, starting it if need be; the caller's
// limits do not apply (it held an informer already).
func (m *Manager) acquireMove(key Key, like *Source, holder, owner string) (*Source, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	src, release, _, err := m.acquireLocked(key, schema.FromAPIVersionAndKind(like.apiVersion, like.kind), hold{holder: holder, owner: owner})
	return src, release, err
}
