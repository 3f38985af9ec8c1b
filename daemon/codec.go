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

// encodeObjectFrame encodes an Event that carries the object obj, the
// concatenation of its buffers, as the `events` field of a WatchResponse:
// a head and obj's buffers themselves, so that the object is never copied.
// The fields are written type, resource_version, object: protobuf parsers
// accept fields in any order, and the object last saves a buffer per
// event.
func encodeObjectFrame(t informerdv1.EventType, obj [][]byte, rv string) frame {
	n := 0
	for _, b := range obj {
		n += len(b)
	}
	var ev []byte // type (1), resource_version (3) and the head of object (2)
	if t != 0 {
		ev = protowire.AppendTag(ev, 1, protowire.VarintType)
		ev = protowire.AppendVarint(ev, uint64(t))
	}
	if rv != "" {
		ev = protowire.AppendTag(ev, 3, protowire.BytesType)
		ev = protowire.AppendString(ev, rv)
	}
	if n > 0 {
		ev = protowire.AppendTag(ev, 2, protowire.BytesType)
		ev = protowire.AppendVarint(ev, uint64(n))
	}
	size := len(ev) + n
	head := make([]byte, 0, 1+protowire.SizeVarint(uint64(size))+len(ev))
	head = protowire.AppendTag(head, 1, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(size))
	head = append(head, ev...)
	f := frame{bufs: make([]mem.Buffer, 0, 1+len(obj)), size: len(head) + n}
	f.bufs = append(f.bufs, mem.SliceBuffer(head))
	for _, b := range obj {
		if len(b) > 0 {
			f.bufs = append(f.bufs, mem.SliceBuffer(b))
		}
	}
	return f
}
