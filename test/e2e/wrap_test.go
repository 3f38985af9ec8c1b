package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/wrapconfig"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

// wrapIdentity creates a ServiceAccount that may do exactly perms, and
// returns a rest.Config that authenticates as it to the API server and a
// client of d's socket with its informerd token: what a pod that adopts
// WrapConfig has.
func wrapIdentity(ctx context.Context, t *testing.T, socket string, perms ...permission) (*rest.Config, *client.Client) {
	t.Helper()
	ns, name := newServiceAccount(t)
	grant(t, ns, name, perms...)
	token := mintToken(t, ns, name, auth.DefaultAudience)
	apiToken, err := controlplane.ServiceAccountToken(ctx, kubeClient(t), ns, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.RESTConfig())
	cfg.BearerToken = apiToken
	return cfg, dialWith(t, socket, client.WithToken(token))
}

// requestLog records the requests a config's clients make.
type requestLog struct {
	mu   sync.Mutex // guards urls
	urls []string
}

func (l *requestLog) wrap(cfg *rest.Config) {
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			l.mu.Lock()
			l.urls = append(l.urls, req.Method+" "+req.URL.RequestURI())
			l.mu.Unlock()
			return next.RoundTrip(req)
		})
	})
}

func (l *requestLog) any(substr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.urls, func(u string) bool { return strings.Contains(u, substr) })
}

// informerSet is a typed informer factory's Pods and ConfigMaps and a
// metadata-only informer of ConfigMaps, made from one config.
type informerSet struct {
	typed              informers.SharedInformerFactory
	meta               metadatainformer.SharedInformerFactory
	pods, cms, metaCMs toolscache.SharedIndexInformer
	stop               context.CancelFunc
}

func startInformers(ctx context.Context, t *testing.T, cfg *rest.Config, ns string) *informerSet {
	t.Helper()
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &informerSet{
		typed: informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(ns)),
		meta:  metadatainformer.NewFilteredSharedInformerFactory(mc, 0, ns, nil),
	}
	s.pods = s.typed.Core().V1().Pods().Informer()
	s.cms = s.typed.Core().V1().ConfigMaps().Informer()
	s.metaCMs = s.meta.ForResource(configMaps).Informer()
	ictx, stop := context.WithCancel(ctx)
	s.stop = func() { stop(); s.typed.Shutdown(); s.meta.Shutdown() }
	t.Cleanup(s.stop)
	s.typed.Start(ictx.Done())
	s.meta.Start(ictx.Done())
	for typ, ok := range s.typed.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v never synced", typ)
		}
	}
	for gvr, ok := range s.meta.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v never synced", gvr)
		}
	}
	return s
}

// state returns what the informers hold: key -> the object without
// managedFields (TestManagedFieldsServedWhole compares those), and the
// metadata informer's key -> resourceVersion and labels.
func (s *informerSet) state() (objs map[string]any, meta map[string]string) {
	objs, meta = map[string]any{}, map[string]string{}
	for kind, inf := range map[string]toolscache.SharedIndexInformer{"pod": s.pods, "cm": s.cms} {
		for _, o := range inf.GetStore().List() {
			m, _ := metav1Object(o) // a copy
			m.SetManagedFields(nil)
			objs[kind+" "+m.GetNamespace()+"/"+m.GetName()] = m
		}
	}
	for _, o := range s.metaCMs.GetStore().List() {
		m := o.(*metav1.PartialObjectMetadata)
		meta[m.Namespace+"/"+m.Name] = fmt.Sprintf("%s %v", m.ResourceVersion, m.Labels)
	}
	return objs, meta
}

func metav1Object(o any) (metav1.Object, bool) {
	switch o := o.(type) {
	case *corev1.Pod:
		o = o.DeepCopy()
		return o, true
	case *corev1.ConfigMap:
		o = o.DeepCopy()
		return o, true
	}
	return nil, false
}

