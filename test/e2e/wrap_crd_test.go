package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client/wrapconfig"
)

// crdTestHold is a finalizer of the test's own that keeps a deleted CRD
// terminating until the test removes it.
const crdTestHold = "informerd.dev/test-hold"

// TestWrapConfigDeletedCRDAnswers404: once the API server answers 404 for
// a deleted CRD's resource, a list through WrapConfig answers 404 too, at
// once (never the daemon's empty list of an informer that has not heard
// yet), in strict mode with the API server's own Status; while the CRD
// terminates (its finalizers run, the API server still serves it) wrapped
// lists pass through, counted as crd_terminating, and strict ones answer
// 503.
func TestWrapConfigDeletedCRDAnswers404(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gone := schema.GroupVersionResource{Group: "gone.informerd.dev", Version: "v1", Resource: "relics"}
	held := schema.GroupVersionResource{Group: "held.informerd.dev", Version: "v1", Resource: "relics"}
	ns := createNamespace(ctx, t, "crd404")
	for _, gvr := range []schema.GroupVersionResource{gone, held} {
		createCRD(ctx, t, dyn, gvr, "Relic")
		for i := range 3 {
			o := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": gvr.GroupVersion().String(), "kind": "Relic",
				"metadata": map[string]any{"name": fmt.Sprintf("r%d", i), "namespace": ns},
			}}
			if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(gone, ns), reads(held, ns))
	reg, strictReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	wrapped := dynamic.NewForConfigOrDie(wrapconfig.Wrap(env.RESTConfig(), c, wrapconfig.Options{Registerer: reg}))
	strictConfig := wrapconfig.Wrap(env.RESTConfig(), c, wrapconfig.Options{Strict: true, Registerer: strictReg})
	strict := dynamic.NewForConfigOrDie(strictConfig)
	for _, gvr := range []schema.GroupVersionResource{gone, held} {
		for name, kc := range map[string]dynamic.Interface{"wrapped": wrapped, "strict": strict} {
			l, err := kc.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) != 3 {
				t.Fatalf("%s list of %s before the delete: %v, %v", name, gvr.Group, l, err)
			}
		}
	}
	if n := wrapCount(reg, "served") + wrapCount(strictReg, "served"); n != 4 {
		t.Fatalf("served %v of the 4 lists before the delete", n)
	}

	t.Run("deleted", func(t *testing.T) {
		deletedCRDAnswers404(ctx, t, dyn, wrapped, strictConfig, gone, ns, nil)
	})
	t.Run("terminating, then deleted", func(t *testing.T) {
		name := held.Resource + "." + held.Group
		hold := []byte(`{"metadata":{"finalizers":["` + crdTestHold + `"]}}`)
		if _, err := dyn.Resource(crdGVR).Patch(ctx, name, types.MergePatchType, hold, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { releaseCRD(context.Background(), t, dyn, name) })
		terminating := func() {
			// The API server still serves it: wrapped lists pass through
			// (counted as crd_terminating); strict ones answer 503.
			before := wrapCountReason(reg, "passed", "crd_terminating")
			eventually(ctx, t, "a wrapped list passed through as crd_terminating", func() bool {
				if _, err := wrapped.Resource(held).Namespace(ns).List(ctx, metav1.ListOptions{}); err != nil {
					t.Fatalf("wrapped list while the CRD terminates: %v", err)
				}
				return wrapCountReason(reg, "passed", "crd_terminating") > before
			})
			_, err := strict.Resource(held).Namespace(ns).List(ctx, metav1.ListOptions{})
			if !apierrors.IsServiceUnavailable(err) {
				t.Errorf("strict list while the CRD terminates: %v, want 503", err)
			}
			if n := wrapCountReason(strictReg, "refused", "crd_terminating"); n < 1 {
				t.Errorf("strict: refused for crd_terminating %v times, want at least 1", n)
			}
		}
		deletedCRDAnswers404(ctx, t, dyn, wrapped, strictConfig, held, ns, terminating)
	})
}

