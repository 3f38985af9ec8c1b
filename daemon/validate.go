package daemon

import (
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// maxClientName bounds WatchRequest.client_name.
const maxClientName = 128

// validateWatch turns a WatchRequest into a cache.Request, or returns an
// INVALID_ARGUMENT status naming the field and what is wrong with it.
func validateWatch(req *informerdv1.WatchRequest) (cache.Request, cache.View, error) {
	invalid := func(format string, args ...any) (cache.Request, cache.View, error) {
		return cache.Request{}, 0, status.Errorf(codes.InvalidArgument, format, args...)
	}
	r, kind := req.GetResource(), req.GetKind()
	switch {
	case kind != "" && r.GetResource() != "":
		return invalid("kind %q and resource.resource %q are both set: name the resource one way", kind, r.GetResource())
	case kind != "":
		if errs := validation.IsDNS1035Label(strings.ToLower(kind)); len(errs) > 0 {
			return invalid("kind %q: %s", kind, errs[0])
		}
	case r.GetVersion() == "" || r.GetResource() == "":
		return invalid("resource: version and resource (or kind) are required, for example version %q, resource %q", "v1", "configmaps")
	default:
		if errs := validation.IsDNS1123Subdomain(r.GetResource()); len(errs) > 0 {
			return invalid("resource.resource %q: %s (use the lower-case plural, for example %q)", r.GetResource(), errs[0], "deployments")
		}
	}
	if r.GetGroup() != "" {
		if errs := validation.IsDNS1123Subdomain(r.GetGroup()); len(errs) > 0 {
			return invalid("resource.group %q: %s", r.GetGroup(), errs[0])
		}
	}
	if v := r.GetVersion(); v != "" {
		if errs := validation.IsDNS1035Label(v); len(errs) > 0 {
			return invalid("resource.version %q: %s", v, errs[0])
		}
	}
	if ns := req.GetNamespace(); ns != "" {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return invalid("namespace %q: %s", ns, errs[0])
		}
	}
	sel, err := labels.Parse(req.GetLabelSelector())
	if err != nil {
		return invalid("label_selector %q: %v", req.GetLabelSelector(), err)
	}
	fieldSel, err := fields.ParseSelector(req.GetFieldSelector())
	if err != nil {
		return invalid("field_selector %q: %v", req.GetFieldSelector(), err)
	}
	if rv := req.GetResumeResourceVersion(); rv != "" {
		if _, err := strconv.ParseUint(rv, 10, 64); err != nil {
			return invalid("resume_resource_version %q is not a resourceVersion informerd sent: resume from the resource_version of an event, or leave it empty for a snapshot", rv)
		}
	}
	var view cache.View
	switch req.GetView() {
	case informerdv1.View_VIEW_UNSPECIFIED, informerdv1.View_VIEW_FULL:
		view = cache.ViewFull
	case informerdv1.View_VIEW_METADATA:
		view = cache.ViewMetadata
	default:
		return invalid("view %d is not a known View", req.GetView())
	}
	var protobuf bool
	switch req.GetEncoding() {
	case informerdv1.Encoding_ENCODING_UNSPECIFIED, informerdv1.Encoding_ENCODING_JSON:
	case informerdv1.Encoding_ENCODING_PROTOBUF:
		protobuf = true
	default:
		return invalid("encoding %d is not a known Encoding", req.GetEncoding())
	}
	name := req.GetClientName()
	if len(name) > maxClientName {
		return invalid("client_name is %d bytes long, at most %d are allowed", len(name), maxClientName)
	}
	if name == "" {
		name = "unnamed"
	}
	return cache.Request{
		GVR:             schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()},
		Kind:            kind,
		Namespace:       req.GetNamespace(),
		Filter:          cache.Filter{Labels: sel},
		FieldSelector:   fieldSel.String(),
		Resume:          req.GetResumeResourceVersion(),
		WaitForResource: req.GetWaitForResource(),
		Holder:          name,
		Protobuf:        protobuf,
	}, view, nil
}
