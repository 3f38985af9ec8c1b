package daemon

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/objref"
	"github.com/informerd/informerd/internal/quote"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	statusengine "github.com/informerd/informerd/status"
)

// maxClientName bounds WatchRequest.client_name.
const maxClientName = 128

// maxName bounds GetRequest.name.
const maxName = objref.MaxName

// maxResourceVersion bounds resourceVersions a client sends: etcd's are
// at most 20 digits; aggregated APIs may use other strings.
const maxResourceVersion = 256

// invalid returns an INVALID_ARGUMENT status.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// validateResource checks how a request names its resource and namespace.
func validateResource(r *informerdv1.GroupVersionResource, kind, namespace string) error {
	switch {
	case kind != "" && r.GetResource() != "":
		return invalid("kind %s and resource.resource %s are both set: name the resource one way", quote.String(kind), quote.String(r.GetResource()))
	case kind != "":
		if errs := validation.IsDNS1035Label(strings.ToLower(kind)); len(errs) > 0 {
			return invalid("kind %s: %s", quote.String(kind), errs[0])
		}
	case r.GetResource() == "":
		return invalid("resource: resource (or kind) is required, for example resource %q", "configmaps")
	default:
		if errs := validation.IsDNS1123Subdomain(r.GetResource()); len(errs) > 0 {
			return invalid("resource.resource %s: %s (use the lower-case plural, for example %q)", quote.String(r.GetResource()), errs[0], "deployments")
		}
	}
	if r.GetGroup() != "" {
		if errs := validation.IsDNS1123Subdomain(r.GetGroup()); len(errs) > 0 {
			return invalid("resource.group %s: %s", quote.String(r.GetGroup()), errs[0])
		}
	}
	if v := r.GetVersion(); v != "" {
		if errs := validation.IsDNS1035Label(v); len(errs) > 0 {
			return invalid("resource.version %s: %s", quote.String(v), errs[0])
		}
	}
	if namespace != "" {
		if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
			return invalid("namespace %s: %s", quote.String(namespace), errs[0])
		}
	}
	return nil
}

// validateFormat reads a request's view and encoding.
func validateFormat(v informerdv1.View, e informerdv1.Encoding) (view cache.View, protobuf bool, err error) {
	switch v {
	case informerdv1.View_VIEW_UNSPECIFIED, informerdv1.View_VIEW_FULL:
		view = cache.ViewFull
	case informerdv1.View_VIEW_METADATA:
		view = cache.ViewMetadata
	default:
		return 0, false, invalid("view %d is not a known View", v)
	}
	switch e {
	case informerdv1.Encoding_ENCODING_UNSPECIFIED, informerdv1.Encoding_ENCODING_JSON:
	case informerdv1.Encoding_ENCODING_PROTOBUF:
		protobuf = true
	default:
		return 0, false, invalid("encoding %d is not a known Encoding", e)
	}
	return view, protobuf, nil
}

// validateResourceVersion checks a resourceVersion a client sends.
func validateResourceVersion(field, rv string) error {
	if len(rv) > maxResourceVersion {
		return invalid("%s is %d bytes long, at most %d are allowed: send a resource_version the daemon sent", field, len(rv), maxResourceVersion)
	}
	return nil
}

// holderName checks a request's client_name.
func holderName(name string) (string, error) {
	if len(name) > maxClientName {
		return "", invalid("client_name is %d bytes long, at most %d are allowed", len(name), maxClientName)
	}
	if name == "" {
		name = "unnamed"
	}
	return name, nil
}

// validateWatch turns a WatchRequest into a cache.Request, or returns an
// INVALID_ARGUMENT status naming the field and what is wrong with it, or an
// error wrapping errTooLarge for a selector longer than maxSelector bytes.
// Messages quote at most a short prefix of what the client sent.
//
// It rewrites req's selectors to their canonical spellings (the
// apimachinery parsers' String), so that everything after validation (the
// accesses authorized and the caches of their decisions, the cache's
// filter and informer key) sees one spelling: "a = b" and "a=b" are one
// access and cost one review.
func validateWatch(req *informerdv1.WatchRequest, maxSelector int) (cache.Request, cache.View, error) {
	for _, f := range []struct{ name, value string }{{"label_selector", req.GetLabelSelector()}, {"field_selector", req.GetFieldSelector()}} {
		if len(f.value) > maxSelector {
			return cache.Request{}, 0, fmt.Errorf("%w: %s is %d bytes, over the limit of %d (max-selector-bytes)", errTooLarge, f.name, len(f.value), maxSelector)
		}
	}
	r, kind := req.GetResource(), req.GetKind()
	if err := validateResource(r, kind, req.GetNamespace()); err != nil {
		return cache.Request{}, 0, err
	}
	invalid := func(format string, args ...any) (cache.Request, cache.View, error) {
		return cache.Request{}, 0, invalid(format, args...)
	}
	sel, err := labels.Parse(req.GetLabelSelector())
	if err != nil {
		return invalid("label_selector %s: %s", quote.String(req.GetLabelSelector()), quote.Message(err.Error(), req.GetLabelSelector()))
	}
	fieldSel, err := fields.ParseSelector(req.GetFieldSelector())
	if err != nil {
		return invalid("field_selector %s: %s", quote.String(req.GetFieldSelector()), quote.Message(err.Error(), req.GetFieldSelector()))
	}
	req.LabelSelector, req.FieldSelector = sel.String(), fieldSel.String()
	if err := validateResourceVersion("resume_resource_version", req.GetResumeResourceVersion()); err != nil {
		return cache.Request{}, 0, err
	}
	if err := validateResourceVersion("not_older_than_resource_version", req.GetNotOlderThanResourceVersion()); err != nil {
		return cache.Request{}, 0, err
	}
	view, protobuf, err := validateFormat(req.GetView(), req.GetEncoding())
	if err != nil {
		return cache.Request{}, 0, err
	}
	name, err := holderName(req.GetClientName())
	if err != nil {
		return cache.Request{}, 0, err
	}
	return cache.Request{
		GVR:             schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()},
		Kind:            kind,
		Namespace:       req.GetNamespace(),
		Filter:          cache.Filter{Labels: sel},
		FieldSelector:   req.GetFieldSelector(),
		Resume:          req.GetResumeResourceVersion(),
		NotOlderThan:    req.GetNotOlderThanResourceVersion(),
		WaitForResource: req.GetWaitForResource(),
		Holder:          name,
		Protobuf:        protobuf,

		ExistingInformerOnly: req.GetExistingInformerOnly(),
	}, view, nil
}