// deletedCRDAnswers404 deletes gvr's CRD (if its finalizer of the test
// holds it, runs terminating and then releases it) and polls the API
// server until it answers 404 for ns's list of gvr. From then on, for a
// second, the wrapped list must answer 404 every time, and the strict
// one must never answer 200 and answer 404 as the API server does,
// status, Content-Type and body (503, the CRD still terminating to the
// daemon, is counted and reported: the daemon's watch and the API
// server's are separate).
func deletedCRDAnswers404(ctx context.Context, t *testing.T, dyn, wrapped dynamic.Interface, strictConfig *rest.Config, gvr schema.GroupVersionResource, ns string, terminating func()) {
	strict := dynamic.NewForConfigOrDie(strictConfig)
	name := gvr.Resource + "." + gvr.Group
	deleted := time.Now()
	if err := dyn.Resource(crdGVR).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if terminating != nil {
		terminating()
		deleted = time.Now()
		releaseCRD(ctx, t, dyn, name)
	}
	list := func(kc dynamic.Interface) error {
		_, err := kc.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		return err
	}
	var direct error
	wrappedBefore := 0 // wrapped lists answered before the direct 404
	for {
		if direct = list(dyn); apierrors.IsNotFound(direct) {
			break
		}
		if direct != nil {
			t.Fatalf("direct list after the delete: %v", direct)
		}
		if ctx.Err() != nil {
			t.Fatal("the API server never answered 404")
		}
		_ = list(wrapped)
		wrappedBefore++
	}
	directAt := time.Since(deleted)

	var wrapped200, strict200, strict503, strict404, polls int
	var strict404At, wrappedSlowest, strictSlowest time.Duration
	timed := func(kc dynamic.Interface, slowest *time.Duration) error {
		start := time.Now()
		err := list(kc)
		*slowest = max(*slowest, time.Since(start))
		return err
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); polls++ {
		switch err := timed(wrapped, &wrappedSlowest); {
		case err == nil:
			wrapped200++
		case !apierrors.IsNotFound(err):
			t.Errorf("wrapped list after the direct 404: %v", err)
		}
		switch err := timed(strict, &strictSlowest); {
		case err == nil:
			strict200++
		case apierrors.IsServiceUnavailable(err):
			strict503++
		case apierrors.IsNotFound(err):
			if strict404++; strict404 == 1 {
				strict404At = time.Since(deleted)
			}
		default:
			t.Errorf("strict list after the direct 404: %v", err)
		}
	}
	t.Logf("direct 404 %v after the CRD was gone (%d wrapped lists before it); after it, over %d polls: wrapped 200 ×%d (slowest answer %v), strict 200 ×%d, 503 ×%d, 404 ×%d (the first %v after the CRD was gone; slowest answer %v)",
		directAt, wrappedBefore, polls, wrapped200, wrappedSlowest, strict200, strict503, strict404, strict404At, strictSlowest)
	directRaw, strictRaw := rawGet(ctx, t, env.RESTConfig(), gvr, ns), rawGet(ctx, t, strictConfig, gvr, ns)
	if directRaw != strictRaw {
		t.Errorf("strict 404 answer:\n%s\nwant the API server's:\n%s", strictRaw, directRaw)
	}
	if wrapped200 > 0 || strict200 > 0 {
		t.Errorf("after the API server answered 404, the wrapped list answered 200 %d times and the strict one %d times", wrapped200, strict200)
	}
	if strict404 == 0 {
		t.Errorf("the strict list never answered 404 within a second of the API server's")
	}
}

// releaseCRD removes the test's finalizer from the CRD name, if it is
// still there.
func releaseCRD(ctx context.Context, t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []string
		for _, f := range crd.GetFinalizers() {
			if f != crdTestHold {
				keep = append(keep, f)
			}
		}
		crd.SetFinalizers(keep)
		_, err = dyn.Resource(crdGVR).Update(ctx, crd, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("releasing CRD %s: %v", name, err)
	}
}

// rawGet lists gvr in ns as a JSON client does, through cfg's transport,
// and returns the answer's status, Content-Type and body.
func rawGet(ctx context.Context, t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource, ns string) string {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/apis/"+gvr.Group+"/"+gvr.Version+"/namespaces/"+ns+"/"+gvr.Resource, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json, */*")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
}
