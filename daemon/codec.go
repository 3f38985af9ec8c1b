package daemon

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// frames is a WatchResponse already encoded: each element is one
// length-delimited `events` field (tag 1) of a WatchResponse, so their
// concatenation is a valid WatchResponse. The elements are shared by every
// stream that sends them and are never copied or modified.
type frames [][]byte

// codec is the server's gRPC codec: frames go to the wire as they are, one
// buffer reference each; everything else is plain protobuf.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func (c codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(frames)
	if !ok {
		return c.proto.Marshal(v)
	}
	out := make(mem.BufferSlice, len(f))
	for i, b := range f {
		out[i] = mem.SliceBuffer(b) // Free is a no-op: the bytes stay shared
	}
	return out, nil
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// encodeFrame encodes one Event as the `events` field of a WatchResponse.
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
