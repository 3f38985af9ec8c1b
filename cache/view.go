package cache

import (
	"encoding/json"
	"fmt"
)

// View is the projection of an object that a subscriber receives. A View's
// value is also its slot for Encoded, so each (event, view) is encoded
// once. Views that compute a projection (status, address) are added here
// and may decide that an event changes nothing for them.
type View int

// Views.
const (
	// ViewFull is the whole object, as the API server sent it (see
	// Object.Data).
	ViewFull View = iota
	// ViewMetadata is apiVersion, kind and metadata only.
	ViewMetadata
	numViews
)

var _ [MaxFrameSlots - int(numViews)]struct{} // every View has a frame slot

// Project returns o in view v, in o's encoding. For ViewFull without a
// copy, see Object.Buffers.
func (v View) Project(o *Object) ([]byte, error) {
	switch {
	case v == ViewFull:
		return o.Bytes(), nil
	case v == ViewMetadata && IsProtobuf(o.Data):
		return metadataProto(o.Bytes())
	case v == ViewMetadata:
		return metadataJSON(o.Bytes())
	}
	return nil, fmt.Errorf("unknown view %d", v)
}

// metadataProto returns the object data, encoded in protobuf, with only its metadata
// (field 1 of every built-in type).
func metadataProto(data []byte) ([]byte, error) {
	apiVersion, kind, raw, err := protoUnknown(data)
	if err != nil {
		return nil, err
	}
	var meta []byte
	err = protoFields(raw, func(fd protoField) error {
		if fd.num == 1 {
			meta = append(meta, raw[fd.start:fd.end]...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return appendProtoUnknown(nil, apiVersion, kind, meta), nil
}

// metadataJSON returns the JSON object data with only apiVersion, kind and metadata.
func metadataJSON(data []byte) ([]byte, error) {
	var top struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, err
	}
	return json.Marshal(top)
}
