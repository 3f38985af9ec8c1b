package status

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/informerd/informerd/cache"
)

// A feed's events are matched, and its lists served, through two indexes
// the loop keeps from the feed's events, so that one event costs what the
// objects and targets it concerns cost, not what the feed's namespace
// holds:
//
//   - objectIndex is the feed's objects as its events left them, by label:
//     a list by a selector visits the objects that carry one of the
//     selector's equality requirements (the rarest), not the namespace.
//   - depIndex is the lists the feed's dependents' statuses came from, by
//     the label their selector requires and by the names they returned: an
//     event visits the dependents that listed its object or whose selector
//     may match it, not every dependent.

// labelPair is one label, key and value.
type labelPair struct{ key, value string }

// equalities returns the labels every object sel matches carries: its
// requirements of exactly one value (=, ==, or in with one value). It
// returns none for a selector whose requirements are not exposed.
func equalities(sel labels.Selector) []labelPair {
	reqs, ok := sel.Requirements()
	if !ok {
		return nil
	}
	var out []labelPair
	for _, r := range reqs {
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			if vs := r.Values(); vs.Len() == 1 {
				out = append(out, labelPair{r.Key(), vs.UnsortedList()[0]})
			}
		}
	}
	return out
}

// objKey names an object of a feed.
type objKey struct{ namespace, name string }

// objectIndex is a feed's objects as its events left them (the cache's, not
// copies). byLabel is built on the first list, so a feed nobody lists
// keeps only all.
type objectIndex struct {
	all     map[objKey]*cache.Object
	byLabel multimap[labelPair, *cache.Object]
	labeled bool // byLabel is built
}

// put adds o, or replaces the object of its namespace and name.
func (x *objectIndex) put(o *cache.Object) {
	k := objKey{o.Namespace, o.Name}
	if x.all == nil {
		x.all = map[objKey]*cache.Object{}
	}
	if old := x.all[k]; old != nil {
		x.unlabel(old)
	}
	x.all[k] = o
	x.label(o)
}

// remove removes the object of o's namespace and name.
func (x *objectIndex) remove(o *cache.Object) {
	k := objKey{o.Namespace, o.Name}
	if old := x.all[k]; old != nil {
		x.unlabel(old)
		delete(x.all, k)
	}
}

// reset forgets every object.
func (x *objectIndex) reset() { *x = objectIndex{} }

func (x *objectIndex) label(o *cache.Object) {
	if x.labeled {
		for k, v := range o.Labels {
			x.byLabel.add(labelPair{k, v}, o)
		}
	}
}

func (x *objectIndex) unlabel(o *cache.Object) {
	if x.labeled {
		for k, v := range o.Labels {
			x.byLabel.remove(labelPair{k, v}, o)
		}
	}
}

// rarest returns the one of sel's equality requirements that the fewest
// objects carry, or false if sel has none.
func (x *objectIndex) rarest(sel labels.Selector) (labelPair, bool) {
	if !x.labeled {
		x.labeled = true
		for _, o := range x.all {
			x.label(o)
		}
	}
	var best labelPair
	n := -1
	for _, p := range equalities(sel) {
		if c := x.byLabel.len(p); n < 0 || c < n {
			best, n = p, c
		}
	}
	return best, n >= 0
}

// list returns the objects in namespace ("" for every namespace) that sel
// matches, in storage-key order, as cache.Subscription.List lists.
// by is rarest(sel): only the objects carrying it are visited.
func (x *objectIndex) list(namespace string, sel labels.Selector, by labelPair, indexed bool) []*cache.Object {
	var out []*cache.Object
	match := func(o *cache.Object) {
		if (namespace == "" || o.Namespace == namespace) && sel.Matches(o.Labels) {
			out = append(out, o)
		}
	}
	if indexed {
		x.byLabel.each(by, match)
	} else {
		for _, o := range x.all {
			match(o)
		}
	}
	slices.SortFunc(out, func(a, b *cache.Object) int {
		return cache.CompareKeys(a.Namespace, a.Name, b.Namespace, b.Name)
	})
	return out
}

