package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/client/wrapconfig"
)

// TestWrappedInformersResyncAfterKill (issue 28): informers through
// WrapConfig, the daemon killed with SIGKILL, objects changed, the daemon
// started again. The wrapped watches fall back to the API server while
// the daemon is away, and come back to it at their next timeoutSeconds
// (3 s here), from a resume point the new daemon's informers never held
// (a RESET): the wrapper, which noted what the fallback watches
// delivered, answers it with the changes. Every store converges on the
// API server's state and comes back to the daemon with no LIST and no
// WatchList. It logs how long that took.
func TestWrappedInformersResyncAfterKill(t *testing.T) {
	for _, watchList := range []bool{false, true} {
		t.Run(fmt.Sprintf("WatchListClient=%v", watchList), func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, watchList)
			resyncAfterKill(t)
		})
	}
}

func resyncAfterKill(t *testing.T) {
	const namespaces, objects = 4, 25
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := kubeClient(t)
	var nss []string
	var perms []permission
	for range namespaces {
		ns := createNamespace(ctx, t, "resync")
		nss = append(nss, ns)
		perms = append(perms, reads(configMaps, ns))
		for i := range objects {
			if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%02d", i)},
				Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	socket := t.TempDir() + "/informerd.sock"
	d := startDaemonProcess(t, socket)
	cfg, c := wrapIdentity(ctx, t, socket, perms...)
	reg := prometheus.NewRegistry()
	wrapped := wrapconfig.Wrap(cfg, c, wrapconfig.Options{ClientName: "resync", Registerer: reg})
	var log requestLog
	log.wrap(wrapped) // outside WrapConfig's transport: sees every request
	kc, err := kubernetes.NewForConfig(wrapped)
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]toolscache.Store{}
	for _, ns := range nss {
		f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				if o.AllowWatchBookmarks { // the reflector's watches, not its lists
					o.TimeoutSeconds = new(int64(3))
				}
			}))
		inf := f.Core().V1().ConfigMaps().Informer()
		stores[ns] = inf.GetStore()
		infCtx, stop := context.WithCancel(ctx)
		f.Start(infCtx.Done())
		t.Cleanup(func() { stop(); f.Shutdown() })
		if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatalf("the informer of %s never synced", ns)
		}
	}
	converged := func() bool {
		for _, ns := range nss {
			l, err := admin.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			want, got := map[string]string{}, map[string]string{}
			for _, o := range l.Items {
				want[o.Name] = o.ResourceVersion
			}
			for _, o := range stores[ns].List() {
				cm := o.(*corev1.ConfigMap)
				got[cm.Name] = cm.ResourceVersion
			}
			if !maps.Equal(want, got) {
				return false
			}
		}
		return true
	}
	eventually(ctx, t, "the wrapped informers hold the API server's state", converged)
	change := func(ns, name string) {
		t.Helper()
		cms := admin.CoreV1().ConfigMaps(ns)
		o, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o.Data["k"] += "+"
		if _, err := cms.Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Each watch receives an event before the kill: client-go's reflector
	// takes a watch that ends within a second without one for an error,
	// and lists again.
	for _, ns := range nss {
		change(ns, "cm-02")
	}
	eventually(ctx, t, "the wrapped informers see a change", converged)
	lists := func() int {
		n := 0
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, u := range log.urls {
			// A LIST, or a WatchList's initial events: the whole state again.
			if strings.HasPrefix(u, "GET ") && strings.Contains(u, "/configmaps") && (!strings.Contains(u, "watch=true") || strings.Contains(u, "sendInitialEvents=true")) {
				n++
			}
		}
		return n
	}
	listsBefore := lists()

	d.signal(syscall.SIGKILL)
	for _, ns := range nss { // a change, a deletion and a creation in each
		change(ns, "cm-00")
		cms := admin.CoreV1().ConfigMaps(ns)
		if err := cms.Delete(ctx, "cm-01", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	started := time.Now()
	d.start()
	listening := time.Since(started)
	eventually(ctx, t, "the wrapped informers hold the API server's state after the restart", converged)
	took := time.Since(started)
	served := wrapCount(reg, "served")
	// The cluster goes on changing elsewhere, as a live one does: the new
	// daemon's informers start after where the fallback watches left off.
	elsewhere := createNamespace(ctx, t, "resync-elsewhere")
	ticker, err := admin.CoreV1().ConfigMaps(elsewhere).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ticker"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "every wrapped watch is back on the daemon", func() bool {
		ticker.Data = map[string]string{"t": time.Now().String()}
		if ticker, err = admin.CoreV1().ConfigMaps(elsewhere).Update(ctx, ticker, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return wrapCount(reg, "served") >= served+2*namespaces
	})
	back := time.Since(started)
	relists := lists() - listsBefore
	t.Logf("after kill -9: the daemon listened %v after its start; every wrapped informer held the API server's state %v after it, and was back on the daemon %v after it; "+
		"%d LISTs or WatchLists meanwhile; RESETs caught up %v, expired %v; requests served %v, fell back %v, passed %v (reads, by reason: %v)",
		listening.Round(time.Millisecond), took.Round(time.Millisecond), back.Round(time.Millisecond), relists,
		counterValue(reg, "informerd_client_wrap_resets_total", "caught_up"), counterValue(reg, "informerd_client_wrap_resets_total", "expired"),
		wrapCount(reg, "served"), wrapCount(reg, "fell_back"), wrapCount(reg, "passed"), wrapPassedReads(reg))
	if relists != 0 {
		t.Errorf("%d LISTs or WatchLists after the daemon's restart, want none: the wrapper answers the RESETs with the changes", relists)
	}
}

// counterValue returns the sum of name's counters with label value v (all
// of them if v is "").
func counterValue(reg *prometheus.Registry, name, v string) float64 {
	mfs, _ := reg.Gather()
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetValue() == v }) {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
