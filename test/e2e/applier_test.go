package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	cmdutil "k8s.io/kubectl/pkg/cmd/util"
	"sigs.k8s.io/cli-utils/pkg/apply"
	applyevent "sigs.k8s.io/cli-utils/pkg/apply/event"
	"sigs.k8s.io/cli-utils/pkg/common"
	"sigs.k8s.io/cli-utils/pkg/inventory"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/client"
)

// A real cli-utils Applier and Destroyer against the test control plane,
// waiting through informerd (testDaemon.waiter) or, with a zero waiter,
// with cli-utils' DefaultStatusWatcher, which watches the API server
// directly.

// kubectlFactory is the kubectl factory an applier CLI builds, reading
// only the test control plane's kubeconfig and caching discovery in a
// directory of the test's own.
func kubectlFactory(t *testing.T) cmdutil.Factory {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	kubeconfig, cacheDir := env.KubeconfigPath, t.TempDir()
	flags.KubeConfig, flags.CacheDir = &kubeconfig, &cacheDir
	return cmdutil.NewFactory(cmdutil.NewMatchVersionFlags(flags))
}

// inventoryClient returns a kubectl factory and a ConfigMap inventory
// client over it.
func inventoryClient(t *testing.T) (cmdutil.Factory, inventory.Client) {
	t.Helper()
	f := kubectlFactory(t)
	inv, err := inventory.ClusterClientFactory{StatusPolicy: inventory.StatusPolicyAll}.NewClient(f)
	if err != nil {
		t.Fatal(err)
	}
	return f, inv
}

// patientMapper is the factory's RESTMapper, except that a kind whose
// CustomResourceDefinition is Established is waited for (up to 30 s) until
// discovery serves it. The API server sets Established before its
// discovery documents list the new kind, and cli-utils does not handle
// that race: its Applier fails the apply of the custom object ("no matches
// for kind"), and its DefaultStatusWatcher, which retries only on the next
// CRD event, never watches the kind. Seen in CI about once per 100 CRDs.
// It is the reference's race, not informerd's, so the tests of the direct
// path wait it out; informerd's RESTMapper (client.NewRESTMapper) waits
// for it itself.
type patientMapper struct {
	meta.RESTMapper
	crds dynamic.ResourceInterface
}

func newPatientMapper(t *testing.T, f cmdutil.Factory) meta.RESTMapper {
	t.Helper()
	m, err := f.ToRESTMapper()
	if err != nil {
		t.Fatal(err)
	}
	return patientMapper{RESTMapper: m, crds: dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(crdGVR)}
}

func (m patientMapper) Reset() { meta.MaybeResetRESTMapper(m.RESTMapper) }

func (m patientMapper) RESTMapping(gk schema.GroupKind, versions ...string) (mapping *meta.RESTMapping, err error) {
	m.waitForDiscovery(gk, func() error {
		mapping, err = m.RESTMapper.RESTMapping(gk, versions...)
		return err
	})
	return mapping, err
}

func (m patientMapper) RESTMappings(gk schema.GroupKind, versions ...string) (mappings []*meta.RESTMapping, err error) {
	m.waitForDiscovery(gk, func() error {
		mappings, err = m.RESTMapper.RESTMappings(gk, versions...)
		return err
	})
	return mappings, err
}

// waitForDiscovery calls lookup until it finds gk, or gk has no
// Established CRD, or 30 s have passed.
func (m patientMapper) waitForDiscovery(gk schema.GroupKind, lookup func() error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := lookup(); !meta.IsNoMatchError(err) || !m.established(ctx, gk) {
			return true, nil
		}
		m.Reset()
		return false, nil
	})
}

// established reports whether a CRD of gk has condition Established True.
func (m patientMapper) established(ctx context.Context, gk schema.GroupKind) bool {
	list, err := m.crds.List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	for _, crd := range list.Items {
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
		if group != gk.Group || kind != gk.Kind {
			continue
		}
		conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conditions {
			if c, ok := c.(map[string]any); ok && c["type"] == "Established" && c["status"] == "True" {
				return true
			}
		}
	}
	return false
}

// waiter is how an applier waits for status and maps kinds: informerd's
// StatusWatcher and RESTMapper (testDaemon.waiter), or, zero, cli-utils'
// DefaultStatusWatcher and the kubectl factory's RESTMapper over the API
// server, made patient (patientMapper).
type waiter struct {
	sw     watcher.StatusWatcher
	mapper meta.RESTMapper
}

