package client

import (
	"context"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// NewDynamicClient returns a dynamic.Interface whose List, Watch and Get
// are served by the daemon, so that dynamicinformer and cli-utils'
// DefaultStatusWatcher run against it unmodified. Writes go to writer; if
// writer is nil they fail with 405 MethodNotAllowed naming the verb.
//
// List and Watch selectors become the daemon subscription's selectors (a
// field selector is evaluated by the API server, in a Source of its own).
// While the daemon is unreachable (a restart), List and Watch wait for it
// until their context ends, as the ListerWatcher's do, so that informers
// over this client come back as soon as it serves; Get fails at once.
// Get reads one object from the daemon's store (its informer of the
// resource keeps running, lingering, for a while after).
func NewDynamicClient(c *Client, clientName string, writer dynamic.Interface) dynamic.Interface {
	return &dynamicClient{c: c, name: clientName, writer: writer}
}

type dynamicClient struct {
	c      *Client
	name   string
	writer dynamic.Interface
}

var _ dynamic.Interface = (*dynamicClient)(nil)

func (d *dynamicClient) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return &dynamicResource{d: d, gvr: gvr}
}

type dynamicResource struct {
	d         *dynamicClient
	gvr       schema.GroupVersionResource
	namespace string
}

var _ dynamic.NamespaceableResourceInterface = (*dynamicResource)(nil)

func (r *dynamicResource) Namespace(ns string) dynamic.ResourceInterface {
	return &dynamicResource{d: r.d, gvr: r.gvr, namespace: ns}
}

func (r *dynamicResource) listWatch(o metav1.ListOptions) (*listWatch, metav1.ListOptions) {
	lw := newListWatch(r.d.c, WatchOptions{
		Resource: r.gvr, Namespace: r.namespace, ClientName: r.d.name,
		LabelSelector: o.LabelSelector, FieldSelector: o.FieldSelector,
	})
	o.LabelSelector, o.FieldSelector = "", ""
	return lw, o
}

func (r *dynamicResource) List(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	lw, o := r.listWatch(o)
	obj, err := lw.ListWithContext(ctx, o)
	if err != nil {
		return nil, err
	}
	return obj.(*unstructured.UnstructuredList), nil
}

func (r *dynamicResource) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	lw, o := r.listWatch(o)
	return lw.WatchWithContext(ctx, o)
}

// Get reads one object from the daemon's store (the Get RPC), in O(log n).
// A GetOptions.ResourceVersion other than "" and "0" is a NotOlderThan.
func (r *dynamicResource) Get(ctx context.Context, name string, o metav1.GetOptions, subresources ...string) (*unstructured.Unstructured, error) {
	if len(subresources) > 0 {
		return nil, apierrors.NewMethodNotSupported(r.gvr.GroupResource(), "get of subresource "+subresources[0]+" through informerd")
	}
	req := &informerdv1.GetRequest{
		Resource:  &informerdv1.GroupVersionResource{Group: r.gvr.Group, Version: r.gvr.Version, Resource: r.gvr.Resource},
		Namespace: r.namespace, Name: name, ClientName: r.d.name,
	}
	if o.ResourceVersion != "0" {
		req.NotOlderThanResourceVersion = o.ResourceVersion
	}
	resp, err := r.d.c.api.Get(ctx, req)
	if objectNotFound(err) {
		return nil, apierrors.NewNotFound(r.gvr.GroupResource(), name)
	}
	if err != nil {
		return nil, toAPIError(r.d.c.explain(err))
	}
	return decode(resp.GetObject(), "")
}

// objectNotFound reports whether err is the daemon saying that an object
// does not exist, as opposed to its resource.
func objectNotFound(err error) bool { return hasReason(err, informerdv1.ReasonObjectNotFound) }

// hasReason reports whether err carries the daemon's ErrorInfo reason.
func hasReason(err error, reason string) bool {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == informerdv1.ErrorDomain && info.GetReason() == reason {
			return true
		}
	}
	return false
}

// w returns the writer for the verb, or an error saying there is none.
func (r *dynamicResource) w(verb string) (dynamic.ResourceInterface, error) {
	if r.d.writer == nil {
		return nil, apierrors.NewMethodNotSupported(r.gvr.GroupResource(),
			fmt.Sprintf("%s (informerd serves reads only; give NewDynamicClient a writer)", verb))
	}
	if r.namespace == "" {
		return r.d.writer.Resource(r.gvr), nil
	}
	return r.d.writer.Resource(r.gvr).Namespace(r.namespace), nil
}

func (r *dynamicResource) Create(ctx context.Context, obj *unstructured.Unstructured, o metav1.CreateOptions, sub ...string) (*unstructured.Unstructured, error) {
	w, err := r.w("create")
	if err != nil {
		return nil, err
	}
	return w.Create(ctx, obj, o, sub...)
}

func (r *dynamicResource) Update(ctx context.Context, obj *unstructured.Unstructured, o metav1.UpdateOptions, sub ...string) (*unstructured.Unstructured, error) {
	w, err := r.w("update")
	if err != nil {
		return nil, err
	}
	return w.Update(ctx, obj, o, sub...)
}

func (r *dynamicResource) UpdateStatus(ctx context.Context, obj *unstructured.Unstructured, o metav1.UpdateOptions) (*unstructured.Unstructured, error) {
	w, err := r.w("update status")
	if err != nil {
		return nil, err
	}
	return w.UpdateStatus(ctx, obj, o)
}

func (r *dynamicResource) Delete(ctx context.Context, name string, o metav1.DeleteOptions, sub ...string) error {
	w, err := r.w("delete")
	if err != nil {
		return err
	}
	return w.Delete(ctx, name, o, sub...)
}

func (r *dynamicResource) DeleteCollection(ctx context.Context, o metav1.DeleteOptions, lo metav1.ListOptions) error {
	w, err := r.w("delete collection")
	if err != nil {
		return err
	}
	return w.DeleteCollection(ctx, o, lo)
}

func (r *dynamicResource) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, o metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error) {
	w, err := r.w("patch")
	if err != nil {
		return nil, err
	}
	return w.Patch(ctx, name, pt, data, o, sub...)
}

func (r *dynamicResource) Apply(ctx context.Context, name string, obj *unstructured.Unstructured, o metav1.ApplyOptions, sub ...string) (*unstructured.Unstructured, error) {
	w, err := r.w("apply")
	if err != nil {
		return nil, err
	}
	return w.Apply(ctx, name, obj, o, sub...)
}

func (r *dynamicResource) ApplyStatus(ctx context.Context, name string, obj *unstructured.Unstructured, o metav1.ApplyOptions) (*unstructured.Unstructured, error) {
	w, err := r.w("apply status")
	if err != nil {
		return nil, err
	}
	return w.ApplyStatus(ctx, name, obj, o)
}