// apiState lists what the API server holds in ns, as the informers key it.
func apiState(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	admin := kubeClient(t)
	out := map[string]string{}
	pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		out["pod "+ns+"/"+p.Name] = p.ResourceVersion
	}
	cms, err := admin.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cms.Items {
		out["cm "+ns+"/"+c.Name] = c.ResourceVersion
	}
	return out
}

func resourceVersions(objs map[string]any) map[string]string {
	out := map[string]string{}
	for k, o := range objs {
		m, _ := metav1Object(o)
		out[k] = m.GetResourceVersion()
	}
	return out
}

func wrapCount(reg *prometheus.Registry, outcome string) float64 {
	mfs, _ := reg.Gather()
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "informerd_client_wrap_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// TestWrapConfigInformersMatchDirect: a typed informer factory and a
// metadata-only informer, run once direct and once through WrapConfig with
// no other change, hold the same objects after a scripted sequence of
// changes, with WatchList on and off, in JSON and protobuf, across a
// daemon killed (-9) mid-run (the wrapped informers fall back to the
// API server) and restarted (new requests are served again). Every
// request of the wrapped informers is served or falls back: none is passed
// through.
func TestWrapConfigInformersMatchDirect(t *testing.T) {
	for _, tc := range []struct {
		name        string
		contentType string
		watchList   bool
	}{
		{"json", "application/json", false},
		{"json-watchlist", "application/json", true},
		{"protobuf", "application/vnd.kubernetes.protobuf", false},
		{"protobuf-watchlist", "application/vnd.kubernetes.protobuf", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, tc.watchList)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			ns := createNamespace(ctx, t, "wrap")
			admin := kubeClient(t)
			socket := filepath.Join(t.TempDir(), "informerd.sock")
			d := startDaemonProcess(t, socket)
			cfg, c := wrapIdentity(ctx, t, socket, reads(podsGVR, ns), reads(configMaps, ns))
			cfg.ContentType = tc.contentType
			reg := prometheus.NewRegistry()
			wrapped := wrapconfig.Wrap(cfg, c, wrapconfig.Options{ClientName: "wrapped", Registerer: reg})
			var log requestLog
			log.wrap(wrapped) // outside WrapConfig's transport: sees every request

			cm := func(name string, labels map[string]string) {
				t.Helper()
				if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string]string{"k": name}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			pod := func(name string) {
				t.Helper()
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/i"}}}}
				if _, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			update := func(name, label string) {
				t.Helper()
				o, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				o.Labels = map[string]string{"step": label}
				o.Data["k"] = label
				if _, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, o, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			del := func(kind, name string) {
				t.Helper()
				var err error
				if kind == "pod" {
					err = admin.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
				} else {
					err = admin.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{})
				}
				if err != nil {
					t.Fatal(err)
				}
			}

			cm("cm-1", nil)
			cm("cm-2", map[string]string{"a": "b"})
			cm("cm-3", nil)
			pod("pod-1")
			pod("pod-2")
			direct := startInformers(ctx, t, cfg, ns)
			viaDaemon := startInformers(ctx, t, wrapped, ns)

			update("cm-1", "one")
			del("cm", "cm-2")
			cm("cm-4", nil)
			pod("pod-3")

			d.signal(syscall.SIGKILL) // the daemon goes away mid-run: its streams are cut
			update("cm-3", "while-down")
			del("pod", "pod-2")
			cm("cm-5", nil)
			eventually(ctx, t, "the wrapped informers fall back to the API server", func() bool { return wrapCount(reg, "fell_back") > 0 })

			d.start() // back
			update("cm-4", "after")
			del("cm", "cm-1")
			pod("pod-4")

			// The API server's state, read again each time: kwok keeps
			// updating the pods' status.
			// The objects compared below are those of the same reads: a
			// later read may hold a status update one informer has seen
			// and the other not yet.
			var want, dRVs, wRVs map[string]string
			var dObjs, wObjs map[string]any
			var dMeta, wMeta map[string]string
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				want = apiState(ctx, t, ns)
				dObjs, dMeta = direct.state()
				wObjs, wMeta = viaDaemon.state()
				dRVs, wRVs = resourceVersions(dObjs), resourceVersions(wObjs)
				return apiequality.Semantic.DeepEqual(dRVs, want) && apiequality.Semantic.DeepEqual(wRVs, want), nil
			})
			if err != nil {
				t.Fatalf("the informers never held the API server's state %v:\ndirect  %v\nwrapped %v", want, dRVs, wRVs)
			}
			for k, o := range dObjs {
				if !apiequality.Semantic.DeepEqual(o, wObjs[k]) {
					t.Errorf("%s differs:\ndirect  %#v\nwrapped %#v", k, o, wObjs[k])
				}
			}
			wantCMs := 0
			for k := range want {
				if strings.HasPrefix(k, "cm ") {
					wantCMs++
				}
			}
			eventually(ctx, t, "the metadata-only informers hold the API server's ConfigMaps, and agree", func() bool {
				_, dMeta = direct.state()
				_, wMeta = viaDaemon.state()
				return len(dMeta) == wantCMs && apiequality.Semantic.DeepEqual(dMeta, wMeta)
			})

			// New requests go to the daemon again once it is back.
			served := wrapCount(reg, "served")
			kc := kubernetes.NewForConfigOrDie(wrapped)
			eventually(ctx, t, "requests are served by the daemon again", func() bool {
				_, err := kc.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
				return err == nil && wrapCount(reg, "served") > served
			})
			if n := wrapCount(reg, "passed"); n != 0 {
				t.Errorf("%v informer requests were passed through to the API server", n)
			}
			if got := log.any("sendInitialEvents=true"); got != tc.watchList {
				t.Errorf("WatchList requests made: %v, want %v", got, tc.watchList)
			}
		})
	}
}

