package cache

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/internal/quote"
)

// Key identifies one upstream list+watch.
type Key struct {
	GVR schema.GroupVersionResource
	// Namespace is "" for all namespaces or a cluster-scoped resource.
	Namespace string
	// FieldSelector is passed to the API server as is.
	FieldSelector string
	// Protobuf watches in the API server's protobuf encoding (built-in
	// types only) and keeps objects in it.
	Protobuf bool
}

func (k Key) String() string {
	s := k.GVR.Resource
	if k.GVR.Group != "" {
		s += "." + k.GVR.Group
	}
	s += "/" + k.GVR.Version
	if k.Namespace != "" {
		s += " in " + k.Namespace
	}
	switch {
	case len(k.FieldSelector) > quote.Max: // a client's input: errors and logs repeat it short
		s += " fields " + quote.String(k.FieldSelector)
	case k.FieldSelector != "":
		s += " fields " + k.FieldSelector
	}
	if k.Protobuf {
		s += " (protobuf)"
	}
	return s
}
