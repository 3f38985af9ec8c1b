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
type Object struct {
	Namespace       string
	Name            string
	UID             string
	ResourceVersion string
	Labels          labels.Set
	// APIVersion and Kind as the API server sent them.
	APIVersion, Kind string
	// Data is the object, managedFields removed unless the Manager keeps
	// them: JSON, or, for built-in types watched in protobuf, the API
	// server's protobuf encoding (see IsProtobuf).
	Data []byte
}

// key is the store key of an object: namespace/name, or name.
func (o *Object) key() string {
	if o.Namespace == "" {
		return o.Name
	}
	return o.Namespace + "/" + o.Name
}

// MaxFrameSlots bounds the number of distinct encodings memoized per Event
// (one per view and format the daemon serves).
const MaxFrameSlots = 4

// Event is one change to one object, or a marker. Events are immutable and
// shared by every subscriber of a Source; do not modify one.
type Event struct {
	Type   EventType
	Object *Object // nil for markers
	// ResourceVersion is the position of the stream after this event:
	// resuming from it continues after this event.
	ResourceVersion string

	// prevLabels are the object's labels before a Modified event, to tell
	// a filtered subscriber that an object entered or left its selector.
	prevLabels labels.Set
	// asAdded and asDeleted memoize the variants of a Modified event that
	// filtered subscribers see, so that their encodings are shared too.
	asAdded, asDeleted atomic.Pointer[Event]
	frames             [MaxFrameSlots]atomic.Pointer[any]
}

// Encoded returns the encoding of e for slot (see MaxFrameSlots), computing
// it with encode the first time; what an encoding is, is the caller's
// business. Concurrent first calls may each run encode; one result wins and
// every caller afterwards gets it. Callers must use one T per slot.
func Encoded[T any](e *Event, slot int, encode func(*Event) T) T {
	if p := e.frames[slot].Load(); p != nil {
		return (*p).(T)
	}
	var v any = encode(e)
	if e.frames[slot].CompareAndSwap(nil, &v) {
		return v.(T)
	}
	return (*e.frames[slot].Load()).(T)
}

// as returns the variant of e with type t, sharing its object and
// position. The Added and Deleted variants are memoized so that the frames
// of filtered subscribers are shared too.
func (e *Event) as(t EventType) *Event {
	var slot *atomic.Pointer[Event]
	switch {
	case e.Type == t:
		return e
	case t == Added:
		slot = &e.asAdded
	case t == Deleted:
		slot = &e.asDeleted
	default:
		return &Event{Type: t, Object: e.Object, ResourceVersion: e.ResourceVersion}
	}
	if v := slot.Load(); v != nil {
		return v
	}
	slot.CompareAndSwap(nil, &Event{Type: t, Object: e.Object, ResourceVersion: e.ResourceVersion})
	return slot.Load()
}

// Filter selects the objects a subscription receives.
type Filter struct {
	// Namespace, if set, admits only objects in it.
	Namespace string
	// Labels, if set, admits only objects whose labels it matches.
	Labels labels.Selector
}

func (f Filter) matches(ns string, l labels.Set) bool {
	if f.Namespace != "" && ns != f.Namespace {
		return false
	}
	return f.Labels == nil || f.Labels.Empty() || f.Labels.Matches(l)
}

// apply returns what a subscriber with filter f sees of e, or nil: an
// object that starts (stops) matching a selector is Added (Deleted).
func (f Filter) apply(e *Event) *Event {
	switch e.Type {
	case Added, Deleted:
		if f.matches(e.Object.Namespace, e.Object.Labels) {
			return e
		}
		return nil
	case Modified:
		before := f.matches(e.Object.Namespace, e.prevLabels)
		after := f.matches(e.Object.Namespace, e.Object.Labels)
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

// applyCatchUp is apply for a compacted catch-up, where the subscriber's
// previous view of an object is unknown: an object in the namespace that
// does not match the selector is sent as Deleted, in case the subscriber
// had it (a store ignores the deletion of an object it does not have).
func (f Filter) applyCatchUp(e *Event) *Event {
	if e.Object == nil {
		return e
	}
	if f.Namespace != "" && e.Object.Namespace != f.Namespace {
		return nil
	}
	if e.Type == Deleted || f.matches(e.Object.Namespace, e.Object.Labels) {
		return e
	}
	return e.as(Deleted)
}
