package cache

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// uidObj returns an object with a uid in its bytes, as the API server
// sends every object.
func uidObj(name, rv, uid string) *Object {
	return &Object{Namespace: "ns", Name: name, ResourceVersion: rv,
		Data: fmt.Appendf(nil, `{"metadata":{"name":%q,"namespace":"ns","uid":%q,"resourceVersion":%q}}`, name, uid, rv)}
}

// state is what a client holds: uid@resourceVersion by name.
type state map[string]string

// applyTo applies events to st as a client's store does; it returns the
// resourceVersion a client resumes from after each event: the event's
// position (client.Watcher's rule, "" for none) and its object's
// (client-go's reflector's rule, "" for a marker).
func applyTo(t *testing.T, st state, evs []*Event) (positions, objectRVs []string) {
	t.Helper()
	for _, e := range evs {
		positions = append(positions, e.ResourceVersion)
		if e.Type == Reset {
			clear(st)
		}
		if e.Object == nil {
			objectRVs = append(objectRVs, "")
			continue
		}
		o, h, err := decodeAnyObject(e.Object.Data, false)
		if err != nil {
			t.Fatal(err)
		}
		objectRVs = append(objectRVs, o.ResourceVersion)
		switch e.Type {
		case Added, Modified:
			st[e.Object.Name] = h.uid + "@" + e.Object.ResourceVersion
		case Deleted:
			delete(st, e.Object.Name)
		}
	}
	return positions, objectRVs
}

// readUntil reads sub until a marker of type typ, or Synced, at position
// pos.
func readUntil(t *testing.T, ctx context.Context, sub *Subscription, typ EventType, pos string) []*Event {
	t.Helper()
	var got []*Event
	for {
		evs, err := sub.Next(ctx, 100)
		if err != nil {
			t.Fatalf("after %v: %v", describe(got), err)
		}
		for _, e := range evs {
			got = append(got, e)
			if (e.Type == typ || e.Type == Synced) && e.ResourceVersion == pos {
				return got
			}
		}
	}
}

// TestResumeInsideARelistDifference (issue 28): a client that resumes from
// any resourceVersion it received in the difference a relist publishes,
// the event's position (client.Watcher) or the object's (client-go's
// reflector), gets the rest of it, from the log or from the compacted
// history, and no position it is given goes below one it has seen.
func TestResumeInsideARelistDifference(t *testing.T) {
	for _, tt := range []struct {
		name   string
		limits LogLimits
	}{
		{"from the log", LogLimits{}},
		{"compacted catch-up", LogLimits{MaxEvents: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			up := newFakeUpstream()
			up.lists <- fakeList{objs: []*Object{
				uidObj("a", "1", "a1"), uidObj("b", "2", "b1"), uidObj("c", "3", "c1"),
				uidObj("e", "4", "e1"), uidObj("f", "5", "f1"), uidObj("g", "5", "g1"),
			}, rv: "5"}
			w1 := make(chan fakeStep, 4)
			up.watches <- w1
			s := startTestSource(t, up, tt.limits)
			first := subscribe(t, ctx, s, Filter{}, "")
			before := state{}
			applyTo(t, before, readUntil(t, ctx, first, Synced, "5"))
			// H: the last position before the relist.
			w1 <- fakeStep{t: Bookmark, rv: "6"}
			applyTo(t, before, readUntil(t, ctx, first, Bookmark, "6"))

			// The watch expires. The relist at 12: a the same, b changed, c
			// and f gone, d new, e deleted and created again, g changed at
			// the list's own resourceVersion.
			w1 <- fakeStep{err: &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusGone, Reason: metav1.StatusReasonExpired}}}
			w2 := make(chan fakeStep, 4)
			up.lists <- fakeList{objs: []*Object{
				uidObj("a", "1", "a1"), uidObj("b", "9", "b1"), uidObj("d", "8", "d1"),
				uidObj("e", "10", "e2"), uidObj("g", "12", "g1"),
			}, rv: "12"}
			up.watches <- w2
			diff := readUntil(t, ctx, first, Bookmark, "12")
			want := state{"a": "a1@1", "b": "b1@9", "d": "d1@8", "e": "e2@10", "g": "g1@12"}
			after := maps.Clone(before)
			positions, objectRVs := applyTo(t, after, diff)
			if !maps.Equal(after, want) {
				t.Fatalf("after the difference %v the client holds %v, want %v", describe(diff), after, want)
			}
			// Reflector positions never go below H, nor backwards.
			last := uint64(6)
			for i, rv := range objectRVs {
				if rv == "" {
					continue
				}
				n, _ := strconv.ParseUint(rv, 10, 64)
				if n < last {
					t.Errorf("event %d of %v carries resourceVersion %s, below %d that the client has seen", i, describe(diff), rv, last)
				}
				last = max(last, n)
			}
			// A bookmark after the difference ends every resume's read.
			w2 <- fakeStep{t: Bookmark, rv: "13"}
			readUntil(t, ctx, first, Bookmark, "13")

			for i := range diff {
				for _, resume := range []struct{ rule, rv string }{
					{"event position", positions[i]},
					{"object resourceVersion", objectRVs[i]},
				} {
					if resume.rv == "" {
						continue
					}
					held := maps.Clone(before)
					applyTo(t, held, diff[:i+1])
					sub := subscribe(t, ctx, s, Filter{}, resume.rv)
					rest := readUntil(t, ctx, sub, Bookmark, "13")
					applyTo(t, held, rest)
					sub.Close()
					if !maps.Equal(held, want) {
						t.Errorf("resuming by %s from %s after %s (event %d of %v): got %v, then holds %v, want %v",
							resume.rule, resume.rv, describe(diff[i:i+1]), i, describe(diff), describe(rest), held, want)
					}
				}
			}
		})
	}
}
