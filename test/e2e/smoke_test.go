package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/test/controlplane"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// TestSmokeWatchCustomResource proves the control plane serves CRDs and
// watches end to end: a namespace, a CRD and a custom object are created,
// updated and deleted, and a watch sees each event in order.
func TestSmokeWatchCustomResource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	ns := createNamespace(ctx, t, "smoke")

	widgets := schema.GroupVersionResource{Group: "smoke.informerd.dev", Version: "v1", Resource: "widgets"}
	createCRD(ctx, t, dyn, widgets, "Widget")

	w, err := dyn.Resource(widgets).Namespace(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watching widgets: %v", err)
	}
	defer w.Stop()

	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "smoke.informerd.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1"},
		"spec":     map[string]any{"size": int64(1)},
	}}
	created, err := dyn.Resource(widgets).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating widget: %v", err)
	}
	expectEvent(t, w, watch.Added, created.GetResourceVersion())

	_ = unstructured.SetNestedField(created.Object, int64(2), "spec", "size")
	updated, err := dyn.Resource(widgets).Namespace(ns).Update(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("updating widget: %v", err)
	}
	expectEvent(t, w, watch.Modified, updated.GetResourceVersion())

	if err := dyn.Resource(widgets).Namespace(ns).Delete(ctx, "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting widget: %v", err)
	}
	expectEvent(t, w, watch.Deleted, "")
}

// TestSmokeLimitedServiceAccount proves the harness mints real identities:
// a ServiceAccount allowed to read ConfigMaps in its own namespace is
// refused in another one.
func TestSmokeLimitedServiceAccount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	nsA := createNamespace(ctx, t, "tenant-a")
	nsB := createNamespace(ctx, t, "tenant-b")
	read := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}
	if err := controlplane.Grant(ctx, admin, nsA, "reader", nsA, read); err != nil {
		t.Fatal(err)
	}
	token, err := controlplane.ServiceAccountToken(ctx, admin, nsA, "reader")
	if err != nil {
		t.Fatal(err)
	}
	reader := kubernetes.NewForConfigOrDie(env.TokenConfig(token))

	// RBAC bindings take effect through the authorizer's informers: wait.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := reader.CoreV1().ConfigMaps(nsA).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("reader never allowed to list configmaps in its own namespace %s", nsA)
	}
	_, err = reader.CoreV1().ConfigMaps(nsB).List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("list in %s: got %v, want Forbidden", nsB, err)
	}
	_, err = reader.CoreV1().ConfigMaps(nsB).Watch(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("watch in %s: got %v, want Forbidden", nsB, err)
	}
	if !strings.Contains(err.Error(), "system:serviceaccount:"+nsA+":reader") {
		t.Fatalf("Forbidden does not name the ServiceAccount: %v", err)
	}
}

// TestSmokeFakeNodeRunsPods proves kube-scheduler and kwok work: a pod is
// scheduled to the fake node, becomes Running and gets a pod IP.
func TestSmokeFakeNodeRunsPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	ns := createNamespace(ctx, t, "pods")
	if err := controlplane.WaitForDefaultServiceAccount(ctx, admin, ns); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p1"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
	}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = admin.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning && got.Status.PodIP != "", err
	})
	if err != nil {
		t.Fatalf("pod never Running with an IP: %v (last: node=%q phase=%q ip=%q)", err, got.Spec.NodeName, got.Status.Phase, got.Status.PodIP)
	}
	if got.Spec.NodeName != controlplane.FakeNodeName {
		t.Fatalf("pod scheduled to %q, want %q", got.Spec.NodeName, controlplane.FakeNodeName)
	}
}

// createNamespace creates a uniquely named namespace and deletes it when the
// test ends.
func createNamespace(ctx context.Context, t *testing.T, prefix string) string {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	ns, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	// kube-controller-manager publishes kube-root-ca.crt into every new
	// namespace; wait for it, so that it is not a surprise event later.
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().ConfigMaps(ns.Name).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("kube-root-ca.crt never appeared in namespace %s", ns.Name)
	}
	return ns.Name
}

// createCRD creates a namespaced CRD that preserves unknown fields, waits
// until it is Established, and deletes it when the test ends.
func createCRD(ctx context.Context, t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, kind string) {
	t.Helper()
	name := gvr.Resource + "." + gvr.Group
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"group": gvr.Group,
			"scope": "Namespaced",
			"names": map[string]any{"plural": gvr.Resource, "kind": kind, "singular": strings.ToLower(kind), "listKind": kind + "List"},
			"versions": []any{map[string]any{
				"name": gvr.Version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object", "x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CRD %s: %v", name, err)
	}
	t.Cleanup(func() { _ = dyn.Resource(crdGVR).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not Established: %v", name, err)
	}
}

// expectEvent reads the next event and checks its type and, if given, its
// resourceVersion.
func expectEvent(t *testing.T, w watch.Interface, typ watch.EventType, rv string) {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatalf("watch closed, want %s", typ)
		}
		if ev.Type != typ {
			t.Fatalf("got %s event (%v), want %s", ev.Type, ev.Object, typ)
		}
		got := ev.Object.(*unstructured.Unstructured).GetResourceVersion()
		if rv != "" && got != rv {
			t.Fatalf("%s event at resourceVersion %s, want %s", typ, got, rv)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s event within 30s", typ)
	}
}
