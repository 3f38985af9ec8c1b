package address

import (
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// entry is one watched address: its current answer, published to its
// watchers through state. Its other fields belong to the index.
type entry struct {
	addr  netip.AddrPort
	state atomic.Pointer[entryState]
	// refs counts the watches of the address.
	refs int
	// ns is the namespace of the current answer's pod ("" for none): the
	// entry is in the index's byNamespace[ns].
	ns string
	// dirty is set while the entry waits in the index's dirty list.
	dirty bool
}

// entryState is an immutable state of an entry. Publishing a new one
// closes the old one's changed channel.
type entryState struct {
	// answer is nil until the index has synced.
	answer *Answer
	// err, if set, is why the address will get no more answers.
	err     error
	changed chan struct{}
}

func (e *entry) publish(st *entryState) {
	st.changed = make(chan struct{})
	close(e.state.Swap(st).changed)
}

// index holds the pods and related objects that can be answers, the
// watched addresses, and the maps between them. It is not safe for
// concurrent use: its instance's owner goroutine updates it, and watches
// register under the instance's lock.
type index struct {
	kinds []RelatedKind

	// pods are the live pods (see decodePod).
	pods map[objKey]*Pod
	// byIP are the live pods by pod IP (host-network pods have none).
	byIP map[netip.Addr][]*Pod
	// byHost are the live pods by host IP and host port.
	byHost map[netip.AddrPort][]*Pod
	// related are the related objects of each kind, by namespace and name.
	related []map[string]map[string]*relObj
	// owners are the ReplicaSets ([0]) and the Jobs ([1]) by namespace and
	// name, read while a watch asks for workloads.
	owners [2]map[objKey]*ownerObj
	// workloads is set while the owners have been read in full: answers
	// then carry workloads.
	workloads bool
	// missing maps each unavailable kind (a related kind, rsKind or
	// jobKind) to why; unavailable lists them in answer order and is
	// shared by answers (replaced, never modified).
	missing     map[int]string
	unavailable []Unavailable

	// entries are the watched addresses.
	entries map[netip.AddrPort]*entry
	// entriesByIP are the watched addresses by IP, for pods found by pod
	// IP on any port.
	entriesByIP map[netip.Addr][]*entry
	// byNamespace are the watched addresses whose pod is in a namespace,
	// for related objects.
	byNamespace map[string]map[*entry]struct{}
	// dirty are the entries to recompute at the end of the batch.
	dirty []*entry
	// synced is set once the pods and every related kind have been read;
	// before that nothing is marked dirty and nothing is published.
	synced bool
}

func newIndex(kinds []RelatedKind) *index {
	x := &index{
		kinds:       kinds,
		pods:        map[objKey]*Pod{},
		byIP:        map[netip.Addr][]*Pod{},
		byHost:      map[netip.AddrPort][]*Pod{},
		related:     make([]map[string]map[string]*relObj, len(kinds)),
		entries:     map[netip.AddrPort]*entry{},
		entriesByIP: map[netip.Addr][]*entry{},
		byNamespace: map[string]map[*entry]struct{}{},
		owners:      [2]map[objKey]*ownerObj{{}, {}},
		missing:     map[int]string{},
	}
	for i := range x.related {
		x.related[i] = map[string]map[string]*relObj{}
	}
	return x
}

// add returns the entry of addr, creating it with its current answer
// (none before the index has synced, or the instance's err).
func (x *index) add(addr netip.AddrPort, err error) *entry {
	e := x.entries[addr]
	if e == nil {
		e = &entry{addr: addr}
		st := &entryState{err: err, changed: make(chan struct{})}
		if x.synced && err == nil {
			st.answer = x.resolve(addr)
			x.setNamespace(e, st.answer)
		}
		e.state.Store(st)
		x.entries[addr] = e
		x.entriesByIP[addr.Addr()] = append(x.entriesByIP[addr.Addr()], e)
	}
	e.refs++
	return e
}

// remove drops a hold on e, forgetting it with the last one.
func (x *index) remove(e *entry) {
	if e.refs--; e.refs > 0 {
		return
	}
	delete(x.entries, e.addr)
	removeFrom(x.entriesByIP, e.addr.Addr(), e)
	x.setNamespace(e, nil)
	if e.dirty {
		x.dirty = removePtr(x.dirty, e)
	}
}

// setNamespace files e under the namespace of a's pod.
func (x *index) setNamespace(e *entry, a *Answer) {
	ns := ""
	if a != nil && a.Pod != nil {
		ns = a.Pod.Namespace
	}
	if ns == e.ns {
		return
	}
	if e.ns != "" {
		if set := x.byNamespace[e.ns]; len(set) > 1 {
			delete(set, e)
		} else {
			delete(x.byNamespace, e.ns)
		}
	}
	if ns != "" {
		set := x.byNamespace[ns]
		if set == nil {
			set = map[*entry]struct{}{}
			x.byNamespace[ns] = set
		}
		set[e] = struct{}{}
	}
	e.ns = ns
}

// setPod makes p the pod at key (nil: none), marking the entries of the
// addresses the old and new states hold dirty.
func (x *index) setPod(key objKey, p *Pod) {
	old := x.pods[key]
	if old == nil && p == nil {
		return
	}
	x.markPod(old)
	x.markPod(p)
	if old != nil && p != nil && sameAddresses(old, p) {
		// The common update: same addresses, swap the pointer in place.
		for _, ip := range p.ips {
			replacePtr(x.byIP[ip], old, p)
		}
		p.eachHostAddr(func(a netip.AddrPort) { replacePtr(x.byHost[a], old, p) })
		x.pods[key] = p
		return
	}
	if old != nil {
		for _, ip := range old.ips {
			removeFrom(x.byIP, ip, old)
		}
		old.eachHostAddr(func(a netip.AddrPort) { removeFrom(x.byHost, a, old) })
		delete(x.pods, key)
	}
	if p != nil {
		for _, ip := range p.ips {
			x.byIP[ip] = append(x.byIP[ip], p)
		}
		p.eachHostAddr(func(a netip.AddrPort) { x.byHost[a] = append(x.byHost[a], p) })
		x.pods[key] = p
	}
}

// removeFrom removes p from m[k], deleting the key when it empties.
func removeFrom[K comparable, T any](m map[K][]*T, k K, p *T) {
	if s := removePtr(m[k], p); len(s) > 0 {
		m[k] = s
	} else {
		delete(m, k)
	}
}

// markPod marks dirty the entries of every address p holds.
func (x *index) markPod(p *Pod) {
	if p == nil || !x.synced {
		return
	}
	for _, ip := range p.ips {
		for _, e := range x.entriesByIP[ip] {
			x.mark(e)
		}
	}
	p.eachHostAddr(func(a netip.AddrPort) {
		if e := x.entries[a]; e != nil {
			x.mark(e)
		}
	})
}

func (x *index) mark(e *entry) {
	if !e.dirty {
		e.dirty = true
		x.dirty = append(x.dirty, e)
	}
}

// setRelated makes o the object of kind at key (nil: none), marking dirty
// the entries whose pod the old or the new state selects.
func (x *index) setRelated(kind int, key objKey, o *relObj) {
	byNS := x.related[kind]
	old := byNS[key.namespace][key.name]
	if old == nil && o == nil {
		return
	}
	if x.synced {
		x.markSelected(key.namespace, old, o)
	}
	if o == nil {
		if objs := byNS[key.namespace]; len(objs) > 1 {
			delete(objs, key.name)
		} else {
			delete(byNS, key.namespace)
		}
		return
	}
	objs := byNS[key.namespace]
	if objs == nil {
		objs = map[string]*relObj{}
		byNS[key.namespace] = objs
	}
	objs[key.name] = o
}

// markSelected marks dirty the entries of namespace ns (of every namespace
// if ns is "") whose pod and port old or o selects.
func (x *index) markSelected(ns string, old, o *relObj) {
	check := func(set map[*entry]struct{}) {
		for e := range set {
			a := e.state.Load().answer
			if a == nil || a.Pod == nil {
				continue
			}
			num := e.addr.Port()
			if a.Port != nil && a.Match == MatchHostPort {
				num = a.Port.ContainerPort
			}
			if old != nil && old.selects(a.Pod, num, a.Port) || o != nil && o.selects(a.Pod, num, a.Port) {
				x.mark(e)
			}
		}
	}
	if ns != "" {
		check(x.byNamespace[ns])
		return
	}
	for _, set := range x.byNamespace {
		check(set)
	}
}

// flush recomputes every dirty entry and publishes the answers that
// changed. It returns how many did.
func (x *index) flush() int {
	n := 0
	for _, e := range x.dirty {
		e.dirty = false
		old := e.state.Load().answer
		a := x.resolve(e.addr)
		if old != nil && sameAnswer(old, a, nil, true) {
			continue
		}
		x.setNamespace(e, a)
		e.publish(&entryState{answer: a})
		n++
	}
	clear(x.dirty)
	x.dirty = x.dirty[:0]
	return n
}

// publishAll recomputes and publishes every entry's answer (once the
// index has synced) or err.
func (x *index) publishAll(err error) {
	for _, e := range x.entries {
		if err != nil {
			e.publish(&entryState{err: err})
			continue
		}
		x.mark(e)
	}
	if err == nil {
		x.flush()
	}
}

// resolve computes the answer for addr from the current indexes.
func (x *index) resolve(addr netip.AddrPort) *Answer {
	match, cands := MatchPodIP, x.byIP[addr.Addr()]
	if len(cands) == 0 {
		match, cands = MatchHostPort, x.byHost[addr]
	}
	if len(cands) == 0 {
		if len(x.unavailable) > 0 {
			return &Answer{Unavailable: x.unavailable}
		}
		return nobody
	}
	p := best(cands)
	a := &Answer{Pod: p, Match: match, Claimants: len(cands), Workload: x.workload(p), Unavailable: x.unavailable}
	num := addr.Port()
	if a.Port = p.portFor(addr, match); a.Port != nil && match == MatchHostPort {
		num = a.Port.ContainerPort
	}
	a.Related = x.relatedFor(p, num, a.Port)
	return a
}

// markAll marks every entry dirty (once the index has synced).
func (x *index) markAll() {
	if !x.synced {
		return
	}
	for _, e := range x.entries {
		x.mark(e)
	}
}

// setMissing records that kind is unavailable for reason, or available
// again if reason is "", marking every entry dirty if that changes.
func (x *index) setMissing(kind int, reason string) {
	if x.missing[kind] == reason {
		return
	}
	if reason == "" {
		delete(x.missing, kind)
	} else {
		x.missing[kind] = reason
	}
	var list []Unavailable
	for _, k := range slices.SortedFunc(maps.Keys(x.missing), answerOrder) {
		list = append(list, Unavailable{Resource: x.resourceOf(k), Reason: x.missing[k]})
	}
	x.unavailable = list
	x.markAll()
}

// answerOrder orders kinds as answers list them: related kinds, then
// ReplicaSets, then Jobs.
func answerOrder(a, b int) int {
	rank := func(k int) int {
		if k < 0 {
			return 1<<30 - k // rsKind, then jobKind
		}
		return k
	}
	return rank(a) - rank(b)
}

// resourceOf is the resource of a kind other than pods.
func (x *index) resourceOf(kind int) schema.GroupVersionResource {
	if slot, ok := ownerSlot(kind); ok {
		return ownerResources[slot]
	}
	return x.kinds[kind].Resource
}

// setOwner makes o the ReplicaSet (slot 0) or Job (slot 1) at key (nil:
// none), marking dirty the entries whose pod it controls when what
// workloads read of it changed.
func (x *index) setOwner(slot int, key objKey, o *ownerObj) {
	old := x.owners[slot][key]
	if o == nil {
		delete(x.owners[slot], key)
	} else {
		x.owners[slot][key] = o
	}
	if old != nil && o != nil && old.uid == o.uid && sameOwner(old.controller, o.controller) || old == nil && o == nil {
		return
	}
	if !x.synced || !x.workloads {
		return
	}
	for e := range x.byNamespace[key.namespace] {
		a := e.state.Load().answer
		if a == nil || a.Pod == nil || a.Pod.Owner == nil {
			continue
		}
		if s, ok := controllerSlot(a.Pod.Owner); ok && s == slot && a.Pod.Owner.Name == key.name {
			x.mark(e)
		}
	}
}

// clearOwners forgets the ReplicaSets and Jobs: answers carry no
// workloads until they are read again.
func (x *index) clearOwners() {
	x.owners = [2]map[objKey]*ownerObj{{}, {}}
	x.workloads = false
	x.setMissing(rsKind, "")
	x.setMissing(jobKind, "")
	x.markAll()
}

// workload returns p's workload (see Answer.Workload).
func (x *index) workload(p *Pod) *Owner {
	o := p.Owner
	if !x.workloads || o == nil {
		return nil
	}
	slot, ok := controllerSlot(o)
	if !ok {
		return o
	}
	if x.missing[ownerKinds[slot]] != "" {
		return nil
	}
	parent := x.owners[slot][objKey{p.Namespace, o.Name}]
	if parent == nil || parent.uid != o.uid || parent.controller == nil {
		return o // not read yet (or another object of that name), or controlled by no one
	}
	return parent.controller
}

// controllerSlot says whether a pod's controller is a ReplicaSet (slot 0)
// or a Job (slot 1), whose own controller is the pod's workload.
func controllerSlot(o *Owner) (int, bool) {
	gv, err := schema.ParseGroupVersion(o.APIVersion)
	if err != nil {
		return 0, false
	}
	for slot, r := range ownerResources {
		if gv.Group == r.Group && o.Kind == ownerKindNames[slot] {
			return slot, true
		}
	}
	return 0, false
}

// best picks the answer among pods that claim one address: ready, else
// running, else the most recently created, ties by namespace and name.
func best(cands []*Pod) *Pod {
	b := cands[0]
	for _, p := range cands[1:] {
		if better(p, b) {
			b = p
		}
	}
	return b
}

func better(p, q *Pod) bool {
	if p.Ready != q.Ready {
		return p.Ready
	}
	if pr, qr := p.Phase == "Running", q.Phase == "Running"; pr != qr {
		return pr
	}
	if !p.created.Equal(q.created) {
		return p.created.After(q.created)
	}
	if p.Namespace != q.Namespace {
		return p.Namespace < q.Namespace
	}
	return p.Name < q.Name
}

// relatedFor lists the related objects that select p on port number num
// (port, if declared, gives its name).
func (x *index) relatedFor(p *Pod, num uint16, port *Port) []Related {
	var out []Related
	for i, byNS := range x.related {
		start := len(out)
		for _, ns := range [2]string{p.Namespace, ""} {
			for _, o := range byNS[ns] {
				if o.selects(p, num, port) {
					out = append(out, Related{Resource: x.kinds[i].Resource, Namespace: o.namespace, Name: o.name, Fields: o.fields})
				}
			}
		}
		slices.SortFunc(out[start:], compareRelated)
	}
	return out
}

// portFor returns p's declared port for addr found by match: TCP first,
// then the first declared.
func (p *Pod) portFor(addr netip.AddrPort, match Match) *Port {
	var found *Port
	for i := range p.ports {
		pt := &p.ports[i]
		switch match {
		case MatchPodIP:
			if pt.ContainerPort != addr.Port() {
				continue
			}
		case MatchHostPort:
			if pt.HostPort != addr.Port() || pt.hostIP.IsValid() && pt.hostIP != addr.Addr() {
				continue
			}
		}
		if pt.Protocol == "TCP" {
			return pt
		}
		if found == nil {
			found = pt
		}
	}
	return found
}

// eachHostAddr calls f with every host address p holds: each host port on
// its own host IP if it names one, else on each of p's host IPs. An address
// is passed once even if several ports hold it.
func (p *Pod) eachHostAddr(f func(netip.AddrPort)) {
	for i, pt := range p.ports {
		if pt.HostPort == 0 {
			continue
		}
		for _, ip := range p.hostIPs {
			if pt.hostIP.IsValid() {
				ip = pt.hostIP
			}
			a := netip.AddrPortFrom(ip, pt.HostPort)
			if !p.holdsBefore(i, a) {
				f(a)
			}
			if pt.hostIP.IsValid() {
				break
			}
		}
	}
}

// holdsBefore reports whether a port before index i already holds a.
func (p *Pod) holdsBefore(i int, a netip.AddrPort) bool {
	for _, pt := range p.ports[:i] {
		if pt.HostPort != a.Port() {
			continue
		}
		if pt.hostIP.IsValid() {
			if pt.hostIP == a.Addr() {
				return true
			}
			continue
		}
		if slices.Contains(p.hostIPs, a.Addr()) {
			return true
		}
	}
	return false
}

// sameAddresses reports whether p and q hold the same addresses, in the
// same order (what an update that changes no address keeps).
func sameAddresses(p, q *Pod) bool {
	if !slices.Equal(p.ips, q.ips) || !slices.Equal(p.hostIPs, q.hostIPs) || len(p.ports) != len(q.ports) {
		return false
	}
	for i := range p.ports {
		if p.ports[i].HostPort != q.ports[i].HostPort || p.ports[i].hostIP != q.ports[i].hostIP {
			return false
		}
	}
	return true
}

func removePtr[T any](s []*T, p *T) []*T {
	if i := slices.Index(s, p); i >= 0 {
		s[i] = s[len(s)-1]
		s[len(s)-1] = nil
		s = s[:len(s)-1]
	}
	return s
}

func replacePtr[T any](s []*T, old, p *T) {
	if i := slices.Index(s, old); i >= 0 {
		s[i] = p
	}
}

// keyString is an object's namespace/name, for logs.
func keyString(k objKey) string {
	if k.namespace == "" {
		return k.name
	}
	return k.namespace + "/" + k.name
}
