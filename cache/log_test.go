package cache

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

func obj(name, rv string, lbls map[string]string) *Object {
	return &Object{Namespace: "ns", Name: name, ResourceVersion: rv, Labels: lbls,
		Data: []byte(fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"ns","resourceVersion":%q}}`, name, rv))}
}

// describe renders events as "TYPE name@rv" for comparison.
func describe(evs []*Event) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		if e.Object == nil {
			out = append(out, e.Type.String()+" @"+e.ResourceVersion)
			continue
		}
		out = append(out, e.Type.String()+" "+e.Object.Name+"@"+e.Object.ResourceVersion)
	}
	return out
}

// fakeClock steps time for the log's age limit.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestLog(limits LogLimits) (*eventLog, *fakeClock) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	if limits.MinAge == 0 {
		limits.MinAge = -1 // no age floor unless a test asks for one
	}
	return newEventLog(limits, nil, c.now), c
}

// readPhase reads a snapshot or catch-up to its end.
func readPhase(p phase, f Filter) []*Event {
	var out []*Event
	for {
		evs, done := p.read(f, 3)
		out = append(out, evs...)
		if done {
			return out
		}
	}
}

// put appends a watch event at rv n.
func put(l *eventLog, t EventType, name string, n uint64, lbls map[string]string) *Event {
	rv := strconv.FormatUint(n, 10)
	return l.append(t, obj(name, rv, lbls), n, rv)
}

func TestEventLogAppendTypes(t *testing.T) {
	l, _ := newTestLog(LogLimits{})
	l.reset([]*Object{obj("a", "10", nil)}, 10, "10")
	if got := put(l, Added, "a", 11, nil); got.Type != Modified {
		t.Errorf("re-adding a stored object: got %s, want MODIFIED", got.Type)
	}
	if got := put(l, Modified, "b", 12, nil); got.Type != Added {
		t.Errorf("modifying an unknown object: got %s, want ADDED", got.Type)
	}
	if got := put(l, Deleted, "zz", 13, nil); got != nil {
		t.Errorf("deleting an unknown object published %s, want nothing", got.Type)
	}
	evs, last, ok := l.since(l.base, 100)
	if !ok || last != l.last {
		t.Fatalf("since(base) = ok %v last %v, want ok and %v", ok, last, l.last)
	}
	want := []string{"MODIFIED a@11", "ADDED b@12"}
	if got := describe(evs); !slices.Equal(got, want) {
		t.Errorf("log = %v, want %v", got, want)
	}
}

func TestEventLogTrimAndResume(t *testing.T) {
	tests := []struct {
		name     string
		limits   LogLimits
		resumeRV uint64
		wantSeq  bool     // the log still holds the resume point
		wantCU   []string // else: the compacted catch-up (nil: past the horizon)
	}{
		{name: "inside window", limits: LogLimits{MaxEvents: 100}, resumeRV: 12, wantSeq: true},
		{name: "at the end", limits: LogLimits{MaxEvents: 100}, resumeRV: 15, wantSeq: true},
		{
			name: "out of window, catch-up", limits: LogLimits{MaxEvents: 2}, resumeRV: 11,
			// b modified at 12, c created 13 then deleted 14 (never seen: skipped),
			// a deleted 15.
			wantCU: []string{"MODIFIED b@12", "DELETED a@15"},
		},
		{name: "past the horizon", limits: LogLimits{MaxEvents: 2, MaxTombstones: 1}, resumeRV: 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newTestLog(tt.limits)
			l.reset([]*Object{obj("a", "10", nil), obj("b", "10", nil)}, 10, "10")
			put(l, Added, "x", 11, nil)
			put(l, Modified, "b", 12, nil)
			put(l, Added, "c", 13, nil)
			put(l, Deleted, "c", 14, nil)
			put(l, Deleted, "a", 15, nil)
			_, ok := l.resumeAt(tt.resumeRV)
			if ok != tt.wantSeq {
				t.Fatalf("resumeAt(%d) ok = %v, want %v (base %v)", tt.resumeRV, ok, tt.wantSeq, l.base)
			}
			if tt.wantSeq {
				return
			}
			from := atRV(tt.resumeRV)
			ok = l.canCatchUp(from)
			if ok != (tt.wantCU != nil) {
				t.Fatalf("canCatchUp = %v, want %v", ok, tt.wantCU != nil)
			}
			if !ok {
				return
			}
			got := describe(readPhase(newCatchUp(l, from), Filter{}))
			if want := append(tt.wantCU, "BOOKMARK @15"); !slices.Equal(got, want) {
				t.Errorf("catch-up = %v, want %v", got, want)
			}
		})
	}
}

func TestEventLogMinAgeKeepsRecentEvents(t *testing.T) {
	l, clock := newTestLog(LogLimits{MaxEvents: 1, MinAge: time.Minute})
	l.reset(nil, 1, "1")
	put(l, Added, "a", 2, nil)
	put(l, Added, "b", 3, nil)
	if _, ok := l.resumeAt(1); !ok {
		t.Fatal("an event younger than MinAge was trimmed past MaxEvents")
	}
	clock.t = clock.t.Add(2 * time.Minute)
	put(l, Added, "c", 4, nil)
	if _, ok := l.resumeAt(1); ok {
		t.Fatal("events older than MinAge were kept past MaxEvents")
	}
	if n := len(l.entries) - l.start; n != 1 {
		t.Fatalf("log holds %d events, want 1", n)
	}
}

func TestEventLogMaxBytesIsHard(t *testing.T) {
	l, _ := newTestLog(LogLimits{MaxBytes: 200, MinAge: time.Hour})
	l.reset(nil, 1, "1")
	for i := range 100 {
		put(l, Added, fmt.Sprintf("o%d", i), uint64(i+2), nil)
		if l.bytes > 200 {
			t.Fatalf("after %d events the log holds %d bytes, want at most 200", i+1, l.bytes)
		}
	}
}

func TestFilterSelectorTransitions(t *testing.T) {
	sel := labels.SelectorFromSet(labels.Set{"app": "web"})
	f := Filter{Namespace: "ns", Labels: sel}
	l, _ := newTestLog(LogLimits{})
	l.reset([]*Object{obj("a", "1", map[string]string{"app": "web"})}, 1, "1")
	steps := []struct {
		ev   *Event
		want string
	}{
		{put(l, Modified, "a", 2, map[string]string{"app": "db"}), "DELETED a@2"},
		{put(l, Modified, "a", 3, map[string]string{"app": "db", "x": "y"}), ""},
		{put(l, Modified, "a", 4, map[string]string{"app": "web"}), "ADDED a@4"},
		{put(l, Modified, "a", 5, map[string]string{"app": "web"}), "MODIFIED a@5"},
		{put(l, Added, "other", 6, nil), ""},
	}
	for i, s := range steps {
		got := ""
		if e := f.apply(s.ev); e != nil {
			got = describe([]*Event{e})[0]
		}
		if got != s.want {
			t.Errorf("step %d: got %q, want %q", i, got, s.want)
		}
	}
	// The variants are memoized so that their frames are shared.
	if first, again := f.apply(steps[0].ev), f.apply(steps[0].ev); first != again {
		t.Error("the DELETED variant of an event is not memoized")
	}
	other := Filter{Namespace: "elsewhere"}
	if evs := readPhase(newCatchUp(l, atRV(1)), other); len(evs) != 1 || evs[0].Type != Bookmark {
		t.Errorf("catch-up leaked objects of another namespace: %v", describe(evs))
	}
}

func TestFrameEncodesOnce(t *testing.T) {
	e := &Event{Type: Added, Object: obj("a", "1", nil)}
	calls := 0
	enc := func(*Event) []byte { calls++; return []byte("x") }
	for range 3 {
		Encoded(e, int(ViewFull), enc)
	}
	Encoded(e, int(ViewMetadata), enc)
	if calls != 2 {
		t.Fatalf("encode ran %d times for 2 views, want 2", calls)
	}
}

func TestWithTypeMeta(t *testing.T) {
	tm := []byte(`{"apiVersion":"v1","kind":"ConfigMap",`)
	tests := []struct{ in, want string }{
		{`{"metadata":{"name":"a"}}`, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}`},
		{` { "metadata":{}}`, `{"apiVersion":"v1","kind":"ConfigMap", "metadata":{}}`},
		{`{}`, `{"apiVersion":"v1","kind":"ConfigMap"}`},
	}
	for _, tt := range tests {
		got := withTypeMeta([]byte(tt.in), tm)
		if string(got) != tt.want {
			t.Errorf("withTypeMeta(%s) = %s; want %s", tt.in, got, tt.want)
		}
		_, h, err := decodeObject(got, true)
		if err != nil {
			t.Errorf("result %s does not decode: %v", got, err)
		} else if h.apiVersion != "v1" || h.kind != "ConfigMap" {
			t.Errorf("result %s decodes as %s %s, want v1 ConfigMap", got, h.apiVersion, h.kind)
		}
	}
}