// waiter returns informerd's StatusWatcher and RESTMapper for one applier,
// with no test-side workaround.
func (d *testDaemon) waiter(t *testing.T, name string) waiter {
	t.Helper()
	return waiter{sw: d.statusWatcher(t, name), mapper: client.NewRESTMapper(d.dial(t, readsAll))}
}

func (w waiter) build(t *testing.T, f cmdutil.Factory) (watcher.StatusWatcher, meta.RESTMapper) {
	t.Helper()
	if w.mapper == nil {
		return w.sw, newPatientMapper(t, f)
	}
	return w.sw, w.mapper
}

func newApplier(t *testing.T, w waiter) *apply.Applier {
	t.Helper()
	f, inv := inventoryClient(t)
	sw, mapper := w.build(t, f)
	b := apply.NewApplierBuilder().WithFactory(f).WithRestMapper(mapper).WithInventoryClient(inv)
	if sw != nil {
		b = b.WithStatusWatcher(sw)
	}
	a, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func newDestroyer(t *testing.T, w waiter) *apply.Destroyer {
	t.Helper()
	f, inv := inventoryClient(t)
	sw, mapper := w.build(t, f)
	b := apply.NewDestroyerBuilder().WithFactory(f).WithRestMapper(mapper).WithInventoryClient(inv)
	if sw != nil {
		b = b.WithStatusWatcher(sw)
	}
	d, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// inventoryInfo is a ConfigMap inventory named id in namespace ns.
func inventoryInfo(ns, id string) inventory.Info {
	return inventory.WrapInventoryInfoObj(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "inventory-" + id, "namespace": ns, "labels": map[string]any{common.InventoryLabel: id}},
	}})
}

// runResult is what an apply or destroy run reported.
type runResult struct {
	done chan struct{} // closed when the run's event channel has closed
	mu   sync.Mutex    // guards the fields below, which the run's goroutine fills
	// statuses is every status the run's StatusWatcher reported, per object.
	statuses map[object.ObjMetadata][]kstatus.Status
	// waits is each object's last reconcile outcome.
	waits  map[object.ObjMetadata]applyevent.WaitEventStatus
	errors []string
}

func (r *runResult) final() map[object.ObjMetadata]kstatus.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[object.ObjMetadata]kstatus.Status{}
	for id, ss := range r.statuses {
		out[id] = ss[len(ss)-1]
	}
	return out
}

// wait waits until the run ends.
func (r *runResult) wait(ctx context.Context, t *testing.T) *runResult {
	t.Helper()
	select {
	case <-r.done:
		return r
	case <-ctx.Done():
		t.Fatal("the run never ended")
		return nil
	}
}

// watchRun reads a run's events until the channel closes, in a goroutine
// of its own; the caller waits for it (wait).
func watchRun(events <-chan applyevent.Event) *runResult {
	r := &runResult{done: make(chan struct{}), statuses: map[object.ObjMetadata][]kstatus.Status{}, waits: map[object.ObjMetadata]applyevent.WaitEventStatus{}}
	go func() {
		defer close(r.done)
		for e := range events {
			r.record(e)
		}
	}()
	return r
}

func (r *runResult) record(e applyevent.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Type {
	case applyevent.ErrorType:
		r.errors = append(r.errors, e.ErrorEvent.Err.Error())
	case applyevent.ValidationType:
		r.errors = append(r.errors, e.ValidationEvent.Error.Error())
	case applyevent.ApplyType:
		if e.ApplyEvent.Error != nil {
			r.errors = append(r.errors, fmt.Sprintf("apply %s: %v", e.ApplyEvent.Identifier, e.ApplyEvent.Error))
		}
	case applyevent.DeleteType:
		if e.DeleteEvent.Error != nil {
			r.errors = append(r.errors, fmt.Sprintf("delete %s: %v", e.DeleteEvent.Identifier, e.DeleteEvent.Error))
		}
	case applyevent.StatusType:
		if rs := e.StatusEvent.PollResourceInfo; rs != nil {
			r.statuses[rs.Identifier] = append(r.statuses[rs.Identifier], rs.Status)
		}
	case applyevent.WaitType:
		r.waits[e.WaitEvent.Identifier] = e.WaitEvent.Status
	}
}

