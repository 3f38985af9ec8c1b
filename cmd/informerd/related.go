package main

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/address"
)

// relatedKinds is the repeatable -address-related flag.
type relatedKinds []address.RelatedKind

func (r *relatedKinds) String() string {
	if r == nil {
		return ""
	}
	var out []string
	for _, k := range *r {
		s := fmt.Sprintf("%s.%s", k.Resource.Resource, k.Resource.Version)
		if k.Resource.Group != "" {
			s += "." + k.Resource.Group
		}
		s += ",selector=" + k.SelectorPath
		if k.PortPath != "" {
			s += ",port=" + k.PortPath
		}
		for _, f := range k.Fields {
			s += ",field=" + f
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// Set parses RESOURCE.VERSION[.GROUP],selector=PATH[,port=PATH][,field=PATH]...
func (r *relatedKinds) Set(v string) error {
	parts := strings.Split(v, ",")
	res := strings.SplitN(parts[0], ".", 3)
	if len(res) < 2 || res[0] == "" || res[1] == "" {
		return fmt.Errorf("%q does not start with RESOURCE.VERSION[.GROUP], for example servers.v1beta3.policy.linkerd.io", parts[0])
	}
	k := address.RelatedKind{Resource: schema.GroupVersionResource{Resource: res[0], Version: res[1]}}
	if len(res) == 3 {
		k.Resource.Group = res[2]
	}
	for _, p := range parts[1:] {
		key, val, ok := strings.Cut(p, "=")
		switch {
		case !ok || val == "":
			return fmt.Errorf("%q: want selector=PATH, port=PATH or field=PATH", p)
		case key == "selector":
			k.SelectorPath = val
		case key == "port":
			k.PortPath = val
		case key == "field":
			k.Fields = append(k.Fields, val)
		default:
			return fmt.Errorf("%q: unknown key %q, want selector, port or field", p, key)
		}
	}
	if k.SelectorPath == "" {
		return errors.New("selector=PATH is required: the field path of the objects' pod label selector")
	}
	*r = append(*r, k)
	return nil
}