// TestCatchUpSendsOnlyDeletionsASubscriberMaySee (defect 9.1): a
// compacted catch-up for a label-filtered subscriber sends DELETED only
// for objects that matched its selector at its position, using the labels
// each object had then, and nothing for objects it never saw.
func TestCatchUpSendsOnlyDeletionsASubscriberMaySee(t *testing.T) {
	web := map[string]string{"app": "web"}
	db := map[string]string{"app": "db"}
	l, _ := newTestLog(LogLimits{MaxEvents: 1})
	l.reset([]*Object{
		obj("matched-deleted", "1", web),
		obj("never-deleted", "1", db),
		obj("matched-changed-away", "1", web),
		obj("never-changed", "1", db),
		obj("never-changed-in", "1", db),
		obj("matched-away-and-back", "1", web),
		obj("matched-relabelled-deleted", "1", web),
	}, 1, "1")
	from := atRV(1) // the subscriber has seen everything up to 1
	put(l, Deleted, "matched-deleted", 2, web)
	put(l, Deleted, "never-deleted", 3, db)
	put(l, Modified, "matched-changed-away", 4, db)
	put(l, Modified, "never-changed", 5, map[string]string{"app": "db", "x": "y"})
	put(l, Modified, "never-changed-in", 6, web)
	put(l, Modified, "matched-away-and-back", 7, db)
	put(l, Modified, "matched-away-and-back", 8, web)
	put(l, Modified, "matched-relabelled-deleted", 9, db)
	put(l, Modified, "matched-relabelled-deleted", 10, map[string]string{"app": "db", "v": "2"})
	put(l, Deleted, "matched-relabelled-deleted", 11, nil)
	put(l, Added, "created-deleted", 12, web)
	put(l, Deleted, "created-deleted", 13, web)
	if _, ok := l.resumeAt(1); ok {
		t.Fatal("the log still holds rv 1: the test needs a catch-up")
	}
	if !l.canCatchUp(from) {
		t.Fatal("a catch-up from 1 is past the horizon")
	}
	f := Filter{Namespace: "ns", Labels: labels.SelectorFromSet(web)}
	got := describe(readPhase(newCatchUp(l, from), f))
	want := []string{
		"DELETED matched-deleted@2",
		"DELETED matched-changed-away@4",
		"ADDED never-changed-in@6",
		"MODIFIED matched-away-and-back@8",
		"DELETED matched-relabelled-deleted@11",
		"BOOKMARK @13",
	}
	if !slices.Equal(got, want) {
		t.Errorf("catch-up = %v\nwant       %v", got, want)
	}
}