// TestWrapConfigOneWatchForFiveClients: 5 processes' informers through
// WrapConfig cost the API server one watch per resource: once the first
// has synced, the other 4 add none.
func TestWrapConfigOneWatchForFiveClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "wrap-five")
	createConfigMap(ctx, t, ns, "a", nil)
	socket := filepath.Join(t.TempDir(), "informerd.sock")
	startDaemonAt(t, socket, cache.Options{})
	var first struct{ pods, cms int }
	for i := range 5 {
		cfg, c := wrapIdentity(ctx, t, socket, reads(podsGVR, ns), reads(configMaps, ns))
		// JSON: the metadata-only informer's view is of JSON too, so that
		// the typed and metadata informers share one daemon informer.
		cfg.ContentType = "application/json"
		s := startInformers(ctx, t, wrapconfig.Wrap(cfg, c, wrapconfig.Options{ClientName: fmt.Sprintf("process-%d", i)}), ns)
		if _, ok, _ := s.cms.GetStore().GetByKey(ns + "/a"); !ok {
			t.Fatalf("process %d does not see ConfigMap a", i)
		}
		if i == 0 {
			eventually(ctx, t, "the daemon's upstream watches", func() bool {
				first.pods, first.cms = upstreamWatches(t, podsGVR), upstreamWatches(t, configMaps)
				return first.pods >= 1 && first.cms >= 1
			})
		}
	}
	hold(ctx, 2*time.Second) // let any new watch reach the audit log
	// Earlier tests' watches may still be closing: the count may fall, never rise.
	if pods, cms := upstreamWatches(t, podsGVR), upstreamWatches(t, configMaps); pods > first.pods || cms > first.cms {
		t.Errorf("5 wrapped processes: %d pod and %d ConfigMap watches on the API server, %d and %d with the first alone",
			pods, cms, first.pods, first.cms)
	}
}