// last returns the last status reported of id, or "".
func (r *runResult) last(id object.ObjMetadata) kstatus.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ss := r.statuses[id]; len(ss) > 0 {
		return ss[len(ss)-1]
	}
	return ""
}

// expectReconciled fails unless the run had no error and every object of
// ids reconciled and was last reported as want.
func (r *runResult) expectReconciled(t *testing.T, what string, ids object.ObjMetadataSet, want kstatus.Status) {
	t.Helper()
	if ok, why := r.reconciled(ids, want); !ok {
		t.Fatalf("%s: %s", what, why)
	}
}

// reconciled reports whether the run had no error and every object of ids
// reconciled and was last reported as want, and if not, why.
func (r *runResult) reconciled(ids object.ObjMetadataSet, want kstatus.Status) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errors) > 0 {
		return false, "errors: " + strings.Join(r.errors, "; ")
	}
	for _, id := range ids {
		ss := r.statuses[id]
		if w := r.waits[id]; w != applyevent.ReconcileSuccessful || len(ss) == 0 || ss[len(ss)-1] != want {
			return false, fmt.Sprintf("%s: reconcile %s, statuses %v; want Successful and last %s", id, w, ss, want)
		}
	}
	return true, ""
}

// startApply applies objs as inventory id (in namespace invNS) with
// reconcile wait.
func startApply(ctx context.Context, a *apply.Applier, invNS, id string, objs []*unstructured.Unstructured, timeout time.Duration) *runResult {
	return watchRun(a.Run(ctx, inventoryInfo(invNS, id), objs, apply.ApplierOptions{ReconcileTimeout: timeout, EmitStatusEvents: true}))
}

func startDestroy(ctx context.Context, d *apply.Destroyer, invNS, id string, timeout time.Duration) *runResult {
	return watchRun(d.Run(ctx, inventoryInfo(invNS, id), apply.DestroyerOptions{DeleteTimeout: timeout, EmitStatusEvents: true}))
}

func u(apiVersion, kind, ns, name string, fields map[string]any) *unstructured.Unstructured {
	o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
	for k, v := range fields {
		o.Object[k] = v
	}
	o.SetName(name)
	if ns != "" {
		o.SetNamespace(ns)
	}
	return o
}

// deploymentObj is a Deployment whose Pods run on the kwok node.
func deploymentObj(ns, name string, replicas int64, nodeSelector map[string]any) *unstructured.Unstructured {
	podSpec := map[string]any{"containers": []any{map[string]any{"name": "c", "image": "registry.invalid/none:1"}}}
	if nodeSelector != nil {
		podSpec["nodeSelector"] = nodeSelector
	}
	return u("apps/v1", "Deployment", ns, name, map[string]any{"spec": map[string]any{
		"replicas": replicas,
		"selector": map[string]any{"matchLabels": map[string]any{"app": name}},
		"template": map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": name}}, "spec": podSpec},
	}})
}

func serviceObj(ns, name string) *unstructured.Unstructured {
	return u("v1", "Service", ns, name, map[string]any{"spec": map[string]any{
		"selector": map[string]any{"app": name}, "ports": []any{map[string]any{"port": int64(80)}},
	}})
}

// crdObj is a namespaced CRD of kind in group that keeps unknown fields
// (so a status can be written with the object).
func crdObj(group, kind string) *unstructured.Unstructured {
	plural := strings.ToLower(kind) + "s"
	return u("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", plural+"."+group, map[string]any{"spec": map[string]any{
		"group": group, "scope": "Namespaced",
		"names": map[string]any{"plural": plural, "kind": kind, "singular": strings.ToLower(kind), "listKind": kind + "List"},
		"versions": []any{map[string]any{
			"name": "v1", "served": true, "storage": true,
			"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
		}},
	}})
}

// gateObj is a custom object that kstatus reports InProgress (condition
// Reconciling True) until openGate clears its conditions: it holds an
// applier's reconcile wait open for as long as a test needs.
func gateObj(group, ns, name string) *unstructured.Unstructured {
	return u(group+"/v1", "Gate", ns, name, map[string]any{"status": map[string]any{"conditions": []any{
		map[string]any{"type": "Reconciling", "status": "True", "reason": "Gated", "message": "held open by the test"},
	}}})
}

func openGate(ctx context.Context, t *testing.T, group, ns, name string) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "gates"}
	if _, err := dyn.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"conditions":[]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("opening gate %s/%s: %v", ns, name, err)
	}
}
