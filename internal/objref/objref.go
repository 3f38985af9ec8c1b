// Package objref checks the object references of a status request, for
// the daemon (which refuses a request that names an invalid one) and the
// client (which leaves invalid ones out of its requests, as cli-utils'
// StatusWatcher watches them without ever finding them).
package objref

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/informerd/informerd/internal/quote"
)

// MaxName bounds an object's name: Kubernetes names are at most 253 bytes.
const MaxName = 253

// Invalid returns what is wrong with a reference to an object, or "" if
// nothing is: what the API server would refuse in the object's kind,
// group, namespace or name.
func Invalid(group, kind, namespace, name string) string {
	switch {
	case kind == "":
		return `kind is required, for example "Deployment"`
	case len(validation.IsDNS1035Label(strings.ToLower(kind))) > 0:
		return fmt.Sprintf("kind %s: %s", quote.String(kind), validation.IsDNS1035Label(strings.ToLower(kind))[0])
	case group != "" && len(validation.IsDNS1123Subdomain(group)) > 0:
		return fmt.Sprintf("group %s: %s", quote.String(group), validation.IsDNS1123Subdomain(group)[0])
	case namespace != "" && len(validation.IsDNS1123Label(namespace)) > 0:
		return fmt.Sprintf("namespace %s: %s", quote.String(namespace), validation.IsDNS1123Label(namespace)[0])
	case name == "":
		return "name is required"
	case len(name) > MaxName:
		return fmt.Sprintf("name %s is %d bytes long, at most %d are allowed", quote.String(name), len(name), MaxName)
	case len(content.IsPathSegmentName(name)) > 0:
		return fmt.Sprintf("name %s: %s", quote.String(name), content.IsPathSegmentName(name)[0])
	}
	return ""
}
