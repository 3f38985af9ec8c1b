package client

import (
	"fmt"
	"slices"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// logHandler is a Handler that records calls as "VERB name@rv".
type logHandler struct{ calls []string }

func (h *logHandler) OnAdd(o *unstructured.Unstructured) {
	h.calls = append(h.calls, "ADD "+o.GetName()+"@"+o.GetResourceVersion())
}

func (h *logHandler) OnUpdate(old, o *unstructured.Unstructured) {
	h.calls = append(h.calls, "UPDATE "+o.GetName()+"@"+old.GetResourceVersion()+"->"+o.GetResourceVersion())
}

func (h *logHandler) OnDelete(o *unstructured.Unstructured) {
	h.calls = append(h.calls, "DELETE "+o.GetName()+"@"+o.GetResourceVersion())
}

func (h *logHandler) OnSynced() { h.calls = append(h.calls, "SYNCED") }

func ev(t informerdv1.EventType, name, rv string) *informerdv1.Event {
	e := &informerdv1.Event{Type: t, ResourceVersion: rv}
	if name != "" {
		e.Object = fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":"ns","resourceVersion":%q}}`, name, rv)
	}
	return e
}

const (
	added     = informerdv1.EventType_EVENT_TYPE_ADDED
	modified  = informerdv1.EventType_EVENT_TYPE_MODIFIED
	deleted   = informerdv1.EventType_EVENT_TYPE_DELETED
	bookmarkT = informerdv1.EventType_EVENT_TYPE_BOOKMARK
	synced    = informerdv1.EventType_EVENT_TYPE_SYNCED
	reset     = informerdv1.EventType_EVENT_TYPE_RESET
)

func TestWatcherApply(t *testing.T) {
	tests := []struct {
		name       string
		events     []*informerdv1.Event
		want       []string
		wantResume string
	}{
		{
			name:       "snapshot then changes",
			events:     []*informerdv1.Event{ev(added, "a", "1"), ev(added, "b", "2"), ev(synced, "", "2"), ev(modified, "a", "3"), ev(deleted, "b", "4")},
			want:       []string{"ADD a@1", "ADD b@2", "SYNCED", "UPDATE a@1->3", "DELETE b@4"},
			wantResume: "4",
		},
		{
			name: "duplicates and unknown deletes are dropped",
			events: []*informerdv1.Event{ev(added, "a", "1"), ev(synced, "", "1"),
				ev(added, "a", "1"), ev(modified, "a", "1"), ev(deleted, "zz", "2"), ev(bookmarkT, "", "5")},
			want:       []string{"ADD a@1", "SYNCED"},
			wantResume: "5",
		},
		{
			name: "reset hands over only the net change",
			events: []*informerdv1.Event{ev(added, "a", "1"), ev(added, "b", "1"), ev(added, "c", "1"), ev(synced, "", "1"),
				ev(reset, "", ""), ev(added, "a", "1"), ev(added, "b", "7"), ev(added, "d", "8"), ev(synced, "", "9")},
			want:       []string{"ADD a@1", "ADD b@1", "ADD c@1", "SYNCED", "DELETE c@1", "UPDATE b@1->7", "ADD d@8"},
			wantResume: "9",
		},
		{
			name:       "events without a position keep the last one",
			events:     []*informerdv1.Event{ev(synced, "", "3"), ev(modified, "a", ""), ev(modified, "b", "")},
			want:       []string{"SYNCED", "ADD a@", "ADD b@"},
			wantResume: "3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &logHandler{}
			w := NewWatcher(nil, WatchOptions{}, h, Backoff{})
			snap := map[string]*unstructured.Unstructured{} // a first stream starts with a snapshot
			for _, e := range tt.events {
				var err error
				if snap, err = w.apply(e, snap); err != nil {
					t.Fatal(err)
				}
			}
			// Within one snapshot the order of handler calls is a map's:
			// compare the calls between markers as sets.
			if got := normalize(h.calls); !slices.Equal(got, normalize(tt.want)) {
				t.Errorf("handler calls = %v, want %v", h.calls, tt.want)
			}
			if w.resume != tt.wantResume {
				t.Errorf("resume = %q, want %q", w.resume, tt.wantResume)
			}
		})
	}
}

// normalize sorts each run of calls between SYNCED markers.
func normalize(calls []string) []string {
	out := slices.Clone(calls)
	start := 0
	for i := 0; i <= len(out); i++ {
		if i == len(out) || out[i] == "SYNCED" {
			slices.Sort(out[start:i])
			start = i + 1
		}
	}
	return out
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// FuzzWatcherApply: whatever bytes arrive as a WatchResponse, the Watcher
// applies them or returns an error; it never panics, and its store only
// holds objects it handed to the handler.
func FuzzWatcherApply(f *testing.F) {
	for _, r := range []*informerdv1.WatchResponse{
		{Events: []*informerdv1.Event{ev(added, "a", "1"), ev(synced, "", "1"), ev(modified, "a", "2")}},
		{Events: []*informerdv1.Event{ev(reset, "", ""), ev(added, "b", "3"), ev(synced, "", "3"), ev(deleted, "b", "4")}},
		{Events: []*informerdv1.Event{{Type: added, Object: []byte(`{"kind":`)}, {Type: 99}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp := &informerdv1.WatchResponse{}
		if proto.Unmarshal(b, resp) != nil {
			return
		}
		h := &logHandler{}
		w := NewWatcher(nil, WatchOptions{}, h, Backoff{})
		var snap map[string]*unstructured.Unstructured
		for _, e := range resp.GetEvents() {
			var err error
			if snap, err = w.apply(e, snap); err != nil {
				return
			}
		}
		if len(w.store) > len(h.calls) {
			t.Fatalf("store holds %d objects after %d handler calls", len(w.store), len(h.calls))
		}
	})
}
