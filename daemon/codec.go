package daemon

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// frame is one event encoded as the `events` field (tag 1) of a
// WatchResponse, as gRPC buffers made once and shared by every stream that
// sends the event. A buffer may be the cache object's bytes themselves.
// The buffers are mem.SliceBuffers, whose Free does nothing: nothing is
// ever copied, recycled or modified.
type frame struct {
	bufs []mem.Buffer
	size int
}

// frames is a WatchResponse already encoded: its buffers, back to back,
// are a sequence of frames.
type frames mem.BufferSlice

// codec is the server's gRPC codec: frames go to the wire as they are;
// everything else is plain protobuf.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func (c codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(frames); ok {
		return mem.BufferSlice(f), nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// encodeObjectFrame encodes an Event that carries obj as the `events` field
// of a WatchResponse in two buffers, the second obj itself, so that the
// object is never copied. The fields are written type, resource_version,
// object: protobuf parsers accept fields in any order, and the object last
// saves a third buffer per event.
func encodeObjectFrame(t informerdv1.EventType, obj []byte, rv string) frame {
	var ev []byte // type (1), resource_version (3) and the head of object (2)
	if t != 0 {
		ev = protowire.AppendTag(ev, 1, protowire.VarintType)
		ev = protowire.AppendVarint(ev, uint64(t))
	}
	if rv != "" {
		ev = protowire.AppendTag(ev, 3, protowire.BytesType)
		ev = protowire.AppendString(ev, rv)
	}
	if len(obj) > 0 {
		ev = protowire.AppendTag(ev, 2, protowire.BytesType)
		ev = protowire.AppendVarint(ev, uint64(len(obj)))
	}
	size := len(ev) + len(obj)
	head := make([]byte, 0, 1+protowire.SizeVarint(uint64(size))+len(ev))
	head = protowire.AppendTag(head, 1, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(size))
	head = append(head, ev...)
	f := frame{bufs: []mem.Buffer{mem.SliceBuffer(head)}, size: len(head) + len(obj)}
	if len(obj) > 0 {
		f.bufs = append(f.bufs, mem.SliceBuffer(obj))
	}
	return f
}