func wrapCountReason(reg *prometheus.Registry, outcome, reason string) float64 {
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
			if labels["outcome"] == outcome && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestWrapConfigRBAC: a wrapped client of namespace A gets, for namespace
// B, the API server's own 403 Status: passed through by default, and in
// the API server's shape from the daemon's denial in strict mode.
func TestWrapConfigRBAC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nsA, nsB := createNamespace(ctx, t, "wrap-a"), createNamespace(ctx, t, "wrap-b")
	d := startDaemon(t, cache.Options{})
	cfg, c := wrapIdentity(ctx, t, d.socket, reads(configMaps, nsA))
	cfg.ContentType = "application/json"
	direct := kubernetes.NewForConfigOrDie(cfg)
	_, listErr := direct.CoreV1().ConfigMaps(nsB).List(ctx, metav1.ListOptions{})
	_, watchErr := direct.CoreV1().ConfigMaps(nsB).Watch(ctx, metav1.ListOptions{})
	for _, want := range []error{listErr, watchErr} {
		if !apierrors.IsForbidden(want) {
			t.Fatalf("direct: %v, want 403", want)
		}
	}
	for _, strict := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		wrapped := kubernetes.NewForConfigOrDie(wrapconfig.Wrap(cfg, c, wrapconfig.Options{Strict: strict, Registerer: reg}))
		if _, err := wrapped.CoreV1().ConfigMaps(nsA).List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatalf("strict %v: namespace A: %v", strict, err)
		}
		_, lerr := wrapped.CoreV1().ConfigMaps(nsB).List(ctx, metav1.ListOptions{})
		_, werr := wrapped.CoreV1().ConfigMaps(nsB).Watch(ctx, metav1.ListOptions{})
		for i, got := range []error{lerr, werr} {
			want := []error{listErr, watchErr}[i]
			var gs, ws *apierrors.StatusError
			if !errors.As(got, &gs) || !errors.As(want, &ws) || !apiequality.Semantic.DeepEqual(gs.ErrStatus, ws.ErrStatus) {
				t.Errorf("strict %v: namespace B: %#v\nwant the API server's %#v", strict, got, want)
			}
		}
		outcome := "passed"
		if strict {
			outcome = "refused"
		}
		if n := wrapCountReason(reg, outcome, "denied"); n != 2 {
			t.Errorf("strict %v: %s for denied: %v, want 2", strict, outcome, n)
		}
	}
}

// TestWrapConfigPassesThrough: writes, a GET of one object, a log
// request, a Table request and a list the daemon cannot answer exactly
// (an Exact resourceVersion) reach the API server untouched, with the
// config's credentials; in strict mode they fail.
func TestWrapConfigPassesThrough(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "wrap-pass")
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ns))
	admin := kubeClient(t)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/i"}}}}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod that does not exist: the API server's answer does not depend
	// on kwok's progress with one that does.
	_, directLogErr := admin.CoreV1().Pods(ns).GetLogs("missing", &corev1.PodLogOptions{}).DoRaw(ctx)
	if !apierrors.IsNotFound(directLogErr) {
		t.Fatalf("direct logs of a missing pod: %v", directLogErr)
	}

	reg := prometheus.NewRegistry()
	kc := kubernetes.NewForConfigOrDie(wrapconfig.Wrap(env.RESTConfig(), c, wrapconfig.Options{Registerer: reg}))
	cm, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "written"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if got, err := kc.CoreV1().ConfigMaps(ns).Get(ctx, "written", metav1.GetOptions{}); err != nil || got.UID != cm.UID {
		t.Fatalf("get: %v %v", got, err)
	}
	_, logErr := kc.CoreV1().Pods(ns).GetLogs("missing", &corev1.PodLogOptions{}).DoRaw(ctx)
	if fmt.Sprint(logErr) != fmt.Sprint(directLogErr) {
		t.Errorf("logs: %v, want the API server's %v", logErr, directLogErr)
	}
	table, err := kc.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/"+ns+"/configmaps").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil || !strings.Contains(string(table), `"kind":"Table"`) {
		t.Errorf("Table: %s %v", table, err)
	}
	list, err := kc.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{ResourceVersion: cm.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if err != nil || list.ResourceVersion != cm.ResourceVersion {
		t.Errorf("exact list: %v %v, want the API server's at %s", list, err, cm.ResourceVersion)
	}
	for reason, n := range map[string]float64{"method": 1, "not_list": 2, "format": 1, "exact_rv": 1} {
		if got := wrapCountReason(reg, "passed", reason); got != n {
			t.Errorf("passed for %s: %v, want %v", reason, got, n)
		}
	}
	if n := wrapCount(reg, "served"); n != 0 {
		t.Errorf("served %v of them", n)
	}

	strict := kubernetes.NewForConfigOrDie(wrapconfig.Wrap(env.RESTConfig(), c, wrapconfig.Options{Strict: true}))
	if _, err := strict.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "strict"}}, metav1.CreateOptions{}); !errors.Is(err, wrapconfig.ErrNotServed) {
		t.Errorf("strict create: %v, want ErrNotServed", err)
	}
	if _, err := strict.CoreV1().Pods(ns).GetLogs("p", &corev1.PodLogOptions{}).DoRaw(ctx); !errors.Is(err, wrapconfig.ErrNotServed) {
		t.Errorf("strict logs: %v, want ErrNotServed", err)
	}
}