// TestLabelHistoryBoundMovesTheHorizon: an object whose labels change
// more often than the history keeps moves the horizon, so that a
// catch-up that could not be exact becomes a snapshot instead.
func TestLabelHistoryBoundMovesTheHorizon(t *testing.T) {
	l, _ := newTestLog(LogLimits{MaxEvents: 1})
	l.reset([]*Object{obj("a", "1", map[string]string{"v": "0"})}, 1, "1")
	for i := 2; i <= maxLabelHistory+2; i++ {
		put(l, Modified, "a", uint64(i), map[string]string{"v": strconv.Itoa(i)})
	}
	if l.canCatchUp(atRV(1)) {
		t.Fatalf("after %d label changes a catch-up from 1 is still allowed; horizon %v", maxLabelHistory+1, l.horizon)
	}
	if !l.canCatchUp(atRV(3)) {
		t.Fatalf("a catch-up from 3 is refused; horizon %v", l.horizon)
	}
}

// TestDeletedForASelectorCarriesThePreviousObject: an object that leaves a
// selector is sent to that selector's subscribers as deleted with its
// previous content at the change's resourceVersion, as the API server
// sends it.
func TestDeletedForASelectorCarriesThePreviousObject(t *testing.T) {
	web := map[string]string{"app": "web"}
	l, _ := newTestLog(LogLimits{})
	l.reset([]*Object{obj("a", "1", web)}, 1, "1")
	prev := l.get("ns", "a").ev.Object
	ev := put(l, Modified, "a", 2, map[string]string{"app": "db"})
	del := Filter{Labels: labels.SelectorFromSet(web)}.apply(ev)
	if del == nil || del.Type != Deleted {
		t.Fatalf("the web subscriber got %v, want DELETED", del)
	}
	o, _, err := decodeObject(del.Object.Data, false)
	if err != nil {
		t.Fatal(err)
	}
	if o.ResourceVersion != "2" || del.Object.ResourceVersion != "2" {
		t.Errorf("DELETED carries resourceVersion %q (object %q), want the change's 2", del.Object.ResourceVersion, o.ResourceVersion)
	}
	if string(del.Object.Labels["app"]) != "web" || del.Object.Name != prev.Name {
		t.Errorf("DELETED carries labels %v, want the previous object's", del.Object.Labels)
	}
}

