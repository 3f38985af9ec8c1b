package status

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/engine"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/statusreaders"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/object"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/informerd/informerd/cache"
)

var (
	podGK        = schema.GroupKind{Kind: "Pod"}
	replicaSetGK = schema.GroupKind{Group: "apps", Kind: "ReplicaSet"}
	daemonSetGK  = schema.GroupKind{Group: "apps", Kind: "DaemonSet"}
	jobGK        = schema.GroupKind{Group: "batch", Kind: "Job"}
)

// generated lists, per kind, the kinds of the resources generated from its
// objects that newReader's status readers list: the Engine holds a feed of
// each, in the object's namespace.
var generated = map[schema.GroupKind][]schema.GroupKind{
	{Group: "apps", Kind: "Deployment"}:  {replicaSetGK, podGK},
	replicaSetGK:                         {podGK},
	{Group: "apps", Kind: "StatefulSet"}: {podGK},
	daemonSetGK:                          {podGK},
	jobGK:                                {podGK},
}

// listedKinds are the kinds in generated: the only ones the readers list.
var listedKinds = func() map[schema.GroupKind]bool {
	out := map[schema.GroupKind]bool{}
	for _, gks := range generated {
		for _, gk := range gks {
			out[gk] = true
		}
	}
	return out
}()

// newReader returns cli-utils' default status readers plus one that lists
// the Pods of DaemonSets and Jobs as their generated resources. The
// readers of kinds that generate Pods read each generated Pod's status
// through podStatuses, which computes it once per resourceVersion.
func newReader() engine.StatusReader {
	// The readers map only the generated kinds they list, and only to a
	// GroupVersionKind: a static mapper of those kinds is all they need.
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{{Version: "v1"}, {Group: "apps", Version: "v1"}})
	mapper.Add(podGK.WithVersion("v1"), meta.RESTScopeNamespace)
	mapper.Add(replicaSetGK.WithVersion("v1"), meta.RESTScopeNamespace)
	pods := podStatuses{generic: statusreaders.NewGenericStatusReader(mapper, kstatus.Compute)}
	rs := statusreaders.NewReplicaSetStatusReader(mapper, pods)
	// NewStatusReader tries these first, then its own defaults (which
	// read the Pods and other objects that are asked about themselves).
	return statusreaders.NewStatusReader(mapper, statusreaders.NewDeploymentResourceReader(mapper, rs),
		statusreaders.NewStatefulSetResourceReader(mapper, pods), rs, podsReader{pods: pods})
}

// podStatuses reads the status of a generated Pod with cli-utils' generic
// reader (kstatus), once per resourceVersion of the Pod: the statuses are
// kept in the Pods' feed (feed.podStatuses) until the Pod is deleted or
// the feed starts over, so that a change to one of a Deployment's R Pods
// costs one Pod's decoding and kstatus, not R of them. A Pod clusterReader
// did not list (which readers never pass) is read as it is.
type podStatuses struct{ generic engine.StatusReader }

// podStatus is a generated Pod's status at one resourceVersion.
type podStatus struct {
	resourceVersion string
	// rs is shared, never modified. Its Resource is nil, except for an
	// unschedulable Pod: unschedulable looks at it.
	rs *event.ResourceStatus
}

func (podStatuses) Supports(gk schema.GroupKind) bool { return gk == podGK }

func (podStatuses) ReadStatus(context.Context, engine.ClusterReader, object.ObjMetadata) (*event.ResourceStatus, error) {
	return nil, errors.New("informerd computes status from objects only")
}

func (p podStatuses) ReadStatusForObject(ctx context.Context, reader engine.ClusterReader, obj *unstructured.Unstructured) (*event.ResourceStatus, error) {
	r, _ := reader.(*clusterReader)
	var o *cache.Object
	if r != nil && r.pods != nil {
		o = r.listed[obj.GetName()]
	}
	if o == nil {
		return p.generic.ReadStatusForObject(ctx, reader, obj)
	}
	if c := r.pods.podStatuses[o.Name]; c != nil && c.resourceVersion == o.ResourceVersion {
		return c.rs, nil
	}
	u, err := decode(o.Data)
	if err != nil {
		return &event.ResourceStatus{Identifier: object.UnstructuredToObjMetadata(obj), Status: kstatus.UnknownStatus, Error: err}, nil
	}
	rs, err := p.generic.ReadStatusForObject(ctx, reader, u)
	if err != nil {
		return nil, err
	}
	if !podUnschedulable(u) {
		c := *rs
		c.Resource = nil
		rs = &c
	}
	if r.pods.podStatuses == nil {
		r.pods.podStatuses = map[string]*podStatus{}
	}
	r.pods.podStatuses[o.Name] = &podStatus{resourceVersion: o.ResourceVersion, rs: rs}
	return rs, nil
}

