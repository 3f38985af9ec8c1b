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
	// ViewFull is the whole object (managedFields removed unless kept).
	ViewFull View = iota
	// ViewMetadata is apiVersion, kind and metadata only.
	ViewMetadata
	numViews
)

var _ [MaxFrameSlots - int(numViews)]struct{} // every View has a frame slot

// Project returns o in view v, in o's encoding.
func (v View) Project(o *Object) ([]byte, error) {
	switch {
	case v == ViewFull:
		return o.Data, nil
	case v == ViewMetadata && IsProtobuf(o.Data):
		return metadataProto(o)
	case v == ViewMetadata:
		return metadataJSON(o)
	}
	return nil, fmt.Errorf("unknown view %d", v)
}

// metadataProto returns o, encoded in protobuf, with only its metadata
// (field 1 of every built-in type).
func metadataProto(o *Object) ([]byte, error) {
	apiVersion, kind, raw, err := protoUnknown(o.Data)
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

// metadataJSON returns o with only apiVersion, kind and metadata.
func metadataJSON(o *Object) ([]byte, error) {
	var top struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(o.Data, &top); err != nil {
		return nil, err
	}
	return json.Marshal(top)
}
