package cache

import (
	"strconv"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/labels"
)

// EventType says what an Event means.
type EventType uint8

// Event types. Added, Modified and Deleted carry an object; the others are
// markers.
const (
	Added EventType = iota + 1
	Modified
	Deleted
	// Bookmark carries only the position the stream is at.
	Bookmark
	// Synced ends a snapshot: every object that existed at its position has
	// been delivered.
	Synced
	// Reset says the subscriber's position was lost: a snapshot follows
	// that replaces everything it had.
	Reset
)

func (t EventType) String() string {
	switch t {
	case Added:
		return "ADDED"
	case Modified:
		return "MODIFIED"
	case Deleted:
		return "DELETED"
	case Bookmark:
		return "BOOKMARK"
	case Synced:
		return "SYNCED"
	case Reset:
		return "RESET"
	}
	return "EventType(" + strconv.Itoa(int(t)) + ")"
}

// Object is one stored object: its encoding as the API server sent it and
// the metadata needed to filter and index it. An Object is immutable once
// published.
//
// Every byte of an Object is paid per object on every node, so it keeps
// only what filtering and indexing read on the hot path; the rest of the
// object (apiVersion, kind, uid, ...) is in Data, for the rare reader.
// ResourceVersion may be a view of Data's memory: a reader that keeps it
// long after the object is gone should keep a strings.Clone.
type Object struct {
	Namespace       string
	Name            string
	ResourceVersion string
	Labels          labels.Set
	// Data is the object as the API server sent it: JSON, or, for
	// built-in types watched in protobuf, the API server's protobuf
	// encoding (see IsProtobuf). Two exceptions: a Manager told to strip
	// managedFields removes them, and managedFields shared with other
	// objects are cut down to the few bytes that are this object's (a
	// valid object still, for any reader that does not read
	// managedFields). Buffers and Bytes return the object whole.
	Data []byte
	// mf is the shape of the managedFields cut down in Data, or nil; they
	// are Data[mfAt:mfEnd].
	mf          *mfShape
	mfAt, mfEnd uint32
}

// MaxFrameSlots bounds the number of distinct encodings memoized per Event:
// one per View (a Source has one format).
const MaxFrameSlots = int(numViews)

// Event is one change to one object, or a marker. Events are immutable and
// shared by every subscriber of a Source; do not modify one.
//
// What an Event memoizes (its encodings, its Added and Deleted variants)
// costs memory only while it is in its Source's log: the log forgets them
// when the event leaves it, and reads of the store (snapshots, catch-ups)
// hand out copies that memoize nothing into the stored event. Memory per
// stored object is then its bytes, its metadata and a few fixed-size
// records, whatever the subscribers read.
type Event struct {
	Type   EventType
	Object *Object // nil for markers
	// ResourceVersion is the position of the stream after this event:
	// resuming from it continues after this event.
	ResourceVersion string

	// prev is the object before a Modified event that changed its labels:
	// a subscriber whose selector the object leaves receives it as
	// deleted, at the event's resourceVersion, as the API server sends it.
	prev *Object
	// memo holds what is memoized of e, allocated at the first encoding:
	// an Event out of the log keeps none, and a stored object pays only
	// for the pointer.
	memo atomic.Pointer[memo]
}

// memo is what an Event memoizes while it is in the log: its encodings,
// one per slot, and the Added and Deleted variants of a Modified event
// that filtered subscribers see, so that their encodings are shared too.
type memo struct {
	frames         [MaxFrameSlots]atomic.Pointer[any]
	added, deleted atomic.Pointer[Event]
}

// memoized returns e's memo, allocating it if need be. If e is forgotten
// meanwhile, the memo returned is the caller's alone.
func (e *Event) memoized() *memo {
	if m := e.memo.Load(); m != nil {
		return m
	}
	m := &memo{}
	if e.memo.CompareAndSwap(nil, m) {
		return m
	}
	if cur := e.memo.Load(); cur != nil { // nil: forgotten meanwhile
		return cur
	}
	return m
}

// Encoded returns the encoding of e for slot (see MaxFrameSlots), computing
// it with encode the first time; what an encoding is, is the caller's
// business. Concurrent first calls may each run encode; one result wins and
// every caller afterwards gets it, until e leaves its Source's log (see
// Event). Callers must use one T per slot.
func Encoded[T any](e *Event, slot int, encode func(*Event) T) T {
	f := &e.memoized().frames[slot]
	if p := f.Load(); p != nil {
		return (*p).(T)
	}
	var v any = encode(e)
	if f.CompareAndSwap(nil, &v) {
		return v.(T)
	}
	return (*f.Load()).(T)
}

