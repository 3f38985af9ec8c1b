package cache

import (
	"cmp"
	"slices"
	"strconv"
	"time"
)

// LogLimits bound a Source's event log and its memory of deletions.
type LogLimits struct {
	// MaxEvents is the number of events kept once they are older than
	// MinAge. Default 10000.
	MaxEvents int
	// MaxBytes bounds the object bytes the log refers to, whatever their
	// age. Default 64 MiB.
	MaxBytes int64
	// MinAge keeps recent events past MaxEvents (never past MaxBytes), so
	// that a burst does not push out a client that reconnects at once.
	// Default 30s.
	MinAge time.Duration
	// MaxTombstones is the number of deletions remembered for compacted
	// catch-up after they left the log. Default 10000.
	MaxTombstones int
}

func (l LogLimits) withDefaults() LogLimits {
	if l.MaxEvents <= 0 {
		l.MaxEvents = 10000
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = 64 << 20
	}
	if l.MinAge < 0 {
		l.MinAge = 0
	} else if l.MinAge == 0 {
		l.MinAge = 30 * time.Second
	}
	if l.MaxTombstones <= 0 {
		l.MaxTombstones = 10000
	}
	return l
}

// logEntry is one event in the log.
type logEntry struct {
	seq uint64
	rv  uint64 // the change's resourceVersion, for resuming
	at  time.Time
	ev  *Event
}

// stored is the current state of one object.
type stored struct {
	ev      *Event // the Added or Modified event that produced this state
	changed mark   // its last change
	created mark   // its Added event
}

// tombstone remembers a deletion.
type tombstone struct {
	ev      *Event
	deleted mark
	created mark
}

// mark is a point in the log: a seq and the resourceVersion of the change.
type mark struct{ seq, rv uint64 }

// after reports whether m is after a position, given as a seq or (byRV) a
// resourceVersion.
func (m mark) after(pos uint64, byRV bool) bool {
	if byRV {
		return m.rv > pos
	}
	return m.seq > pos
}

// eventLog is a Source's store of current objects plus its ordered log of
// recent events and deletions. It is not safe for concurrent use: the
// Source's mutex guards it.
type eventLog struct {
	limits LogLimits
	now    func() time.Time

	store   map[string]*stored
	entries []logEntry // entries[start:] are the log, oldest first
	start   int
	bytes   int64
	tombs   []tombstone // oldest first
	tstart  int

	lastSeq uint64 // seq of the newest change (0: none)
	lastRV  uint64 // resourceVersion the log is at
	// baseSeq/baseRV: the log holds every change after them.
	baseSeq, baseRV uint64
	// horizonSeq/horizonRV: the store and tombstones can reconstruct every
	// change after them (compacted).
	horizonSeq, horizonRV uint64
}

func newEventLog(limits LogLimits, now func() time.Time) *eventLog {
	return &eventLog{limits: limits.withDefaults(), now: now, store: map[string]*stored{}}
}

// parseRV parses a resourceVersion. Kubernetes calls them opaque; every
// etcd-backed API server makes them unsigned integers, and resuming needs an
// order, so an unparsable one makes resuming fall back to a Reset.
func parseRV(rv string) (uint64, bool) {
	n, err := strconv.ParseUint(rv, 10, 64)
	return n, err == nil
}

// append records one change at resourceVersion rv and returns the event
// that subscribers see, or nil if it changes nothing.
func (l *eventLog) append(t EventType, obj *Object, rv uint64, position string) *Event {
	k := obj.key()
	cur := l.store[k]
	if t == Deleted && cur == nil {
		return nil
	}
	ev := &Event{Type: t, Object: obj, ResourceVersion: position}
	l.lastSeq++
	now := mark{l.lastSeq, rv}
	switch {
	case t == Deleted:
		delete(l.store, k)
		l.tombs = append(l.tombs, tombstone{ev: ev, deleted: now, created: cur.created})
	case cur != nil:
		ev.Type, ev.prevLabels = Modified, cur.ev.Object.Labels
		l.store[k] = &stored{ev: ev, changed: now, created: cur.created}
	default:
		ev.Type = Added
		l.store[k] = &stored{ev: ev, changed: now, created: now}
	}
	l.push(logEntry{seq: now.seq, rv: rv, at: l.now(), ev: ev})
	return ev
}

// bookmark records that the upstream is at rv without a change.
func (l *eventLog) bookmark(rv uint64, position string) *Event {
	ev := &Event{Type: Bookmark, ResourceVersion: position}
	l.lastSeq++
	l.push(logEntry{seq: l.lastSeq, rv: rv, at: l.now(), ev: ev})
	return ev
}

func (l *eventLog) push(e logEntry) {
	l.entries = append(l.entries, e)
	if e.ev.Object != nil {
		l.bytes += int64(len(e.ev.Object.Data))
	}
	if e.rv > l.lastRV {
		l.lastRV = e.rv
	}
	l.trim()
}

