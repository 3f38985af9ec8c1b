package cache

import (
	"encoding/json"
	"fmt"
)

// View is the projection of an object that a subscriber receives. A View's
// value is also its slot in Event.Frame, so each (event, view) is encoded
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

// Project returns o as JSON in view v.
func (v View) Project(o *Object) ([]byte, error) {
	switch v {
	case ViewFull:
		return o.JSON, nil
	case ViewMetadata:
		return metadataJSON(o)
	}
	return nil, fmt.Errorf("unknown view %d", v)
}

// metadataJSON returns o with only apiVersion, kind and metadata.
func metadataJSON(o *Object) ([]byte, error) {
	var top struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(o.JSON, &top); err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
	}{o.APIVersion, o.Kind, top.Metadata})
}