// TestInformerctlProxyWithKubectl: the real kubectl, pointed at
// informerctl proxy with --server, lists and watches (a label selector)
// through the daemon, as the token's ServiceAccount, and writes through
// the API server with the kubeconfig's credentials.
func TestInformerctlProxyWithKubectl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := controlplane.BinDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(bin, "kubectl")
	ns := createNamespace(ctx, t, "wrap-proxy")
	admin := kubeClient(t)
	labeled := func(name string) {
		t.Helper()
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "x"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	labeled("one")
	createConfigMap(ctx, t, ns, "unlabeled", nil)
	d := startDaemon(t, cache.Options{})
	token := tokenFile(t, reads(configMaps, ns)) // reads only
	p := startCtl(t, informerctlBin.build(t), "-address", d.socket, "-token-file", token, "proxy", "-port", "0", "-kubeconfig", env.KubeconfigPath)
	lines := p.next(ctx, "the proxy serves", func(l string) bool { return strings.HasPrefix(l, "Starting to serve on ") })
	server := "http://" + strings.TrimPrefix(lines[len(lines)-1], "Starting to serve on ")

	out, err := exec.CommandContext(ctx, kubectl, "--server", server, "get", "configmaps", "-n", ns, "-o", "json").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"name": "one"`) || !strings.Contains(string(out), `"name": "unlabeled"`) {
		t.Fatalf("kubectl get -o json: %v\n%s", err, out)
	}
	w := startCtl(t, kubectl, "--server", server, "get", "configmaps", "-n", ns, "-l", "app=x", "-w", "-o", "json")
	w.next(ctx, "the watch's initial object", func(l string) bool { return strings.Contains(l, `"name": "one"`) })
	if out, err := exec.CommandContext(ctx, kubectl, "--server", server, "create", "configmap", "written", "-n", ns).CombinedOutput(); err != nil {
		t.Fatalf("kubectl create through the proxy (the kubeconfig's credentials): %v\n%s", err, out)
	}
	labeled("two")
	got := w.next(ctx, "the watch's new object", func(l string) bool { return strings.Contains(l, `"name": "two"`) })
	for _, l := range got {
		if strings.Contains(l, `"name": "unlabeled"`) || strings.Contains(l, `"name": "written"`) {
			t.Errorf("the label selector's watch printed %q", l)
		}
	}
	// The reads went through the daemon: its proxy streams held the informer.
	infs, err := d.dial(t, introspects).API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	held := false
	for _, inf := range infs.GetInformers() {
		for _, s := range inf.GetSubscribers() {
			held = held || (s.GetClientName() == "informerctl-proxy" && inf.GetResource().GetResource() == "configmaps")
		}
	}
	if !held {
		t.Errorf("no informerctl-proxy stream on the daemon's ConfigMaps informer: %v", infs)
	}
}
