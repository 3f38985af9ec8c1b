package e2e

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestNewCRDVersionIsHeldBeforeItIsRead: a status stream's object whose
// CRD is deleted and created again serving v2 instead of v1 is read from
// v2 only once the stream's caller holds v2 (the hold is where the daemon
// authorizes and counts what a caller reads; RBAC grants a resource, not a
// version, so counting is what tells the two versions apart here). With
// one informer per caller, the caller still holds the dead v1 informer, so
// its hold of v2 is refused: the stream ends RESOURCE_EXHAUSTED and no v2
// informer was ever started. (Before, the engine subscribed to v2, starting
// its informer, before the caller was asked.)
func TestNewCRDVersionIsHeldBeforeItIsRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "crd-version")
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	group := rand.String(6) + ".versions.e2e.informerd.dev"
	v1 := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "widgets"}
	v2 := schema.GroupVersionResource{Group: group, Version: "v2", Resource: "widgets"}
	createCRD(ctx, t, dyn, v1, "Widget")
	if _, err := dyn.Resource(v1).Namespace(ns).Create(ctx, u(group+"/v1", "Widget", ns, "w", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cache.Options{MaxSourcesPerOwner: 1, Scope: cache.ScopeCluster})
	c := d.dial(t, readsAll)
	s, err := c.API().WatchStatus(ctx, &informerdv1.WatchStatusRequest{
		Objects:       []*informerdv1.ObjectReference{{Group: group, Kind: "Widget", Namespace: ns, Name: "w"}},
		ScopeStrategy: informerdv1.ScopeStrategy_SCOPE_STRATEGY_NAMESPACE, ClientName: "versions",
	})
	if err != nil {
		t.Fatal(err)
	}
	// next returns the stream's next status, or the error that ended it.
	next := func() (*informerdv1.ResourceStatus, error) {
		for {
			resp, err := s.Recv()
			if err != nil {
				return nil, err
			}
			for _, ev := range resp.GetEvents() {
				if ev.GetType() == informerdv1.StatusEventType_STATUS_EVENT_TYPE_STATUS {
					return ev.GetStatus(), nil
				}
			}
		}
	}
	expect := func(what string, want informerdv1.Status) {
		t.Helper()
		rs, err := next()
		if err != nil || rs.GetStatus() != want {
			t.Fatalf("%s: status %v, error %v; want %v", what, rs.GetStatus(), err, want)
		}
	}
	expect("served as v1", informerdv1.Status_STATUS_CURRENT)

	crdName := v1.Resource + "." + group
	if err := dyn.Resource(crdGVR).Delete(ctx, crdName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("its CRD deleted", informerdv1.Status_STATUS_NOT_FOUND)
	eventually(ctx, t, "CRD gone", func() bool {
		_, err := dyn.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	createCRD(ctx, t, dyn, v2, "Widget")
	if _, err := dyn.Resource(v2).Namespace(ns).Create(ctx, u(group+"/v2", "Widget", ns, "w", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rs, err := next()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("served as v2: status %v, error %v; want RESOURCE_EXHAUSTED (the caller may hold one informer, and holds v1's)", rs.GetStatus(), err)
	}
	t.Logf("the stream ended: %v", err)
	for _, src := range d.mgr.Sources() {
		if src.Key.GVR == v2 {
			t.Fatalf("an informer of %s was started for a stream whose caller was refused it: %+v", v2, src)
		}
	}
}
