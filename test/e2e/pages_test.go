package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/pager"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client/wrapconfig"
	"github.com/informerd/informerd/test/controlplane"
)

// names returns the namespace/name of each of l's items.
func names(l *corev1.ConfigMapList) []string {
	var out []string
	for _, cm := range l.Items {
		out = append(out, cm.Namespace+"/"+cm.Name)
	}
	return out
}

// TestWrapConfigListsInTheAPIServersOrder: across namespaces whose names
// prefix one another ("ns-two/a" before "ns/a" before "ns0/a"), a list
// and the initial events of a watch come in the API server's order, and
// a limit pages as the API server pages.
func TestWrapConfigListsInTheAPIServersOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubeClient(t)
	base := createNamespace(ctx, t, "order")
	namespaces := []string{base, base + "-two", base + "0", base[:len(base)-1]}
	for _, ns := range namespaces[1:] {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	for _, ns := range namespaces {
		for _, name := range []string{"a", "a-b", "b", "a0"} {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"order": base}}}
			if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ""))
	wrapped := kubernetes.NewForConfigOrDie(wrapconfig.Wrap(env.RESTConfig(), c, wrapconfig.Options{}))
	sel := metav1.ListOptions{LabelSelector: "order=" + base}

	direct, err := admin.CoreV1().ConfigMaps("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	want := names(direct)
	if len(want) != 16 || !slices.IsSortedFunc(want, strings.Compare) {
		t.Fatalf("the API server listed %v: not 16 in byte order", want)
	}
	got, err := wrapped.CoreV1().ConfigMaps("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names(got), want) {
		t.Errorf("wrapped list\n%v\nwant the API server's\n%v", names(got), want)
	}
	w, err := wrapped.CoreV1().ConfigMaps("").Watch(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	var initial []string
	for len(initial) < len(want) {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-ctx.Done():
			t.Fatalf("the watch's initial events: %v, then none", initial)
		}
		cm, ok := ev.Object.(*corev1.ConfigMap)
		if !ok {
			t.Fatalf("watch: %v %T", ev.Type, ev.Object)
		}
		initial = append(initial, cm.Namespace+"/"+cm.Name)
	}
	w.Stop()
	if !slices.Equal(initial, want) {
		t.Errorf("a watch's initial events\n%v\nwant the API server's list order\n%v", initial, want)
	}

	// Pages of one namespace, without a selector: items, continue start
	// keys and remainingItemCount as the API server's.
	type page struct {
		items     []string
		start     string
		remaining string
	}
	pages := func(kc kubernetes.Interface) []page {
		var out []page
		o := metav1.ListOptions{Limit: 2}
		for {
			l, err := kc.CoreV1().ConfigMaps(base).List(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			p := page{items: names(l), remaining: "none"}
			if l.RemainingItemCount != nil {
				p.remaining = fmt.Sprint(*l.RemainingItemCount)
			}
			if l.Continue != "" {
				_, p.start, _ = strings.Cut(decodeToken(t, l.Continue), `"start":`)
			}
			out = append(out, p)
			if l.Continue == "" {
				return out
			}
			o.Continue = l.Continue
		}
	}
	if dp, wp := pages(admin), pages(wrapped); fmt.Sprint(dp) != fmt.Sprint(wp) {
		t.Errorf("wrapped pages\n%v\nwant the API server's\n%v", wp, dp)
	}
	// The wrapper's token is the API server's: it continues there.
	first, err := wrapped.CoreV1().ConfigMaps(base).List(ctx, metav1.ListOptions{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	rest2, err := admin.CoreV1().ConfigMaps(base).List(ctx, metav1.ListOptions{Limit: 10, Continue: first.Continue})
	if err != nil {
		t.Fatalf("the API server refused the wrapper's token: %v", err)
	}
	if all := append(names(first), names(rest2)...); !slices.Equal(all, names(mustList(ctx, t, admin, base))) {
		t.Errorf("wrapper's page then the API server's: %v", all)
	}
	// Across namespaces too (a selector: the API server's token may lead
	// to an empty page; the items are what counts).
	firstAll, err := wrapped.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: sel.LabelSelector, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	restAll, err := admin.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: sel.LabelSelector, Continue: firstAll.Continue})
	if err != nil {
		t.Fatalf("the API server refused the wrapper's token across namespaces: %v", err)
	}
	if all := append(names(firstAll), names(restAll)...); !slices.Equal(all, want) {
		t.Errorf("wrapper's page across namespaces then the API server's: %v, want %v", all, want)
	}
	// client-go's pager pages through the wrapper as direct.
	var paged []string
	p := pager.New(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return wrapped.CoreV1().ConfigMaps("").List(ctx, o)
	})
	p.PageSize = 3
	if err := p.EachListItem(ctx, sel, func(o runtime.Object) error {
		cm := o.(*corev1.ConfigMap)
		paged = append(paged, cm.Namespace+"/"+cm.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(paged, want) {
		t.Errorf("pager through the wrapper: %v, want %v", paged, want)
	}

	// kubectl --chunk-size through informerctl proxy prints what it
	// prints direct.
	bin, err := controlplane.BinDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	token := tokenFile(t, reads(configMaps, ""))
	proxy := startCtl(t, informerctlBin.build(t), "-address", d.socket, "-token-file", token, "proxy", "-port", "0", "-kubeconfig", env.KubeconfigPath)
	lines := proxy.next(ctx, "the proxy serves", func(l string) bool { return strings.HasPrefix(l, "Starting to serve on ") })
	server := "http://" + strings.TrimPrefix(lines[len(lines)-1], "Starting to serve on ")
	kubectl := func(args ...string) string {
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append(args, "get", "configmaps", "-A", "-l", sel.LabelSelector,
			"--chunk-size=3", "-o", "custom-columns=NS:.metadata.namespace,NAME:.metadata.name")...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if direct, proxied := kubectl("--kubeconfig", env.KubeconfigPath), kubectl("--server", server); direct != proxied {
		t.Errorf("kubectl --chunk-size=3 through the proxy:\n%s\ndirect:\n%s", proxied, direct)
	}

	// The envelope around the items, byte for byte.
	rvs, tokens := regexp.MustCompile(`"resourceVersion":"[0-9]+"`), regexp.MustCompile(`"continue":"[^"]*"`)
	envelope := func(b []byte) string {
		j, k := bytes.Index(b, []byte(`"items":[`)), bytes.LastIndex(b, []byte("]"))
		if j < 0 || k < 0 {
			return string(b)
		}
		head := tokens.ReplaceAllString(rvs.ReplaceAllString(string(b[:j]), `"resourceVersion":RV`), `"continue":TOKEN`)
		return head + `"items":[...` + string(b[k:])
	}
	raw := func(kc kubernetes.Interface) string {
		b, err := kc.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/"+base+"/configmaps").Param("limit", "2").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return envelope(b)
	}
	if dr, wr := raw(admin), raw(wrapped); dr != wr {
		t.Errorf("wrapped envelope\n%q\nwant the API server's\n%q", wr, dr)
	}
}

func mustList(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns string) *corev1.ConfigMapList {
	t.Helper()
	l, err := kc.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func decodeToken(t *testing.T, s string) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("continue token %q: %v", s, err)
	}
	return string(b)
}

// TestWrapConfigReadsItsWrites: 100 ConfigMaps created, updated and
// deleted through a wrapped config, each followed at once by a list
// through it (JSON and protobuf), and through informerctl proxy: every
// list reflects the write before it.
func TestWrapConfigReadsItsWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "ryw")
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ""))
	for _, tc := range []struct{ name, contentType string }{
		{"json", "application/json"},
		{"protobuf", "application/vnd.kubernetes.protobuf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			cfg := wrapconfig.Wrap(env.RESTConfig(), c, wrapconfig.Options{Registerer: reg})
			cfg.ContentType = tc.contentType
			readsItsWrites(ctx, t, kubernetes.NewForConfigOrDie(cfg), ns, tc.name)
			// Served by the daemon, not passed through to be fresh.
			if served, stale := wrapCount(reg, "served"), wrapCountReason(reg, "passed", "stale"); served != 300 || stale != 0 {
				t.Errorf("%v of 300 lists served, %v passed through as stale", served, stale)
			}
		})
	}
	t.Run("proxy", func(t *testing.T) {
		token := tokenFile(t, reads(configMaps, ""))
		p := startCtl(t, informerctlBin.build(t), "-address", d.socket, "-token-file", token, "proxy", "-port", "0", "-kubeconfig", env.KubeconfigPath)
		lines := p.next(ctx, "the proxy serves", func(l string) bool { return strings.HasPrefix(l, "Starting to serve on ") })
		server := "http://" + strings.TrimPrefix(lines[len(lines)-1], "Starting to serve on ")
		unthrottled := &rest.Config{Host: server, QPS: -1} // client-go's default, 5 per second, would be what is measured
		readsItsWrites(ctx, t, kubernetes.NewForConfigOrDie(unthrottled), ns, "proxy")
	})
}

func readsItsWrites(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns, prefix string) {
	t.Helper()
	cms := kc.CoreV1().ConfigMaps(ns)
	stale := map[string]int{}
	listed := func() map[string]corev1.ConfigMap {
		l, err := cms.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]corev1.ConfigMap{}
		for _, cm := range l.Items {
			m[cm.Name] = cm
		}
		return m
	}
	const n = 100
	start := time.Now()
	defer func() {
		t.Logf("%s: %d creates, updates and deletes, each with a list, in %v", prefix, n, time.Since(start))
	}()
	for i := range n {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := listed()[name]; !ok {
			stale["created"]++
		}
	}
	for i := range n {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		cm, err := cms.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "2"}}, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := listed()[name]; got.Data["v"] != "2" || got.ResourceVersion != cm.ResourceVersion {
			stale["updated"]++
		}
	}
	for i := range n {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := listed()[name]; ok {
			stale["deleted"]++
		}
	}
	if len(stale) > 0 {
		t.Errorf("stale lists after the caller's own writes, of %d each: %v", n, stale)
	}
}
