package client

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// logHandler is a ResourceEventHandler that records calls as
// "VERB name@rv", initial adds as "ADD* name@rv", and deletions of a final
// state not seen as "DELETE? name@rv".
type logHandler struct{ calls []string }

func (h *logHandler) OnAdd(obj any, initial bool) {
	o := obj.(*unstructured.Unstructured)
	verb := "ADD "
	if initial {
		verb = "ADD* "
	}
	h.calls = append(h.calls, verb+o.GetName()+"@"+o.GetResourceVersion())
}

func (h *logHandler) OnUpdate(oldObj, obj any) {
	old, o := oldObj.(*unstructured.Unstructured), obj.(*unstructured.Unstructured)
	h.calls = append(h.calls, "UPDATE "+o.GetName()+"@"+old.GetResourceVersion()+"->"+o.GetResourceVersion())
}

func (h *logHandler) OnDelete(obj any) {
	verb := "DELETE "
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		verb, obj = "DELETE? ", d.Obj
	}
	o := obj.(*unstructured.Unstructured)
	h.calls = append(h.calls, verb+o.GetName()+"@"+o.GetResourceVersion())
}

func (h *logHandler) OnSynced() { h.calls = append(h.calls, "SYNCED") }

func ev(t informerdv1.EventType, name, rv string) *informerdv1.Event {
	e := &informerdv1.Event{Type: t, ResourceVersion: rv}
	if name != "" {
		e.Object = fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":"ns","resourceVersion":%q}}`, name, rv)
	}
	return e
}

// evUID is ev with a uid in the object.
func evUID(t informerdv1.EventType, name, uid, rv string) *informerdv1.Event {
	e := &informerdv1.Event{Type: t, ResourceVersion: rv}
	e.Object = fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":"ns","uid":%q,"resourceVersion":%q}}`, name, uid, rv)
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
			want:       []string{"ADD* a@1", "ADD* b@2", "SYNCED", "UPDATE a@1->3", "DELETE b@4"},
			wantResume: "4",
		},
		{
			name: "duplicates and unknown deletes are dropped",
			events: []*informerdv1.Event{ev(added, "a", "1"), ev(synced, "", "1"),
				ev(added, "a", "1"), ev(modified, "a", "1"), ev(deleted, "zz", "2"), ev(bookmarkT, "", "5")},
			want:       []string{"ADD* a@1", "SYNCED"},
			wantResume: "5",
		},
		{
			name: "reset hands over only the net change",
			events: []*informerdv1.Event{ev(added, "a", "1"), ev(added, "b", "1"), ev(added, "c", "1"), ev(synced, "", "1"),
				ev(reset, "", ""), ev(added, "a", "1"), ev(added, "b", "7"), ev(added, "d", "8"), ev(synced, "", "9")},
			want:       []string{"ADD* a@1", "ADD* b@1", "ADD* c@1", "SYNCED", "DELETE? c@1", "UPDATE b@1->7", "ADD d@8"},
			wantResume: "9",
		},
		{
			// Issue 28: one rule for a snapshot's difference (snapdiff).
			name: "reset: an object created again under its name is deleted, then added",
			events: []*informerdv1.Event{evUID(added, "a", "u1", "1"), evUID(added, "b", "u2", "2"), ev(synced, "", "2"),
				ev(reset, "", ""), evUID(added, "a", "u3", "5"), evUID(added, "b", "u2", "2"), ev(synced, "", "5")},
			want:       []string{"ADD* a@1", "ADD* b@2", "SYNCED", "DELETE? a@1", "ADD a@5"},
			wantResume: "5",
		},
		{
			name:       "events without a position keep the last one",
			events:     []*informerdv1.Event{ev(synced, "", "3"), ev(modified, "a", ""), ev(modified, "b", "")},
			want:       []string{"SYNCED", "ADD a@", "ADD b@"},
			wantResume: "3",
		},
		{
			// Defect 9.6: a snapshot that is older for an object (from
			// another informer) never moves the handler back.
			name: "never back in time",
			events: []*informerdv1.Event{ev(added, "a", "5"), ev(synced, "", "5"),
				ev(reset, "", ""), ev(added, "a", "3"), ev(synced, "", "5"), ev(modified, "a", "4"), ev(modified, "a", "6")},
			want:       []string{"ADD* a@5", "SYNCED", "UPDATE a@5->6"},
			wantResume: "6",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &logHandler{}
			w := NewWatcher(nil, WatchOptions{}, h, WatcherOptions{})
			snap := map[string]*unstructured.Unstructured{} // a first stream starts with a snapshot
			for _, e := range tt.events {
				var err error
				if snap, err = w.apply(e, snap); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(h.calls, tt.want) {
				t.Errorf("handler calls = %v, want %v", h.calls, tt.want)
			}
			if w.resume != tt.wantResume {
				t.Errorf("resume = %q, want %q", w.resume, tt.wantResume)
			}
		})
	}
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
		w := NewWatcher(nil, WatchOptions{}, h, WatcherOptions{})
		var snap map[string]*unstructured.Unstructured
		for _, e := range resp.GetEvents() {
			var err error
			if snap, err = w.apply(e, snap); err != nil {
				return
			}
		}
		if n := len(w.store.ListKeys()); n > len(h.calls) {
			t.Fatalf("store holds %d objects after %d handler calls", n, len(h.calls))
		}
	})
}

// TestUndecodableObjectIsTerminal (defect 9.8): an object the client
// cannot decode (a protobuf type its scheme does not know) stops the
// Watcher with a DecodeError naming the object and what to do, instead
// of a reconnect at the same position forever.
func TestUndecodableObjectIsTerminal(t *testing.T) {
	var u runtime.Unknown
	u.APIVersion, u.Kind = "example.com/v1", "Widget"
	u.Raw = protowire.AppendTag(nil, 1, protowire.BytesType) // ObjectMeta: name 1, namespace 3
	meta := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "w1")
	meta = protowire.AppendString(protowire.AppendTag(meta, 3, protowire.BytesType), "ns")
	u.Raw = protowire.AppendBytes(u.Raw, meta)
	raw, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	w := NewWatcher(nil, WatchOptions{}, &logHandler{}, WatcherOptions{})
	_, err = w.apply(&informerdv1.Event{Type: added, Object: append([]byte("k8s\x00"), raw...), ResourceVersion: "7"}, nil)
	var de *DecodeError
	if !errors.As(err, &de) || !terminal(err) {
		t.Fatalf("apply = %v, want a terminal DecodeError", err)
	}
	for _, want := range []string{"Widget", "ns/w1", "example.com/v1", `"7"`, "WatchOptions.Scheme"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
}
