package cache

import (
	"fmt"
	"maps"
	"reflect"
	"sync"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/labels"
)

func sameMap(a, b labels.Set) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func sameString(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// TestInternerSharesWhatObjectsRepeat: two Pods of one ReplicaSet, decoded
// apart, share their namespace and label set, which stay equal to
// what was decoded; a third with other labels shares its strings only.
func TestInternerSharesWhatObjectsRepeat(t *testing.T) {
	for _, enc := range []string{"json", "protobuf"} {
		t.Run(enc, func(t *testing.T) {
			in := newInterner()
			var objs []*Object
			for _, i := range []int{0, 20 * 50, 1} { // Pods 0 and 1000: same namespace and app
				objs = append(objs, decodeWatchBody(t, podWatchEvents(t, enc, 1, i), in)...)
			}
			a, b, c := objs[0], objs[1], objs[2]
			want := labels.Set{"app": "web-00", "tier": "frontend", "pod-template-hash": "7d9f8c6b5"}
			if !maps.Equal(a.Labels, want) || !maps.Equal(b.Labels, want) {
				t.Fatalf("labels %v and %v, want %v", a.Labels, b.Labels, want)
			}
			if !sameMap(a.Labels, b.Labels) {
				t.Error("equal label sets are not shared")
			}
			if !sameString(a.Namespace, b.Namespace) {
				t.Error("namespace not shared")
			}
			if sameMap(a.Labels, c.Labels) || c.Labels["app"] != "web-01" {
				t.Fatalf("another label set shared or changed: %v", c.Labels)
			}
			if !sameString(keyOf(a.Labels, "tier"), keyOf(c.Labels, "tier")) || !sameString(a.Labels["tier"], c.Labels["tier"]) {
				t.Error("label strings of different sets not shared")
			}
		})
	}
}

// keyOf returns l's own copy of the key k.
func keyOf(l labels.Set, k string) string {
	for key := range l {
		if key == k {
			return key
		}
	}
	return ""
}

// TestInternerIsBounded: an interner holds at most two generations of
// maxInterned entries, however many distinct ones it sees, and keeps
// sharing what is used again.
func TestInternerIsBounded(t *testing.T) {
	in := newInterner()
	hot := &Object{Namespace: "hot", Labels: labels.Set{"app": "hot"}}
	in.object(hot)
	for i := range 5 * maxInterned {
		o := &Object{Namespace: fmt.Sprintf("ns-%d", i), Labels: labels.Set{"pod": fmt.Sprint(i)}}
		in.object(o)
		if i%100 == 0 {
			again := &Object{Namespace: "hot", Labels: labels.Set{"app": "hot"}}
			in.object(again)
			if !sameMap(again.Labels, hot.Labels) || !sameString(again.Namespace, hot.Namespace) {
				t.Fatalf("after %d objects, a set in use is no longer shared", i)
			}
		}
	}
	if n := len(in.strs) + len(in.prev); n > 2*maxInterned {
		t.Errorf("%d strings held, want at most %d", n, 2*maxInterned)
	}
	if n := len(in.sets) + len(in.prvs); n > 2*maxInterned {
		t.Errorf("%d label sets held, want at most %d", n, 2*maxInterned)
	}
}

// TestOnlyTheLogMemoizes: a snapshot's events are copies, whose encodings
// stay out of the store; an event in the log memoizes its encoding and
// its variants until it leaves the log.
func TestOnlyTheLogMemoizes(t *testing.T) {
	l, _ := newTestLog(LogLimits{MaxEvents: 1})
	l.reset([]*Object{obj("a", "1", map[string]string{"x": "1"})}, 1, "1")
	stored := l.get("ns", "a").ev
	for _, e := range readPhase(newSnapshot(l, Filter{}, false), Filter{}) {
		Encoded(e, int(ViewFull), func(*Event) int { return 1 })
	}
	if stored.memo.Load() != nil {
		t.Fatal("a snapshot read memoized an encoding into the stored event")
	}

	ev := put(l, Modified, "a", 2, map[string]string{"x": "2"}) // leaves {x=1}
	Encoded(ev, int(ViewFull), func(*Event) int { return 2 })
	if (Filter{Labels: labels.SelectorFromSet(labels.Set{"x": "1"})}).apply(ev) == nil || ev.memo.Load() == nil || ev.memo.Load().deleted.Load() == nil {
		t.Fatal("no Deleted variant memoized for a subscriber the object left")
	}
	if ev.memo.Load().frames[ViewFull].Load() == nil {
		t.Fatal("an event in the log did not memoize its encoding")
	}
	put(l, Modified, "b", 3, nil) // pushes ev out of the log (MaxEvents 1)
	if ev.memo.Load() != nil {
		t.Error("an event that left the log still memoizes")
	}
	if got := l.get("ns", "a").ev; got != ev {
		t.Fatal("the stored state is not the event's")
	}
}

// TestForgetRacesWithReaders: readers encoding an event and asking for
// its variants while it leaves the log get a result every time.
func TestForgetRacesWithReaders(t *testing.T) {
	before := obj("a", "1", map[string]string{"x": "1"})
	ev := &Event{Type: Modified, Object: obj("a", "2", map[string]string{"x": "2"}), ResourceVersion: "2", prev: before}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if Encoded(ev, int(ViewFull), func(*Event) int { return 7 }) != 7 {
					t.Error("wrong encoding")
					return
				}
				if d := ev.as(Deleted); d.Type != Deleted || d.Object.Name != "a" {
					t.Errorf("Deleted variant %v", d)
					return
				}
			}
		}()
	}
	for range 10000 {
		ev.forget()
	}
	close(done)
	wg.Wait()
}