// validateGet turns a GetRequest into a cache.Request and the object's
// name, or returns an INVALID_ARGUMENT status.
func validateGet(req *informerdv1.GetRequest) (cache.Request, string, cache.View, error) {
	r := req.GetResource()
	if err := validateResource(r, req.GetKind(), req.GetNamespace()); err != nil {
		return cache.Request{}, "", 0, err
	}
	name := req.GetName()
	if name == "" {
		return cache.Request{}, "", 0, invalid("name is required")
	}
	if len(name) > maxName {
		return cache.Request{}, "", 0, invalid("name is %d bytes long, at most %d are allowed", len(name), maxName)
	}
	if errs := content.IsPathSegmentName(name); len(errs) > 0 {
		return cache.Request{}, "", 0, invalid("name %s: %s", quote.String(name), errs[0])
	}
	if err := validateResourceVersion("not_older_than_resource_version", req.GetNotOlderThanResourceVersion()); err != nil {
		return cache.Request{}, "", 0, err
	}
	view, protobuf, err := validateFormat(req.GetView(), req.GetEncoding())
	if err != nil {
		return cache.Request{}, "", 0, err
	}
	holder, err := holderName(req.GetClientName())
	if err != nil {
		return cache.Request{}, "", 0, err
	}
	return cache.Request{
		GVR:          schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()},
		Kind:         req.GetKind(),
		Namespace:    req.GetNamespace(),
		NotOlderThan: req.GetNotOlderThanResourceVersion(),
		Holder:       holder,
		Protobuf:     protobuf,
	}, name, view, nil
}

// validateWatchStatus turns a WatchStatusRequest into a status.Request, or
// returns an INVALID_ARGUMENT status naming the object and what is wrong.
func validateWatchStatus(req *informerdv1.WatchStatusRequest) (statusengine.Request, error) {
	objs := req.GetObjects()
	if len(objs) > informerdv1.MaxStatusObjects {
		return statusengine.Request{}, tooManyObjects(len(objs))
	}
	ids := make(object.ObjMetadataSet, 0, len(objs))
	for i, o := range objs {
		if err := objref.Invalid(o.GetGroup(), o.GetKind(), o.GetNamespace(), o.GetName()); err != "" {
			return statusengine.Request{}, invalid("objects[%d]: %s", i, err)
		}
		ids = append(ids, object.ObjMetadata{
			GroupKind: schema.GroupKind{Group: o.GetGroup(), Kind: o.GetKind()}, Namespace: o.GetNamespace(), Name: o.GetName(),
		})
	}
	var strategy watcher.RESTScopeStrategy
	switch req.GetScopeStrategy() {
	case informerdv1.ScopeStrategy_SCOPE_STRATEGY_UNSPECIFIED, informerdv1.ScopeStrategy_SCOPE_STRATEGY_AUTOMATIC:
		strategy = watcher.RESTScopeAutomatic
	case informerdv1.ScopeStrategy_SCOPE_STRATEGY_ROOT:
		strategy = watcher.RESTScopeRoot
	case informerdv1.ScopeStrategy_SCOPE_STRATEGY_NAMESPACE:
		strategy = watcher.RESTScopeNamespace
	default:
		return statusengine.Request{}, invalid("scope_strategy %d is not a known ScopeStrategy", req.GetScopeStrategy())
	}
	holder, err := holderName(req.GetClientName())
	if err != nil {
		return statusengine.Request{}, err
	}
	return statusengine.Request{IDs: ids, Strategy: strategy, Holder: holder}, nil
}
