package e2e

import (
	"context"
	"maps"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/wrapconfig"
	"github.com/informerd/informerd/test/controlplane"
)

// summarizer is a small controller-runtime reconciler: it keeps the
// ConfigMap named summary holding, for every other ConfigMap of its
// namespace labelled team (summaries aside), the label's value by name.
// It reads through the manager's cache and writes to the API server.
type summarizer struct {
	c       crclient.Client
	ns      string
	summary string
}

const summaryPrefix = "summary-"

func (s *summarizer) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var cms corev1.ConfigMapList
	if err := s.c.List(ctx, &cms, crclient.InNamespace(s.ns)); err != nil {
		return reconcile.Result{}, err
	}
	want := summaryOf(cms.Items)
	var cur corev1.ConfigMap
	err := s.c.Get(ctx, crclient.ObjectKey{Namespace: s.ns, Name: s.summary}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		return reconcile.Result{}, s.c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.summary}, Data: want})
	case err != nil:
		return reconcile.Result{}, err
	case maps.Equal(cur.Data, want):
		return reconcile.Result{}, nil
	}
	cur.Data = want
	return reconcile.Result{}, s.c.Update(ctx, &cur)
}

// summaryOf is what a summary holds for cms.
func summaryOf(cms []corev1.ConfigMap) map[string]string {
	out := map[string]string{}
	for _, cm := range cms {
		if team, ok := cm.Labels["team"]; ok && !strings.HasPrefix(cm.Name, summaryPrefix) {
			out[cm.Name] = team
		}
	}
	return out
}

// startSummarizer runs a manager of cfg with the summarizer writing
// summaryPrefix+name, until the test ends.
func startSummarizer(ctx context.Context, t *testing.T, cfg *rest.Config, ns, name string) {
	t.Helper()
	mgr, err := manager.New(cfg, manager.Options{
		Cache:                  crcache.Options{DefaultNamespaces: map[string]crcache.Config{ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	skip := true
	err = ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named(name + "-" + strings.ReplaceAll(ns, "-", "")).
		WithOptions(controller.Options{SkipNameValidation: &skip}).
		Complete(&summarizer{c: mgr.GetClient(), ns: ns, summary: summaryPrefix + name})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // ends with mctx
		defer close(done)
		if err := mgr.Start(mctx); err != nil {
			t.Errorf("manager %s: %v", name, err)
		}
	}()
	t.Cleanup(func() { stop(); <-done })
}

// TestWrapConfigControllerRuntime (issue 18): a controller-runtime
// reconciler run once direct and once through WrapConfig, with no other
// change, writes the same summary through a scripted sequence of changes
// that includes a kill -9 of the daemon mid-run, with WatchList on and
// off. The wrapped manager's lists and watches are served by the daemon
// (counted), and fall back to the API server while it is down.
func TestWrapConfigControllerRuntime(t *testing.T) {
	for _, tc := range []struct {
		name      string
		watchList bool
	}{{"watchlist", true}, {"list", false}} {
		t.Run(tc.name, func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, tc.watchList)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			ns := createNamespace(ctx, t, "wrap-ctrl")
			admin := kubeClient(t)
			d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"))

			// The reconciler's identity: it reads ConfigMaps of ns and
			// writes them, nothing more.
			saNS, sa := newServiceAccount(t)
			if err := controlplane.Grant(ctx, admin, saNS, sa, ns, rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update"},
			}); err != nil {
				t.Fatal(err)
			}
			apiToken, err := controlplane.ServiceAccountToken(ctx, admin, saNS, sa)
			if err != nil {
				t.Fatal(err)
			}
			cfg := rest.AnonymousClientConfig(env.RESTConfig())
			cfg.BearerToken = apiToken
			c := dialWith(t, d.socket, client.WithToken(mintToken(t, saNS, sa, auth.DefaultAudience)))
			reg := prometheus.NewRegistry()
			wrapped := wrapconfig.Wrap(cfg, c, wrapconfig.Options{ClientName: "summarizer", Registerer: reg})

			cm := func(name string, labels map[string]string) {
				t.Helper()
				if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			label := func(name, team string) {
				t.Helper()
				o, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				o.Labels = map[string]string{"team": team}
				if _, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, o, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			del := func(name string) {
				t.Helper()
				if err := admin.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// agree waits until both summaries hold what the API server's
			// ConfigMaps call for.
			agree := func(when string) {
				t.Helper()
				var want, direct, viaDaemon map[string]string
				ok := func() bool {
					cms, err := admin.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
					if err != nil {
						return false
					}
					want = summaryOf(cms.Items)
					direct, viaDaemon = nil, nil
					for _, o := range cms.Items {
						switch o.Name {
						case summaryPrefix + "direct":
							direct = o.Data
						case summaryPrefix + "wrapped":
							viaDaemon = o.Data
						}
					}
					return maps.Equal(direct, want) && maps.Equal(viaDaemon, want) && direct != nil && viaDaemon != nil
				}
				deadline := time.Now().Add(30 * time.Second)
				for !ok() {
					if time.Now().After(deadline) {
						t.Fatalf("%s: the summaries never agreed with the API server's ConfigMaps %v: direct %v, wrapped %v", when, want, direct, viaDaemon)
					}
					hold(ctx, 100*time.Millisecond)
				}
			}

			cm("a", map[string]string{"team": "x"})
			cm("b", map[string]string{"team": "y"})
			cm("c", nil)
			startSummarizer(ctx, t, cfg, ns, "direct")
			startSummarizer(ctx, t, wrapped, ns, "wrapped")
			agree("after start")
			if wrapCount(reg, "served") == 0 {
				t.Fatal("the wrapped manager's requests were not served by the daemon")
			}

			label("a", "z")
			del("b")
			agree("after the first changes")

			d.signal(syscall.SIGKILL) // mid-run
			cm("d", map[string]string{"team": "w"})
			label("c", "v")
			agree("while the daemon is down")
			served := wrapCount(reg, "served")
			d.start()
			cm("e", map[string]string{"team": "q"})
			del("a")
			agree("after the daemon came back")
			label("e", "r")
			agree("later")
			// Writes ("method") and discovery ("not_list") pass through by
			// design; no list or watch may.
			if reads := wrapPassedReads(reg); len(reads) != 0 {
				t.Errorf("lists or watches of the wrapped manager were passed through, by reason: %v", reads)
			}
			t.Logf("wrapped manager: %v requests served by the daemon (%v after it came back), %v fell back to the API server",
				wrapCount(reg, "served"), wrapCount(reg, "served")-served, wrapCount(reg, "fell_back"))
		})
	}
}

// wrapPassedReads counts the requests passed through for a reason other
// than being a write or not a list or watch, by reason.
func wrapPassedReads(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "informerd_client_wrap_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["outcome"] == "passed" && labels["reason"] != "method" && labels["reason"] != "not_list" {
				out[labels["reason"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