// as returns the variant of e with type t, sharing its object and
// position. The Added and Deleted variants are memoized so that the frames
// of filtered subscribers are shared too.
func (e *Event) as(t EventType) *Event {
	switch {
	case e.Type == t:
		return e
	case t != Added && t != Deleted:
		return &Event{Type: t, Object: e.Object, ResourceVersion: e.ResourceVersion}
	}
	m := e.memoized()
	slot := &m.added
	if t == Deleted {
		slot = &m.deleted
	}
	if v := slot.Load(); v != nil {
		return v
	}
	o := e.Object
	if t == Deleted && e.prev != nil {
		o = e.prev.withResourceVersion(e.Object.ResourceVersion)
	}
	slot.CompareAndSwap(nil, &Event{Type: t, Object: o, ResourceVersion: e.ResourceVersion})
	return slot.Load()
}

// copyAs returns a new Event of type t as as(t) would, memoizing nothing
// into e: what a read of the store sends. Encoding the copy costs what
// encoding e would, and the encoding goes with the copy.
func (e *Event) copyAs(t EventType) *Event {
	o := e.Object
	if t == Deleted && e.Type != Deleted && e.prev != nil {
		o = e.prev.withResourceVersion(e.Object.ResourceVersion)
	}
	return &Event{Type: t, Object: o, ResourceVersion: e.ResourceVersion}
}

// forget drops what e memoizes, as it leaves the log. A reader encoding e
// meanwhile may memoize once more; that costs one encoding, bounded by the
// views, until e is forgotten again or replaced in the store.
func (e *Event) forget() { e.memo.Store(nil) }

// labelsBefore returns the labels the object had before a Modified event:
// its previous object's, kept only when they differ.
func (e *Event) labelsBefore() labels.Set {
	if e.prev != nil {
		return e.prev.Labels
	}
	return e.Object.Labels
}

// size is the number of object bytes e keeps alive.
func (e *Event) size() int64 {
	var n int64
	if e.Object != nil {
		n += int64(len(e.Object.Data))
	}
	if e.prev != nil {
		n += int64(len(e.prev.Data))
	}
	return n
}

// Filter selects the objects a subscription receives.
type Filter struct {
	// Namespace, if set, admits only objects in it.
	Namespace string
	// Name, if set, admits only the object of that name: a field
	// selector of one object (metadata.name=NAME) served from an informer
	// of all of them (Manager.Subscribe).
	Name string
	// Labels, if set, admits only objects whose labels it matches.
	Labels labels.Selector
}

// matches reports whether f admits o with labels l (o's own, or those it
// had at another point).
func (f Filter) matches(o *Object, l labels.Set) bool {
	if (f.Namespace != "" && o.Namespace != f.Namespace) || (f.Name != "" && o.Name != f.Name) {
		return false
	}
	return f.Labels == nil || f.Labels.Empty() || f.Labels.Matches(l)
}

// apply returns what a subscriber with filter f sees of e, or nil: an
// object that starts (stops) matching a selector is Added (Deleted).
func (f Filter) apply(e *Event) *Event {
	switch e.Type {
	case Added, Deleted:
		if f.matches(e.Object, e.Object.Labels) {
			return e
		}
		return nil
	case Modified:
		before := f.matches(e.Object, e.labelsBefore())
		after := f.matches(e.Object, e.Object.Labels)
		switch {
		case before && after:
			return e
		case after:
			return e.as(Added)
		case before:
			return e.as(Deleted)
		}
		return nil
	}
	return e
}

// catchUp returns what a subscriber with filter f that has seen every
// change up to from receives of the compacted change c, or nil: the
// object's latest state as Added (it did not see the object), Modified (it
// did) or Deleted (it saw the object, which is gone or no longer matches).
// Whether it saw an object is exact: the labels the object had at from are
// known down to the horizon.
func (f Filter) catchUp(c change, from mark) *Event {
	st := c.st
	if st.deleted() {
		o := st.ev.Object
		if st.created.after(from) || !f.matches(o, labelsAt(st.hist, o.Labels, from)) {
			return nil // created since, or never matched: never seen
		}
		return st.ev.copyAs(Deleted)
	}
	o := st.ev.Object
	now := f.matches(o, o.Labels)
	then := !st.created.after(from) && f.matches(o, labelsAt(st.hist, o.Labels, from))
	switch {
	case then && now:
		return st.ev.copyAs(Modified)
	case now:
		return st.ev.copyAs(Added)
	case then:
		return st.ev.copyAs(Deleted)
	}
	return nil
}