// podsReader computes the status of a DaemonSet or a Job with kstatus, as
// cli-utils' generic reader does, and adds the Pods its selector matches
// as its generated resources.
type podsReader struct{ pods engine.StatusReader }

var _ engine.StatusReader = podsReader{}

func (podsReader) Supports(gk schema.GroupKind) bool { return gk == daemonSetGK || gk == jobGK }

func (podsReader) ReadStatus(context.Context, engine.ClusterReader, object.ObjMetadata) (*event.ResourceStatus, error) {
	return nil, errors.New("informerd computes status from objects only")
}

func (r podsReader) ReadStatusForObject(ctx context.Context, reader engine.ClusterReader, obj *unstructured.Unstructured) (*event.ResourceStatus, error) {
	id := object.UnstructuredToObjMetadata(obj)
	unknown := func(err error) (*event.ResourceStatus, error) {
		return &event.ResourceStatus{Identifier: id, Status: kstatus.UnknownStatus, Resource: obj, Error: err}, nil
	}
	res, err := kstatus.Compute(obj)
	if err != nil {
		return unknown(err)
	}
	var ls metav1.LabelSelector
	m, _, err := unstructured.NestedMap(obj.Object, "spec", "selector")
	if err == nil {
		err = runtime.DefaultUnstructuredConverter.FromUnstructured(m, &ls)
	}
	sel, err2 := metav1.LabelSelectorAsSelector(&ls)
	if err = errors.Join(err, err2); err != nil {
		return unknown(fmt.Errorf("spec.selector: %w", err))
	}
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(podGK.WithVersion("v1"))
	if err := reader.ListNamespaceScoped(ctx, &list, obj.GetNamespace(), sel); err != nil {
		return unknown(err)
	}
	var gen event.ResourceStatuses
	for i := range list.Items {
		rs, err := r.pods.ReadStatusForObject(ctx, reader, &list.Items[i])
		if err != nil {
			return nil, err
		}
		gen = append(gen, rs)
	}
	sort.Sort(gen)
	return &event.ResourceStatus{Identifier: id, Status: res.Status, Resource: obj, Message: res.Message, GeneratedResources: gen}, nil
}

// clusterReader serves the status readers' lists of generated resources
// from one target's feeds (their objects as the feeds' events left them,
// as an informer's cache would), and records each list so that a change to
// a listed object (or to one that starts matching) recomputes the target.
type clusterReader struct {
	t    *target
	deps []dep
	// pods is the target's feed of generated Pods once a list read it,
	// and listed the Pods the lists returned, by name: podStatuses reads
	// their statuses from there.
	pods   *feed
	listed map[string]*cache.Object
	// objects collects the bytes of every object listed, by identifier.
	objects map[object.ObjMetadata][]byte
}

// dep is one list a target's status was computed from.
type dep struct {
	feed  *feed
	sel   labels.Selector
	names map[string]struct{} // the objects it returned
	// by is the equality requirement of sel the list visited the objects
	// carrying, and feed.listers holds the dep under; indexed is false if
	// sel has none (then the list visited every object, and feed.listers
	// holds the dep in scan).
	by      labelPair
	indexed bool
}

var _ engine.ClusterReader = (*clusterReader)(nil)

// errNotRead: the status readers asked for something the engine does not
// serve, which is a mismatch between them and the generated table.
var errNotRead = errors.New("informerd's status engine does not read this")

