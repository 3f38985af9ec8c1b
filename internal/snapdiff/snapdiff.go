// Package snapdiff computes the difference between two snapshots of a
// resource: the events a watch would have sent to take a receiver holding
// the first to the second. It is the one implementation that the cache's
// relist, client.Watcher and the client-go adapters (and WrapConfig) use.
//
// The rule, per name:
//   - in old only (the object vanished): Deleted, of the old object;
//   - in both, with another uid (deleted and created again under its
//     name): Deleted of the old object, then Added of the new;
//   - in both, with another resourceVersion: Modified;
//   - in both, with the same resourceVersion: nothing;
//   - in new only: Added.
//
// The order is part of the contract, because a receiver may resume from
// the resourceVersion of any event it received (client-go's reflector
// resumes from the last object's): every Deleted comes first (in key
// order), then every Added and Modified in ascending order of its
// object's resourceVersion (in key order when a resourceVersion is not a
// number: such positions are not compared). A caller that publishes the
// difference stamps each Deleted with the last position its receivers may
// have seen before the difference (the API server stamps a deletion with
// its own resourceVersion, which a snapshot does not know), and ends it
// with a position at the new snapshot; then a receiver that resumes from
// any resourceVersion it received inside the difference either replays
// all of it (duplicates are harmless) or has received all of it, and its
// position never goes backwards. See cache.Source.publishList.
package snapdiff

import (
	"iter"
	"slices"
	"strconv"
)

// Type is the kind of a Change.
type Type uint8

// Change types.
const (
	Deleted Type = iota + 1
	Added
	Modified
)

func (t Type) String() string {
	switch t {
	case Deleted:
		return "DELETED"
	case Added:
		return "ADDED"
	case Modified:
		return "MODIFIED"
	}
	return "Type(" + strconv.Itoa(int(t)) + ")"
}

// Change is one event of a difference: Object is the old object for
// Deleted, the new one otherwise.
type Change[T any] struct {
	Type   Type
	Object T
	rv     uint64 // Object's resourceVersion, for the order
}

// Accessors tell Diff what it needs of an object. Compare orders objects
// by key (namespace and name): each snapshot holds a key at most once.
// UID is called only for objects with the same key and different
// resourceVersions.
type Accessors[T any] struct {
	Compare         func(a, b T) int
	ResourceVersion func(T) string
	UID             func(T) string
}

// Diff returns the changes that take a receiver holding old to new, in
// the order of the package's contract. old is visited once, in Compare's
// order; next must be sorted by Compare (see Sort). Diff allocates only
// its result.
func Diff[T any](old iter.Seq[T], next []T, a Accessors[T]) []Change[T] {
	var deleted, changed []Change[T]
	opaque := false
	add := func(t Type, o T) {
		rv, err := strconv.ParseUint(a.ResourceVersion(o), 10, 64)
		opaque = opaque || err != nil
		changed = append(changed, Change[T]{Type: t, Object: o, rv: rv})
	}
	j := 0
	for o := range old {
		for ; j < len(next) && a.Compare(next[j], o) < 0; j++ {
			add(Added, next[j])
		}
		if j == len(next) || a.Compare(next[j], o) > 0 {
			deleted = append(deleted, Change[T]{Type: Deleted, Object: o})
			continue
		}
		n := next[j]
		j++
		switch {
		case a.ResourceVersion(n) == a.ResourceVersion(o):
		case a.UID(n) != a.UID(o):
			deleted = append(deleted, Change[T]{Type: Deleted, Object: o})
			add(Added, n)
		default:
			add(Modified, n)
		}
	}
	for ; j < len(next); j++ {
		add(Added, next[j])
	}
	if !opaque {
		slices.SortStableFunc(changed, func(x, y Change[T]) int {
			switch {
			case x.rv < y.rv:
				return -1
			case x.rv > y.rv:
				return 1
			}
			return 0
		})
	}
	return append(deleted, changed...)
}

// Sort sorts s by compare, in place, unless it is sorted already (a list
// from the API server usually is).
func Sort[T any](s []T, compare func(a, b T) int) {
	if !slices.IsSortedFunc(s, compare) {
		slices.SortFunc(s, compare)
	}
}
