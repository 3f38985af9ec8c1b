// Package fieldsel reads what the daemon and WrapConfig need to know of
// a field selector without the API server: whether it selects one object.
package fieldsel

import (
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/selection"
)

// OneObject reports whether fieldSelector selects at most one object of a
// request in namespace ("" for all namespaces or a cluster-scoped
// resource): metadata.name=NAME, with at most metadata.namespace=namespace
// beside it, as kubectl's watch of one object and its describe of one
// send. It returns NAME. Such a selector can be evaluated on any informer
// of the resource that holds the namespace.
func OneObject(fieldSelector, namespace string) (string, bool) {
	if fieldSelector == "" {
		return "", false
	}
	sel, err := fields.ParseSelector(fieldSelector)
	if err != nil {
		return "", false
	}
	name := ""
	for _, r := range sel.Requirements() {
		if r.Operator != selection.Equals && r.Operator != selection.DoubleEquals {
			return "", false
		}
		switch {
		case r.Field == "metadata.name" && name == "":
			name = r.Value
		case r.Field == "metadata.namespace" && r.Value == namespace:
		default:
			return "", false
		}
	}
	return name, name != ""
}