func (r *clusterReader) ListNamespaceScoped(_ context.Context, list *unstructured.UnstructuredList, ns string, sel labels.Selector) error {
	gk := list.GroupVersionKind().GroupKind()
	gk.Kind = strings.TrimSuffix(gk.Kind, "List")
	f := r.t.genFeed(gk)
	if f == nil || ns != r.t.id.Namespace {
		return fmt.Errorf("%w: %s in namespace %q for %s", errNotRead, gk, ns, r.t.id)
	}
	d := dep{feed: f, sel: sel}
	d.by, d.indexed = f.objects.rarest(sel)
	var objs []*cache.Object
	if f.state == feedSynced {
		objs = f.objects.list(ns, sel, d.by, d.indexed)
	}
	d.names = make(map[string]struct{}, len(objs))
	if len(objs) > 0 {
		for _, o := range objs {
			d.names[o.Name] = struct{}{}
			r.objects[object.ObjMetadata{GroupKind: gk, Namespace: o.Namespace, Name: o.Name}] = o.Bytes()
			if gk == podGK {
				// podStatuses reads the Pod from r.listed, decoding it
				// only if its status at this resourceVersion is not known:
				// the item names it.
				if r.listed == nil {
					r.pods, r.listed = f, make(map[string]*cache.Object, len(objs))
				}
				r.listed[o.Name] = o
				list.Items = append(list.Items, unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": o.Name, "namespace": o.Namespace},
				}})
				continue
			}
			u, err := decode(o.Data)
			if err != nil {
				return err
			}
			list.Items = append(list.Items, *u)
		}
	}
	r.deps = append(r.deps, d)
	return nil
}

func (r *clusterReader) Get(context.Context, client.ObjectKey, *unstructured.Unstructured) error {
	return fmt.Errorf("%w: a Get", errNotRead)
}

func (r *clusterReader) ListClusterScoped(context.Context, *unstructured.UnstructuredList, labels.Selector) error {
	return fmt.Errorf("%w: a cluster-scoped list", errNotRead)
}

func (r *clusterReader) Sync(context.Context) error { return nil }

func decode(data []byte) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		return nil, fmt.Errorf("decoding an object from the cache: %w", err)
	}
	return u, nil
}

// unschedulable reports whether rs is InProgress because a Pod (the
// object, or one of its generated resources) is unschedulable, as
// cli-utils' StatusWatcher decides when to re-check an object.
func unschedulable(rs *event.ResourceStatus) bool {
	if rs.Error != nil || rs.Status != kstatus.InProgressStatus {
		return false
	}
	if podUnschedulable(rs.Resource) {
		return true
	}
	for _, g := range rs.GeneratedResources {
		if unschedulable(g) {
			return true
		}
	}
	return false
}

// podUnschedulable reports whether u is a Pod with the condition
// PodScheduled False, reason Unschedulable.
func podUnschedulable(u *unstructured.Unstructured) bool {
	if u == nil || u.GroupVersionKind().GroupKind() != podGK {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "PodScheduled" && m["status"] == "False" && m["reason"] == "Unschedulable" {
			return true
		}
	}
	return false
}

// summarize returns rs without the objects it was computed from: the
// object's identity metadata only, and none for generated resources.
func summarize(rs *event.ResourceStatus) *event.ResourceStatus {
	out := *rs
	out.Resource = identity(rs.Resource)
	out.GeneratedResources = summarizeGenerated(rs.GeneratedResources)
	return &out
}

func summarizeGenerated(gen event.ResourceStatuses) event.ResourceStatuses {
	if len(gen) == 0 {
		return nil
	}
	out := make(event.ResourceStatuses, len(gen))
	for i, g := range gen {
		if g.Resource == nil && len(g.GeneratedResources) == 0 {
			out[i] = g // summarized already (a Pod's, from podStatuses)
			continue
		}
		c := *g
		c.Resource = nil
		c.GeneratedResources = summarizeGenerated(g.GeneratedResources)
		out[i] = &c
	}
	return out
}

// identity returns u's apiVersion, kind, name, namespace, uid, generation
// and resourceVersion: what an applier compares (cli-utils' WaitTask
// checks the generation and the UID).
func identity(u *unstructured.Unstructured) *unstructured.Unstructured {
	if u == nil {
		return nil
	}
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	out.SetNamespace(u.GetNamespace())
	out.SetName(u.GetName())
	out.SetUID(u.GetUID())
	out.SetGeneration(u.GetGeneration())
	out.SetResourceVersion(u.GetResourceVersion())
	return out
}

// notFound is the status of an object that does not exist, as cli-utils'
// StatusWatcher reports a deleted one.
func notFound(id object.ObjMetadata) *event.ResourceStatus {
	return &event.ResourceStatus{Identifier: id, Status: kstatus.NotFoundStatus, Message: "Resource not found"}
}

// equal reports whether two statuses of one object are the same to a
// watcher: cli-utils' definition, and the same UID.
func equal(a, b *event.ResourceStatus) bool {
	var ua, ub string
	if a.Resource != nil {
		ua = string(a.Resource.GetUID())
	}
	if b.Resource != nil {
		ub = string(b.Resource.GetUID())
	}
	return ua == ub && event.ResourceStatusEqual(a, b)
}