func TestCompareKeysIsStorageKeyOrder(t *testing.T) {
	type key struct{ ns, name string }
	tests := []struct {
		name string
		keys []key // in the API server's order
	}{
		{"namespaces that prefix others", []key{{"n", "z"}, {"ns-two", "a"}, {"ns.x", "a"}, {"ns", "a"}, {"ns", "b"}, {"ns0", "a"}, {"nsa", "a"}}},
		{"names within a namespace", []key{{"a", "a"}, {"a", "a-b"}, {"a", "a.b"}, {"a", "a0"}, {"a", "ab"}}},
		{"cluster-scoped by name", []key{{"", "a"}, {"", "a-b"}, {"", "a.b"}, {"", "b"}}},
		{"a prefix name against a longer namespace", []key{{"a-", "a"}, {"a", "b"}, {"ab", "a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, a := range tt.keys {
				for j, b := range tt.keys {
					want := 0
					if i < j {
						want = -1
					} else if i > j {
						want = 1
					}
					if got := CompareKeys(a.ns, a.name, b.ns, b.name); got != want {
						t.Errorf("CompareKeys(%v, %v) = %d, want %d", a, b, got, want)
					}
					if a.ns != "" && b.ns != "" {
						if ref := strings.Compare(a.ns+"/"+a.name, b.ns+"/"+b.name); ref != want {
							t.Errorf("test case: %v, %v out of byte order", a, b)
						}
					}
				}
			}
		})
	}
}

func TestCompareKeysDoesNotAllocate(t *testing.T) {
	ns, other := strings.Repeat("n", 40), strings.Repeat("n", 40)+"-two"
	if n := testing.AllocsPerRun(100, func() { CompareKeys(ns, "a", other, "b") }); n != 0 {
		t.Errorf("CompareKeys allocates %v times", n)
	}
}

func TestSnapshotListsInStorageKeyOrder(t *testing.T) {
	l, _ := newTestLog(LogLimits{})
	var objs []*Object
	for _, k := range [][2]string{{"ns", "a"}, {"n", "b"}, {"ns0", "a"}, {"ns-two", "a"}, {"ns", "b"}, {"ns-two", "b"}} {
		objs = append(objs, &Object{Namespace: k[0], Name: k[1], ResourceVersion: "1"})
	}
	l.reset(objs, 1, "1")
	put := func(ns, name string, n uint64) {
		rv := strconv.FormatUint(n, 10)
		l.append(Added, &Object{Namespace: ns, Name: name, ResourceVersion: rv}, n, rv)
	}
	put("ns.x", "a", 2)
	put("n", "a", 3)
	keys := func(evs []*Event) []string {
		var out []string
		for _, e := range evs {
			if e.Object != nil {
				out = append(out, e.Object.Namespace+"/"+e.Object.Name)
			}
		}
		return out
	}
	all := keys(readPhase(newSnapshot(l, Filter{}, false), Filter{}))
	want := []string{"n/a", "n/b", "ns-two/a", "ns-two/b", "ns.x/a", "ns/a", "ns/b", "ns0/a"}
	if !slices.Equal(all, want) {
		t.Errorf("snapshot = %v, want %v", all, want)
	}
	for _, ns := range []string{"n", "ns", "ns-two"} {
		got := keys(readPhase(newSnapshot(l, Filter{Namespace: ns}, false), Filter{Namespace: ns}))
		var wantNS []string
		for _, k := range want {
			if strings.HasPrefix(k, ns+"/") {
				wantNS = append(wantNS, k)
			}
		}
		if !slices.Equal(got, wantNS) {
			t.Errorf("snapshot of namespace %q = %v, want %v", ns, got, wantNS)
		}
	}
}