// depIndex holds, for a feed, the lists its dependents' statuses came
// from (their deps on the feed): by the equality requirement each list's
// selector was indexed by (dep.by), or in scan if it has none; and by the
// names each list returned.
type depIndex struct {
	byLabel multimap[labelPair, *target]
	scan    map[*target]struct{}
	byName  multimap[string, *target]
}

func (x *depIndex) add(t *target, d dep) {
	if d.indexed {
		x.byLabel.add(d.by, t)
	} else {
		if x.scan == nil {
			x.scan = map[*target]struct{}{}
		}
		x.scan[t] = struct{}{}
	}
	for n := range d.names {
		x.byName.add(n, t)
	}
}

// remove forgets d of t; t's other deps on the feed must be removed too
// (setDeps), as they may share entries.
func (x *depIndex) remove(t *target, d dep) {
	if d.indexed {
		x.byLabel.remove(d.by, t)
	} else {
		delete(x.scan, t)
	}
	for n := range d.names {
		x.byName.remove(n, t)
	}
}

// listers calls fn (possibly more than once) for every target whose
// status came from a list on f that returned o or that o matches:
// t.lists(f, o).
func (x *depIndex) listers(f *feed, o *cache.Object, fn func(*target)) {
	x.byName.each(o.Name, fn) // o was in one of their lists: t.lists(f, o)
	check := func(t *target) {
		if !x.byName.has(o.Name, t) && t.lists(f, o) {
			fn(t)
		}
	}
	for k, v := range o.Labels {
		x.byLabel.each(labelPair{k, v}, check)
	}
	for t := range x.scan {
		check(t)
	}
}

// setDeps replaces t's deps, keeping its feeds' depIndexes in step.
func setDeps(t *target, deps []dep) {
	if sameIndex(t.deps, deps) {
		t.deps = deps // the same entries: a recomputation listed the same
		return
	}
	for _, d := range t.deps {
		d.feed.listers.remove(t, d)
	}
	t.deps = deps
	for _, d := range deps {
		d.feed.listers.add(t, d)
	}
}

// sameIndex reports whether a and b have the same depIndex entries.
func sameIndex(a, b []dep) bool {
	return slices.EqualFunc(a, b, func(x, y dep) bool {
		return x.feed == y.feed && x.indexed == y.indexed && x.by == y.by && maps.Equal(x.names, y.names)
	})
}

// multimap is a set of values per key. Most of the indexes' keys have one
// value (a label or name of one object, or one target's): that costs an
// entry, without a map of its own.
type multimap[K comparable, V comparable] map[K]valueSet[V]

type valueSet[V comparable] struct {
	one  V              // the value, if more is nil
	more map[V]struct{} // the values, if there were several
}

func (m *multimap[K, V]) add(k K, v V) {
	if *m == nil {
		*m = multimap[K, V]{}
	}
	s, ok := (*m)[k]
	switch {
	case !ok:
		s.one = v
	case s.more != nil:
		s.more[v] = struct{}{}
	case s.one != v:
		s.more = map[V]struct{}{s.one: {}, v: {}}
	}
	(*m)[k] = s
}

func (m multimap[K, V]) remove(k K, v V) {
	s, ok := m[k]
	switch {
	case !ok:
	case s.more == nil:
		if s.one == v {
			delete(m, k)
		}
	default:
		delete(s.more, v)
		if len(s.more) == 0 {
			delete(m, k)
		}
	}
}

func (m multimap[K, V]) len(k K) int {
	s, ok := m[k]
	switch {
	case !ok:
		return 0
	case s.more == nil:
		return 1
	}
	return len(s.more)
}

func (m multimap[K, V]) has(k K, v V) bool {
	s, ok := m[k]
	if !ok {
		return false
	}
	if s.more == nil {
		return s.one == v
	}
	_, in := s.more[v]
	return in
}

// each calls fn for each value of k; fn must not change m.
func (m multimap[K, V]) each(k K, fn func(V)) {
	s, ok := m[k]
	switch {
	case !ok:
	case s.more == nil:
		fn(s.one)
	default:
		for v := range s.more {
			fn(v)
		}
	}
}