// trim drops the oldest entries beyond the limits, and the oldest
// tombstones beyond theirs, moving the base and the horizon forward.
func (l *eventLog) trim() {
	now := l.now()
	for l.start < len(l.entries) {
		e := &l.entries[l.start]
		n := len(l.entries) - l.start
		overBytes := l.bytes > l.limits.MaxBytes
		overCount := n > l.limits.MaxEvents && now.Sub(e.at) >= l.limits.MinAge
		if !overBytes && !overCount {
			break
		}
		if e.ev.Object != nil {
			l.bytes -= int64(len(e.ev.Object.Data))
		}
		l.baseSeq, l.baseRV = e.seq, e.rv
		*e = logEntry{}
		l.start++
	}
	for len(l.tombs)-l.tstart > l.limits.MaxTombstones {
		t := &l.tombs[l.tstart]
		l.horizonSeq, l.horizonRV = t.deleted.seq, t.deleted.rv
		*t = tombstone{}
		l.tstart++
	}
	// Compact the backing arrays once half of them is dead.
	if l.start > 1024 && l.start > len(l.entries)/2 {
		l.entries = append([]logEntry(nil), l.entries[l.start:]...)
		l.start = 0
	}
	if l.tstart > 1024 && l.tstart > len(l.tombs)/2 {
		l.tombs = append([]tombstone(nil), l.tombs[l.tstart:]...)
		l.tstart = 0
	}
}

// reset starts the log over at rv with objects as the store, for the
// initial sync. It publishes nothing.
func (l *eventLog) reset(objs []*Object, rv uint64, position string) {
	l.store = make(map[string]*stored, len(objs))
	for _, o := range objs {
		l.lastSeq++
		m := mark{l.lastSeq, rv}
		l.store[o.key()] = &stored{ev: &Event{Type: Added, Object: o, ResourceVersion: position}, changed: m, created: m}
	}
	l.entries, l.start, l.bytes = nil, 0, 0
	l.tombs, l.tstart = nil, 0
	l.lastRV = rv
	l.baseSeq, l.baseRV = l.lastSeq, rv
	l.horizonSeq, l.horizonRV = l.lastSeq, rv
}

// since returns up to max events after seq, and the seq of the last one
// returned. ok is false when seq is older than the log.
func (l *eventLog) since(seq uint64, max int) (evs []*Event, last uint64, ok bool) {
	if seq < l.baseSeq {
		return nil, seq, false
	}
	i := l.start + int(seq-l.baseSeq)
	end := min(len(l.entries), i+max)
	evs = make([]*Event, 0, end-i)
	for _, e := range l.entries[i:end] {
		evs = append(evs, e.ev)
	}
	if end > i {
		seq = l.entries[end-1].seq
	}
	return evs, seq, true
}

// seqForRV returns the cursor that resumes after resourceVersion rv: ok is
// false if the log no longer holds every change after rv.
func (l *eventLog) seqForRV(rv uint64) (seq uint64, ok bool) {
	if rv < l.baseRV || rv > l.lastRV {
		return 0, false
	}
	live := l.entries[l.start:]
	// The first entry with a larger resourceVersion starts the resume.
	i, _ := slices.BinarySearchFunc(live, rv+1, func(e logEntry, target uint64) int {
		if e.rv < target {
			return -1
		}
		if e.rv > target {
			return 1
		}
		return 0
	})
	if i == 0 {
		return l.baseSeq, true
	}
	return live[i-1].seq, true
}

// catchUp returns the compacted changes after a position: the latest state
// of each object changed after it (Added if created after it, else
// Modified) and the deletions of objects that existed at it, in the order
// they happened. A position is a seq, or a resourceVersion if byRV. ok is
// false past the horizon, where deletions have been forgotten.
func (l *eventLog) catchUp(pos uint64, byRV bool) (evs []*Event, ok bool) {
	if (!byRV && pos < l.horizonSeq) || (byRV && pos < l.horizonRV) {
		return nil, false
	}
	type item struct {
		seq uint64
		ev  *Event
	}
	var items []item
	for _, s := range l.store {
		if !s.changed.after(pos, byRV) {
			continue
		}
		t := Modified
		if s.created.after(pos, byRV) {
			t = Added
		}
		items = append(items, item{s.changed.seq, s.ev.as(t)})
	}
	for _, t := range l.tombs[l.tstart:] {
		if t.deleted.after(pos, byRV) && !t.created.after(pos, byRV) {
			items = append(items, item{t.deleted.seq, t.ev})
		}
	}
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.seq, b.seq) })
	evs = make([]*Event, len(items))
	for i, it := range items {
		evs[i] = it.ev
	}
	return evs, true
}

// snapshot returns the current objects as Added events, unordered.
func (l *eventLog) snapshot() []*Event {
	evs := make([]*Event, 0, len(l.store))
	for _, s := range l.store {
		evs = append(evs, s.ev.as(Added))
	}
	return evs
}
