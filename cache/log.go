package cache

import (
	"iter"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"k8s.io/apimachinery/pkg/labels"
)

// LogLimits bound a Source's event log and its memory of deletions.
type LogLimits struct {
	// MaxEvents is the number of events kept once they are older than
	// MinAge. Default 10000.
	MaxEvents int
	// MaxBytes bounds the object bytes the log refers to, whatever their
	// age. Default 64 MiB.
	MaxBytes int64
	// MinAge keeps recent events past MaxEvents (never past MaxBytes or the
	// Manager's MaxLogBytes), so that a burst does not push out a client
	// that reconnects at once. Default 30s; negative for none.
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

// logBudget bounds the object bytes that all the logs of a Manager refer
// to together. A log over the budget trims its own oldest events, so the
// Source whose events arrive pays for them.
type logBudget struct {
	max  int64 // 0: unbounded
	used atomic.Int64
}

func (b *logBudget) add(n int64) {
	if b != nil {
		b.used.Add(n)
	}
}

func (b *logBudget) over() bool { return b != nil && b.max > 0 && b.used.Load() > b.max }

// mark is a point in a Source's history: the resourceVersion of a change
// and its sequence number. The log keeps rv non-decreasing in seq, so the
// order of marks, (rv, seq), is also the order of the changes.
type mark struct{ rv, seq uint64 }

func (m mark) after(p mark) bool { return m.rv > p.rv || (m.rv == p.rv && m.seq > p.seq) }

// atRV is the position of a client that has seen every change up to
// resourceVersion rv.
func atRV(rv uint64) mark { return mark{rv, math.MaxUint64} }

// succ is the least mark after m.
func (m mark) succ() mark {
	if m.seq == math.MaxUint64 {
		return mark{m.rv + 1, 0}
	}
	return mark{m.rv, m.seq + 1}
}

// parseRV parses a resourceVersion. Kubernetes calls them opaque; every
// etcd-backed API server makes them unsigned integers, which resuming
// needs to order positions. A Source that meets another kind becomes
// opaque (see Source.opaque).
func parseRV(rv string) (uint64, bool) {
	n, err := strconv.ParseUint(rv, 10, 64)
	return n, err == nil
}

// logEntry is one event in the log.
type logEntry struct {
	at  mark
	age time.Duration // when it was logged, since the log's epoch
	ev  *Event
}

// labelChange records the labels an object had before a change of them.
type labelChange struct {
	at     mark
	before labels.Set
}

// maxLabelHistory bounds the label changes remembered per object; dropping
// one moves the horizon past it.
const maxLabelHistory = 8

// labelHistory is an object's label changes after the horizon, oldest
// first. Most objects have none: a stored state keeps a nil pointer.
type labelHistory []labelChange

// labelsAt returns the labels an object had at p, given its label history
// and its labels now; p must be at or after the horizon.
func labelsAt(hist *labelHistory, now labels.Set, p mark) labels.Set {
	if hist == nil {
		return now
	}
	for _, c := range *hist {
		if c.at.after(p) {
			return c.before
		}
	}
	return now
}

// stored is the current state of one object, or, once its event is
// Deleted, a tombstone: the memory of a deletion. It is immutable once in
// the store: a change stores a new one, so that frozen copies of the store
// stay valid.
type stored struct {
	ev      *Event // the event that produced this state
	changed mark   // the event's position
	created mark
	hist    *labelHistory // nil: no label change after the horizon
}

// deleted reports whether st is a tombstone.
func (st *stored) deleted() bool { return st.ev.Type == Deleted }

// objItem is an entry of the store, ordered by its object's namespace,
// then name, so that one namespace is one range. The trees hold a pointer
// per object, not its key: every byte per object counts.
type objItem struct{ st *stored }

// objAt returns an item to look up or start from namespace/name.
func objAt(ns, name string) objItem {
	return objItem{&stored{ev: &Event{Object: &Object{Namespace: ns, Name: name}}}}
}

func (it objItem) object() *Object { return it.st.ev.Object }

func objLess(a, b objItem) bool {
	x, y := a.object(), b.object()
	if x.Namespace != y.Namespace {
		return x.Namespace < y.Namespace
	}
	return x.Name < y.Name
}

// change is the latest change of a stored object or a remembered
// deletion. Ordered by their position (st.changed), the changes are the
// compacted history that a catch-up replays.
type change struct{ st *stored }

// changeAt returns a change to look up or start from m.
func changeAt(m mark) change { return change{&stored{changed: m}} }

func changeLess(a, b change) bool { return b.st.changed.after(a.st.changed) }

// btreeDegree suits small items: nodes of up to 63 items.
const btreeDegree = 32

// eventLog is a Source's store of current objects, the compacted history
// of their changes, and its ordered log of recent events. It is not safe
// for concurrent use: the Source's mutex guards it. The trees it hands out
// through frozenObjects and frozenChanges are read-only copies that any
// goroutine may read without the lock.
type eventLog struct {
	limits LogLimits
	budget *logBudget // may be nil
	now    func() time.Time
	epoch  time.Time // the origin of the entries' ages

	objs    *btree.BTreeG[objItem]
	changes *btree.BTreeG[change]
	// frozen copies handed out since the last change, shared by readers.
	frozenObjs    *btree.BTreeG[objItem]
	frozenChanges *btree.BTreeG[change]

	entries []logEntry // entries[start:] are the log, oldest first
	start   int
	bytes   int64
	tombs   []*stored // tombs[tstart:] are remembered, oldest first
	tstart  int

	last    mark   // the newest change or bookmark
	lastPos string // the newest non-empty position (resourceVersion)
	// base: the log holds every change after it.
	base mark
	// horizon: the store and its changes reconstruct every change after
	// it, exactly (compacted).
	horizon mark
}

func newEventLog(limits LogLimits, budget *logBudget, now func() time.Time) *eventLog {
	return &eventLog{
		limits: limits.withDefaults(), budget: budget, now: now, epoch: now(),
		objs:    btree.NewG(btreeDegree, objLess),
		changes: btree.NewG(btreeDegree, changeLess),
	}
}

// advance returns the mark of the next change at resourceVersion rv,
// which never goes below the last one.
func (l *eventLog) advance(rv uint64, position string) mark {
	l.last = mark{max(rv, l.last.rv), l.last.seq + 1}
	if position != "" {
		l.lastPos = position
	}
	l.frozenObjs, l.frozenChanges = nil, nil
	return l.last
}

// get returns the stored state of namespace/name, or nil.
func (l *eventLog) get(ns, name string) *stored {
	it, _ := l.objs.Get(objAt(ns, name))
	return it.st
}

// objects returns the stored objects in key order (namespace, then
// name); the store must not change while they are read.
func (l *eventLog) objects() iter.Seq[*Object] {
	return func(yield func(*Object) bool) {
		l.objs.Ascend(func(it objItem) bool { return yield(it.object()) })
	}
}

// len returns the number of stored objects.
func (l *eventLog) len() int { return l.objs.Len() }

// append records one change at resourceVersion rv and returns the event
// that subscribers see, or nil if it changes nothing. A Modified event
// whose labels changed keeps the previous object, which is what a
// subscriber whose selector it leaves receives as deleted.
func (l *eventLog) append(t EventType, obj *Object, rv uint64, position string) *Event {
	cur := l.get(obj.Namespace, obj.Name)
	if t == Deleted && cur == nil {
		return nil
	}
	ev := &Event{Type: t, Object: obj, ResourceVersion: position}
	at := l.advance(rv, position)
	if cur != nil {
		l.changes.Delete(change{cur})
	}
	switch {
	case t == Deleted:
		l.objs.Delete(objItem{cur})
		tomb := &stored{ev: ev, changed: at, created: cur.created, hist: cur.hist}
		l.changes.ReplaceOrInsert(change{tomb})
		l.tombs = append(l.tombs, tomb)
	case cur != nil:
		prev := cur.ev.Object
		ev.Type = Modified
		hist := cur.hist
		if !labelsEqual(prev.Labels, obj.Labels) {
			ev.prev = prev
			hist = l.remember(hist, labelChange{at: at, before: prev.Labels})
		}
		st := &stored{ev: ev, changed: at, created: cur.created, hist: hist}
		l.objs.ReplaceOrInsert(objItem{st})
		l.changes.ReplaceOrInsert(change{st})
	default:
		ev.Type = Added
		st := &stored{ev: ev, changed: at, created: at}
		l.objs.ReplaceOrInsert(objItem{st})
		l.changes.ReplaceOrInsert(change{st})
	}
	l.push(logEntry{at: at, age: l.age(), ev: ev})
	return ev
}

// age returns the time since the log's epoch (monotonic).
func (l *eventLog) age() time.Duration { return l.now().Sub(l.epoch) }

// remember returns h with c added, in a new array (h is shared with older
// states), without the changes at or before the horizon, and at most
// maxLabelHistory long: dropping more moves the horizon.
func (l *eventLog) remember(h *labelHistory, c labelChange) *labelHistory {
	var hist labelHistory
	if h != nil {
		hist = *h
	}
	i := 0
	for i < len(hist) && !hist[i].at.after(l.horizon) {
		i++
	}
	if n := len(hist) - i; n >= maxLabelHistory {
		drop := n - maxLabelHistory + 1
		l.raiseHorizon(hist[i+drop-1].at)
		i += drop
	}
	out := make(labelHistory, 0, len(hist)-i+1)
	out = append(append(out, hist[i:]...), c)
	return &out
}

func (l *eventLog) raiseHorizon(m mark) {
	if m.after(l.horizon) {
		l.horizon = m
	}
}

func labelsEqual(a, b labels.Set) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// bookmark records that the upstream is at rv without a change.
func (l *eventLog) bookmark(rv uint64, position string) *Event {
	ev := &Event{Type: Bookmark, ResourceVersion: position}
	l.push(logEntry{at: l.advance(rv, position), age: l.age(), ev: ev})
	return ev
}

func (l *eventLog) push(e logEntry) {
	l.entries = append(l.entries, e)
	n := e.ev.size()
	l.bytes += n
	l.budget.add(n)
	l.trim()
}

// trim drops the oldest entries beyond the limits, and the oldest
// tombstones beyond theirs, moving the base and the horizon forward.
func (l *eventLog) trim() {
	now := l.age()
	for l.start < len(l.entries) {
		e := &l.entries[l.start]
		n := len(l.entries) - l.start
		overBytes := l.bytes > l.limits.MaxBytes || l.budget.over()
		overCount := n > l.limits.MaxEvents && now-e.age >= l.limits.MinAge
		if !overBytes && !overCount {
			break
		}
		size := e.ev.size()
		l.bytes -= size
		l.budget.add(-size)
		l.base = e.at
		e.ev.forget()
		*e = logEntry{}
		l.start++
	}
	for len(l.tombs)-l.tstart > l.limits.MaxTombstones {
		t := l.tombs[l.tstart]
		l.changes.Delete(change{t})
		l.raiseHorizon(t.changed)
		l.tombs[l.tstart] = nil
		l.tstart++
	}
	// Compact the backing arrays once half of them is dead.
	if l.start > 1024 && l.start > len(l.entries)/2 {
		l.entries = append([]logEntry(nil), l.entries[l.start:]...)
		l.start = 0
	}
	if l.tstart > 1024 && l.tstart > len(l.tombs)/2 {
		l.tombs = append([]*stored(nil), l.tombs[l.tstart:]...)
		l.tstart = 0
	}
}

// reset starts the log over at rv with objs as the store, for the initial
// sync. It publishes nothing.
func (l *eventLog) reset(objs []*Object, rv uint64, position string) {
	l.budget.add(-l.bytes)
	l.objs.Clear(false)
	l.changes.Clear(false)
	l.last.rv = rv
	states := make([]*stored, len(objs))
	for i, o := range objs {
		at := l.advance(rv, position)
		states[i] = &stored{ev: &Event{Type: Added, Object: o, ResourceVersion: position}, changed: at, created: at}
	}
	// Backwards: a B-tree filled in ascending order leaves every node it
	// splits half empty, in descending order almost full. The history is
	// ascending, and so is a list (etcd's key order), which halves what
	// the trees keep per object.
	for _, st := range slices.Backward(states) {
		l.objs.ReplaceOrInsert(objItem{st})
		l.changes.ReplaceOrInsert(change{st})
	}
	l.lastPos = position
	l.frozenObjs, l.frozenChanges = nil, nil
	l.entries, l.start, l.bytes = nil, 0, 0
	l.tombs, l.tstart = nil, 0
	l.base, l.horizon = l.last, l.last
}

// release returns the log's bytes to the budget, when its Source stops.
func (l *eventLog) release() {
	l.budget.add(-l.bytes)
	l.bytes = 0
}

// since returns up to max events after position p, and the position of
// the last one returned. ok is false when p is older than the log.
func (l *eventLog) since(p mark, max int) (evs []*Event, last mark, ok bool) {
	if p.seq < l.base.seq {
		return nil, p, false
	}
	i := l.start + int(p.seq-l.base.seq)
	end := min(len(l.entries), i+max)
	if end <= i {
		return nil, p, true
	}
	evs = make([]*Event, 0, end-i)
	for _, e := range l.entries[i:end] {
		evs = append(evs, e.ev)
	}
	return evs, l.entries[end-1].at, true
}

// resumeAt returns the position in the log that resumes after
// resourceVersion rv: ok is false if the log no longer holds every change
// after rv.
func (l *eventLog) resumeAt(rv uint64) (mark, bool) {
	if rv < l.base.rv || rv > l.last.rv {
		return mark{}, false
	}
	live := l.entries[l.start:]
	// The first entry with a larger resourceVersion starts the resume.
	i, _ := slices.BinarySearchFunc(live, rv+1, func(e logEntry, target uint64) int {
		switch {
		case e.at.rv < target:
			return -1
		case e.at.rv > target:
			return 1
		}
		return 0
	})
	if i == 0 {
		return l.base, true
	}
	return live[i-1].at, true
}

// canCatchUp reports whether the compacted history is exact after p.
func (l *eventLog) canCatchUp(p mark) bool { return !l.horizon.after(p) }

// frozenObjects returns a read-only copy of the store, in O(1).
func (l *eventLog) frozenObjects() *btree.BTreeG[objItem] {
	if l.frozenObjs == nil {
		l.frozenObjs = l.objs.Clone()
	}
	return l.frozenObjs
}

// frozenHistory returns a read-only copy of the compacted history, in O(1).
func (l *eventLog) frozenHistory() *btree.BTreeG[change] {
	if l.frozenChanges == nil {
		l.frozenChanges = l.changes.Clone()
	}
	return l.frozenChanges
}
