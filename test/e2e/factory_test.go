package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
)

// gadget is a custom resource's Go type, as a user's scheme registers it.
type gadget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Size int `json:"size"`
	} `json:"spec"`
}

func (g *gadget) DeepCopyObject() runtime.Object {
	c := *g
	g.DeepCopyInto(&c.ObjectMeta)
	return &c
}

// TestInformerFactory: the client library's factory makes typed (by kind,
// custom resources in the user's Go type), dynamic and metadata-only
// informers served by the daemon, one per resource, with
// TweakListOptions' selectors evaluated by the daemon.
func TestInformerFactory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "factory")
	gadgets := schema.GroupVersionResource{Group: "factory.informerd.dev", Version: "v1", Resource: "gadgets"}
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	createCRD(ctx, t, dyn, gadgets, "Gadget")
	g := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "factory.informerd.dev/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": "g1", "labels": map[string]any{"pick": "yes"}}, "spec": map[string]any{"size": int64(3)},
	}}
	if _, err := dyn.Resource(gadgets).Namespace(ns).Create(ctx, g, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createConfigMap(ctx, t, ns, "picked", nil)
	createConfigMap(ctx, t, ns, "skipped", nil)
	picked := kubeClient(t).CoreV1().ConfigMaps(ns)
	cmObj, err := picked.Get(ctx, "picked", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmObj.Labels = map[string]string{"pick": "yes"}
	if _, err := picked.Update(ctx, cmObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	s.AddKnownTypeWithName(schema.GroupVersionKind{Group: gadgets.Group, Version: "v1", Kind: "Gadget"}, &gadget{})
	d := startDaemon(t, cache.Options{})
	f := client.NewInformerFactory(d.dial(t, reads(configMaps, ns), reads(gadgets, ns)), client.FactoryOptions{
		Namespace: ns, Scheme: s, ClientName: "factory",
		TweakListOptions: func(o *metav1.ListOptions) { o.LabelSelector = "pick=yes" },
	})
	typedCMs, err := f.InformerFor(&corev1.ConfigMap{})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := f.InformerFor(&corev1.ConfigMap{})
	if again != typedCMs {
		t.Error("a second InformerFor of one type made another informer")
	}
	typedGadgets, err := f.InformerFor(&gadget{})
	if err != nil {
		t.Fatal(err)
	}
	dynamicCMs := f.ForResource(configMaps)
	metaCMs := f.ForMetadata(configMaps)
	ictx, stop := context.WithCancel(ctx)
	defer func() { stop(); f.Shutdown() }()
	f.Start(ictx)
	if !f.WaitForCacheSync(ctx) {
		t.Fatal("the factory's informers never synced")
	}
	keys := func(inf toolscache.SharedIndexInformer) []string { return inf.GetStore().ListKeys() }
	for name, inf := range map[string]toolscache.SharedIndexInformer{
		"typed": typedCMs, "dynamic": dynamicCMs.Informer(), "metadata": metaCMs.Informer(),
	} {
		if got := keys(inf); len(got) != 1 || got[0] != ns+"/picked" {
			t.Errorf("%s ConfigMap informer holds %v, want only the picked one", name, got)
		}
	}
	if o, _, _ := typedCMs.GetStore().GetByKey(ns + "/picked"); o != nil {
		if _, ok := o.(*corev1.ConfigMap); !ok {
			t.Errorf("typed informer holds %T", o)
		}
	}
	if o, _, _ := metaCMs.Informer().GetStore().GetByKey(ns + "/picked"); o != nil {
		if _, ok := o.(*metav1.PartialObjectMetadata); !ok {
			t.Errorf("metadata informer holds %T", o)
		}
	}
	o, ok, _ := typedGadgets.GetStore().GetByKey(ns + "/g1")
	if gd, isGadget := o.(*gadget); !ok || !isGadget || gd.Spec.Size != 3 {
		t.Errorf("the Gadget informer holds %#v, want the user's type with spec.size 3", o)
	}
	if _, err := dynamicCMs.Lister().ByNamespace(ns).Get("picked"); err != nil {
		t.Errorf("lister: %v", err)
	}
}

func kubeClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	return kubernetes.NewForConfigOrDie(env.RESTConfig())
}
