package daemon

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestObjectFrame: the two-buffer encoding that shares the object's bytes
// is a WatchResponse holding the event, and proto.Marshal's size.
func TestObjectFrame(t *testing.T) {
	for _, ev := range []*informerdv1.Event{
		{Type: informerdv1.EventType_EVENT_TYPE_ADDED, Object: []byte(`{"a":1}`), ResourceVersion: "12"},
		{Type: informerdv1.EventType_EVENT_TYPE_MODIFIED, Object: []byte(strings.Repeat("x", 300)), ResourceVersion: "123456789"},
		{Type: informerdv1.EventType_EVENT_TYPE_DELETED, Object: []byte(strings.Repeat("y", 70000))},
		{Type: informerdv1.EventType_EVENT_TYPE_RESET},
		{Type: informerdv1.EventType_EVENT_TYPE_BOOKMARK, ResourceVersion: "7"},
	} {
		f := encodeObjectFrame(ev.GetType(), [][]byte{ev.GetObject()}, ev.GetResourceVersion())
		got := mem.BufferSlice(f.bufs).Materialize()
		var resp informerdv1.WatchResponse
		if err := proto.Unmarshal(got, &resp); err != nil || len(resp.GetEvents()) != 1 || !proto.Equal(resp.GetEvents()[0], ev) {
			t.Errorf("%v: %q decodes as %v (%v)", ev.GetType(), got, resp.GetEvents(), err)
		}
		if want := encodeFrame(ev); len(got) != len(want) {
			t.Errorf("%v: %d bytes, proto.Marshal writes %d", ev.GetType(), len(got), len(want))
		}
		if f.size != len(got) {
			t.Errorf("size = %d for %d bytes", f.size, len(got))
		}
		if len(ev.GetObject()) > 0 && &f.bufs[1].ReadOnlyData()[0] != &ev.GetObject()[0] {
			t.Errorf("%v: the object was copied", ev.GetType())
		}
		for i, b := range f.bufs {
			if b.Len() == 0 {
				t.Errorf("%v: buffer %d is empty", ev.GetType(), i)
			}
		}
	}
}

// encodeFrame encodes one Event as the `events` field of a WatchResponse
// with proto.Marshal: the reference encodeObjectFrame is held to, and the
// frame BenchmarkRawUnixBaseline writes.
func encodeFrame(ev *informerdv1.Event) []byte {
	body, err := proto.Marshal(ev)
	if err != nil {
		// Event has only scalar and bytes fields: Marshal cannot fail.
		panic(fmt.Sprintf("encoding event: %v", err))
	}
	b := make([]byte, 0, len(body)+1+protowire.SizeVarint(uint64(len(body))))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendBytes(b, body)
}
