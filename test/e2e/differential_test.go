package e2e

import (
	"context"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/wrapconfig"
	"github.com/informerd/informerd/test/controlplane"
)

// diffKind is a kind of difference the table meets: how to recognise an
// entry of differences as one, and why it is allowed where it is.
type diffKind struct {
	reason string
	match  func(entry string) bool
}

// diffKinds are the differences left, each a deliberate one documented in
// docs/adoption.md, named by where.
var diffKinds = map[string]diffKind{
	"pagination": {
		"deliberate (docs/adoption.md, Pagination): with a selector, the API server may end a page with a continue token whose next page is empty (it counts the objects it scanned); the daemon holds only the matching objects and sends no token once none remain",
		func(e string) bool { return strings.Contains(e, "page ") },
	},
}

// diffAllowed are the shapes whose answers through WrapConfig or
// informerctl proxy may differ from the API server's, by the kinds of
// diffKinds named. A difference of a shape that no kind allowed for it
// explains fails TestDifferentialAgainstAPIServer; an allowed kind that a
// shape no longer shows fails it too, so that the list stays exact.
var diffAllowed = map[string][]string{
	"limit 2 continue chain across namespaces": {"pagination"},
	"limit 1 continue chain, namespaces":       {"pagination"},
	"limit 1 with a label selector":            {"pagination"},
	"limit with protobuf":                      {"pagination"},
}

// diffFixture is what the table reads: three namespaces whose storage
// order (ns-two, ns, ns0: '-' < '/' < '0') is not their (namespace, name)
// order, ConfigMaps and custom resources in them, labelled cluster-scoped
// objects, and the resourceVersions around the writes.
type diffFixture struct {
	base            string // the namespace "ns"; also the label value of everything made
	ns, nsTwo, ns0  string
	group           string // the custom resource's API group
	restricted      string // the restricted ServiceAccount's user name
	rvStart, rvLast string // before the first write to ConfigMaps and custom resources, after the last
	floor           uint64 // rvLast as a number
	admin, limited  []*target
	proxyURL        string // the admin's informerctl proxy
}

var widgetKind = "Widget"

func newDiffFixture(ctx context.Context, t *testing.T) *diffFixture {
	t.Helper()
	admin := kubeClient(t)
	fx := &diffFixture{base: "dt" + utilrand.String(6)}
	fx.ns, fx.nsTwo, fx.ns0 = fx.base, fx.base+"-two", fx.base+"0"
	fx.group = fx.base + ".example.com"
	label := map[string]string{"difftest": fx.base}
	for _, name := range []string{fx.ns, fx.nsTwo, fx.ns0} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: label}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	for _, name := range []string{fx.ns, fx.nsTwo, fx.ns0} {
		eventually(ctx, t, "kube-root-ca.crt in "+name, func() bool {
			_, err := admin.CoreV1().ConfigMaps(name).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
			return err == nil
		})
	}
	for _, name := range []string{"a", "b"} {
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: fx.base + "-" + name, Labels: label}}
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), cr.Name, metav1.DeleteOptions{})
		})
	}
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	widgets := schema.GroupVersionResource{Group: fx.group, Version: "v1", Resource: "widgets"}
	createCRD(ctx, t, dyn, widgets, widgetKind)

	before, err := admin.CoreV1().ConfigMaps(fx.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fx.rvStart = before.ResourceVersion
	for _, ns := range []string{fx.ns, fx.nsTwo, fx.ns0} {
		for name, tier := range map[string]string{"a": "db", "b": "web"} {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"difftest": fx.base, "tier": tier}}, Data: map[string]string{"k": name}}
			if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if ns == fx.ns0 {
			continue
		}
		for _, name := range []string{"w1", "w2"} {
			w := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": fx.group + "/v1", "kind": widgetKind,
				"metadata": map[string]any{"name": name, "labels": map[string]any{"difftest": fx.base}},
				"spec":     map[string]any{"size": int64(len(name))},
			}}
			if _, err := dyn.Resource(widgets).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	a, err := admin.CoreV1().ConfigMaps(fx.ns).Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Data["k"] = "updated"
	if _, err := admin.CoreV1().ConfigMaps(fx.ns).Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	gone := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gone", Labels: label}}
	if _, err := admin.CoreV1().ConfigMaps(fx.ns).Create(ctx, gone, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := admin.CoreV1().ConfigMaps(fx.ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	after, err := admin.CoreV1().ConfigMaps(fx.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fx.rvLast = after.ResourceVersion
	fx.floor, _ = strconv.ParseUint(fx.rvLast, 10, 64)

	// One daemon for the whole table; the admin's wrapped config and proxy
	// read through it as a ServiceAccount that may read everything, the
	// restricted ones as a ServiceAccount that may read ConfigMaps in ns.
	d := startDaemon(t, cache.Options{})
	fx.admin = fx.targets(ctx, t, d, "", env.RESTConfig(), env.KubeconfigPath, readsAll)
	saNS, saName := newServiceAccount(t)
	fx.restricted = "system:serviceaccount:" + saNS + ":" + saName
	grant(t, saNS, saName, reads(configMaps, fx.ns))
	apiToken, err := controlplane.ServiceAccountToken(ctx, admin, saNS, saName)
	if err != nil {
		t.Fatal(err)
	}
	limitedCfg := rest.AnonymousClientConfig(env.RESTConfig())
	limitedCfg.BearerToken = apiToken
	fx.limited = fx.targets(ctx, t, d, saNS+"/"+saName, limitedCfg, tokenKubeconfig(t, apiToken))
	return fx
}

// targets returns the API server, WrapConfig and informerctl proxy for one
// identity: cfg and kubeconfig authenticate to the API server; the daemon
// token is sa's (an existing ServiceAccount "ns/name"), or a new one's
// with perms.
func (fx *diffFixture) targets(ctx context.Context, t *testing.T, d *testDaemon, sa string, cfg *rest.Config, kubeconfig string, perms ...permission) []*target {
	t.Helper()
	var token string
	if sa != "" {
		ns, name, _ := strings.Cut(sa, "/")
		token = mintToken(t, ns, name, auth.DefaultAudience)
	} else {
		token = identity(t, perms...)
	}
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	c := dialWith(t, d.socket, client.WithToken(token))
	reg := prometheus.NewRegistry()
	wrapped := wrapconfig.Wrap(cfg, c, wrapconfig.Options{ClientName: "difftest", Registerer: reg})
	p := startCtl(t, informerctlBin.build(t), "-address", d.socket, "-token-file", tokenPath, "proxy", "-port", "0", "-kubeconfig", kubeconfig)
	lines := p.next(ctx, "the proxy serves", func(l string) bool { return strings.HasPrefix(l, "Starting to serve on ") })
	proxyURL := "http://" + strings.TrimPrefix(lines[len(lines)-1], "Starting to serve on ")
	if sa == "" {
		fx.proxyURL = proxyURL
	}
	wt := newTarget(t, "wrapconfig", wrapped, "")
	wt.reg = reg
	return []*target{
		newTarget(t, "direct", cfg, ""),
		wt,
		newTarget(t, "proxy", nil, proxyURL),
	}
}

// floorFor is the least list resourceVersion s may answer: the last write
// for a consistent read or one not older than it; none for reads at an
// older or an arbitrary resourceVersion.
func (fx *diffFixture) floorFor(s shape) uint64 {
	if strings.Contains(s.query, "resourceVersion=") && !strings.Contains(s.query, "resourceVersion="+fx.rvLast) ||
		strings.Contains(s.query, "watch") {
		return 0
	}
	return fx.floor
}

// diffShapes is the table: every list and watch parameter, formats, kinds,
// selectors, pagination, resourceVersions, errors, identities and paths.
func diffShapes(fx *diffFixture) []shape {
	ns, two, ns0, b := fx.ns, fx.nsTwo, fx.ns0, fx.base
	cm := "/api/v1/namespaces/" + ns + "/configmaps"
	cmAll := "/api/v1/configmaps"
	sel := "labelSelector=difftest%3D" + b
	wid := "/apis/" + fx.group + "/v1/namespaces/" + ns + "/widgets"
	widAll := "/apis/" + fx.group + "/v1/widgets"
	nss := "/api/v1/namespaces"
	roles := "/apis/rbac.authorization.k8s.io/v1/clusterroles"
	const (
		pb      = "application/vnd.kubernetes.protobuf"
		pomList = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
		pom     = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
		table   = "application/json;as=Table;g=meta.k8s.io;v=v1"
	)
	w := "watch=1&timeoutSeconds=1&"
	from := "resourceVersion=" + fx.rvStart
	imp := func(user string, groups ...string) http.Header {
		h := http.Header{"Impersonate-User": {user}}
		if len(groups) > 0 {
			h["Impersonate-Group"] = groups
		}
		return h
	}
	foreignContinue := func(path, query string) func(ctx context.Context, t *testing.T) string {
		return func(ctx context.Context, t *testing.T) string {
			v := view{}
			if cont := fx.admin[0].once(ctx, shape{path: path}, query, "", 0, v); cont != "" {
				return "continue=" + urlQueryEscape(cont)
			}
			t.Errorf("the API server issued no continue token for %s?%s: %v", path, query, v)
			return ""
		}
	}
	return []shape{
		// Kinds and namespaces.
		{name: "list configmaps in ns", path: cm},
		{name: "list configmaps in ns-two", path: "/api/v1/namespaces/" + two + "/configmaps"},
		{name: "list configmaps in ns0", path: "/api/v1/namespaces/" + ns0 + "/configmaps"},
		{name: "list configmaps across namespaces", path: cmAll, query: sel},
		{name: "list custom resources in ns", path: wid},
		{name: "list custom resources across namespaces", path: widAll, query: sel},
		{name: "list namespaces (cluster-scoped)", path: nss, query: sel},
		{name: "list clusterroles (cluster-scoped, a group)", path: roles, query: sel},
		{name: "list deployments (none)", path: "/apis/apps/v1/namespaces/" + ns + "/deployments"},
		{name: "list secrets (not served by default)", path: "/api/v1/namespaces/" + ns + "/secrets"},
		{name: "list configmaps in a namespace that does not exist", path: "/api/v1/namespaces/" + b + "-none/configmaps"},

		// Label selectors.
		{name: "labelSelector equality", path: cmAll, query: sel + "%2Ctier%3Dweb"},
		{name: "labelSelector double equals", path: cmAll, query: sel + "%2Ctier%3D%3Dweb"},
		{name: "labelSelector inequality", path: cmAll, query: sel + "%2Ctier%21%3Dweb"},
		{name: "labelSelector in", path: cmAll, query: sel + "%2Ctier+in+%28web%2Cdb%29"},
		{name: "labelSelector notin", path: cmAll, query: sel + "%2Ctier+notin+%28web%29"},
		{name: "labelSelector exists", path: cmAll, query: sel + "%2Ctier"},
		{name: "labelSelector does not exist", path: cmAll, query: sel + "%2C%21tier"},
		{name: "labelSelector matching nothing", path: cmAll, query: sel + "%2Ctier%3Dweb%2Ctier%3Ddb"},
		{name: "labelSelector bad syntax", path: cmAll, query: "labelSelector=tier+in+%28web"},
		{name: "labelSelector bad value", path: cm, query: "labelSelector=tier%3D%25%25"},
		{name: "labelSelector on a custom resource", path: widAll, query: sel},

		// Field selectors.
		{name: "fieldSelector metadata.name", path: cm, query: "fieldSelector=metadata.name%3Da"},
		{name: "fieldSelector metadata.name inequality", path: cm, query: "fieldSelector=metadata.name%21%3Da"},
		{name: "fieldSelector metadata.namespace across namespaces", path: cmAll, query: sel + "&fieldSelector=metadata.namespace%3D" + two},
		{name: "fieldSelector and labelSelector", path: cmAll, query: sel + "%2Ctier%3Dweb&fieldSelector=metadata.name%3Db"},
		{name: "fieldSelector unsupported field", path: cm, query: "fieldSelector=data.k%3Da"},
		{name: "fieldSelector bad syntax", path: cm, query: "fieldSelector=metadata.name"},
		{name: "fieldSelector on a custom resource", path: wid, query: "fieldSelector=metadata.name%3Dw1"},
		{name: "fieldSelector on namespaces", path: nss, query: sel + "&fieldSelector=metadata.name%3D" + two},

		// resourceVersion on lists.
		{name: "list resourceVersion 0", path: cm, query: "resourceVersion=0"},
		{name: "list resourceVersion 0 across namespaces", path: cmAll, query: sel + "&resourceVersion=0"},
		{name: "list resourceVersion exact", path: cm, query: "resourceVersion=" + fx.rvLast + "&resourceVersionMatch=Exact"},
		{name: "list resourceVersion exact, older", path: cm, query: from + "&resourceVersionMatch=Exact"},
		{name: "list resourceVersion NotOlderThan", path: cm, query: "resourceVersion=" + fx.rvLast + "&resourceVersionMatch=NotOlderThan"},
		{name: "list resourceVersion without match", path: cm, query: "resourceVersion=" + fx.rvLast},
		{name: "list resourceVersion NotOlderThan 0", path: cm, query: "resourceVersion=0&resourceVersionMatch=NotOlderThan"},
		{name: "list resourceVersion 1 exact (too old?)", path: cm, query: "resourceVersion=1&resourceVersionMatch=Exact"},
		{name: "list resourceVersion not a number", path: cm, query: "resourceVersion=abc"},
		{name: "list resourceVersionMatch Exact without resourceVersion", path: cm, query: "resourceVersionMatch=Exact"},
		{name: "list resourceVersionMatch unknown", path: cm, query: "resourceVersion=0&resourceVersionMatch=Bogus"},

		// Pagination.
		{name: "limit 1 continue chain", path: cm, query: "limit=1", pages: true},
		{name: "limit 2 continue chain across namespaces", path: cmAll, query: sel + "&limit=2", pages: true},
		{name: "limit 1 continue chain, custom resources", path: widAll, query: sel + "&limit=1", pages: true},
		{name: "limit 1 continue chain, namespaces", path: nss, query: sel + "&limit=1", pages: true},
		{name: "limit 1 with a label selector", path: cmAll, query: sel + "%2Ctier%3Dweb&limit=1", pages: true},
		{name: "limit larger than the list", path: cm, query: "limit=500"},
		{name: "limit 0", path: cm, query: "limit=0"},
		{name: "limit negative", path: cm, query: "limit=-1"},
		{name: "limit not a number", path: cm, query: "limit=abc"},
		{name: "limit with resourceVersion 0", path: cm, query: "limit=1&resourceVersion=0"},
		{name: "limit with an exact resourceVersion", path: cm, query: "limit=1&resourceVersionMatch=Exact&resourceVersion=" + fx.rvLast, pages: true},
		{name: "limit with protobuf", path: cmAll, query: sel + "&limit=2", accept: pb, pages: true},
		{name: "continue token from the API server", path: cmAll, query: sel + "&limit=2", prep: foreignContinue(cmAll, sel+"&limit=2")},
		{name: "continue token garbage", path: cm, query: "limit=1&continue=garbage"},
		{name: "list timeout parameter", path: cm, query: "timeout=5s"},

		// Formats.
		{name: "protobuf list", path: cm, accept: pb},
		{name: "protobuf list across namespaces", path: cmAll, query: sel, accept: pb},
		{name: "protobuf list of namespaces", path: nss, query: sel, accept: pb},
		{name: "protobuf list of a custom resource (not acceptable)", path: wid, accept: pb},
		{name: "protobuf or JSON list of a custom resource", path: wid, accept: pb + ", application/json"},
		{name: "PartialObjectMetadataList", path: cm, accept: pomList},
		{name: "PartialObjectMetadataList across namespaces", path: cmAll, query: sel, accept: pomList},
		{name: "PartialObjectMetadataList of a custom resource", path: wid, accept: pomList},
		{name: "PartialObjectMetadataList in protobuf", path: cm, accept: "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"},
		{name: "PartialObjectMetadata (not a list) for a list", path: cm, accept: pom},
		{name: "Table (passed through)", path: cm, accept: table},
		{name: "Table across namespaces", path: cmAll, query: sel, accept: table + ", application/json"},
		{name: "Accept */*", path: cm, accept: "*/*"},
		{name: "Accept JSON with a fallback", path: cm, accept: "application/json, */*"},
		{name: "Accept YAML", path: cm, accept: "application/yaml"},
		{name: "Accept unknown", path: cm, accept: "text/html"},

		// Errors.
		{name: "unknown resource", path: "/api/v1/namespaces/" + ns + "/widgets"},
		{name: "unknown group", path: "/apis/nope.example.com/v1/things"},
		{name: "unknown version", path: "/api/v2/configmaps"},
		{name: "unknown parameter", path: cm, query: "bogus=1"},
		{name: "repeated parameter", path: cm, query: "limit=1&limit=2"},
		{name: "restricted: allowed namespace", path: cm, who: "restricted"},
		{name: "restricted: forbidden namespace", path: "/api/v1/namespaces/" + two + "/configmaps", who: "restricted"},
		{name: "restricted: all namespaces", path: cmAll, query: sel, who: "restricted"},
		{name: "restricted: another resource", path: wid, who: "restricted"},
		{name: "restricted: watch a forbidden namespace", path: "/api/v1/namespaces/" + two + "/configmaps", query: w, who: "restricted"},
		{name: "restricted: watch the allowed namespace", path: cm, query: w + "resourceVersion=" + fx.rvLast, who: "restricted"},

		// Impersonation.
		{name: "impersonating the restricted user, forbidden namespace", path: "/api/v1/namespaces/" + two + "/configmaps", header: imp(fx.restricted)},
		{name: "impersonating the restricted user, allowed namespace", path: cm, header: imp(fx.restricted)},
		{name: "impersonating a user and a group", path: cm, header: imp("someone", "system:authenticated")},
		{name: "impersonating, watch", path: "/api/v1/namespaces/" + two + "/configmaps", query: w, header: imp(fx.restricted)},

		// Paths.
		{name: "path with a double leading slash", path: "/" + cm},
		{name: "path with a trailing slash", path: cm + "/"},
		{name: "path across namespaces with a double slash", path: "//api/v1/configmaps", query: sel},
		{name: "path with an empty segment", path: "/api//v1/configmaps", query: sel},
		{name: "path with a percent-encoded resource", path: "/api/v1/namespaces/" + ns + "/config%6Daps"},
		{name: "path with a percent-encoded namespace", path: "/api/v1/namespaces/" + strings.Replace(ns, "d", "%64", 1) + "/configmaps"},
		{name: "path with an empty namespace", path: "/api/v1/namespaces//configmaps"},
		{name: "path with a dot segment", path: "/api/v1/namespaces/" + ns + "/./configmaps"},
		{name: "path with a dot-dot segment", path: "/api/v1/namespaces/" + ns + "/x/../configmaps"},
		{name: "path of a custom resource with a trailing slash", path: wid + "/"},
		{name: "legacy watch path", path: "/api/v1/watch/namespaces/" + ns + "/configmaps", query: "timeoutSeconds=1&" + from},

		// Watches: the parameter watch.
		{name: "watch=1", path: cm, query: w + from},
		{name: "watch=true", path: cm, query: "watch=true&timeoutSeconds=1&" + from},
		{name: "watch=t", path: cm, query: "watch=t&timeoutSeconds=1&" + from},
		{name: "watch=f", path: cm, query: "watch=f&timeoutSeconds=1&" + from},
		{name: "watch=yes", path: cm, query: "watch=yes&timeoutSeconds=1&" + from},
		{name: "watch=false", path: cm, query: "watch=false&timeoutSeconds=1"},
		{name: "watch=0", path: cm, query: "watch=0&timeoutSeconds=1"},
		{name: "watch empty", path: cm, query: "watch=&timeoutSeconds=1"},

		// Watches: resourceVersion.
		{name: "watch from a recent resourceVersion", path: cm, query: w + from},
		{name: "watch from a recent resourceVersion across namespaces", path: cmAll, query: w + sel + "&" + from},
		{name: "watch from the last resourceVersion", path: cm, query: w + "resourceVersion=" + fx.rvLast},
		{name: "watch without resourceVersion", path: cm, query: w},
		{name: "watch without resourceVersion across namespaces", path: cmAll, query: w + sel},
		{name: "watch resourceVersion 0 across namespaces", path: cmAll, query: w + sel + "&resourceVersion=0"},
		{name: "watch resourceVersion 1", path: cm, query: w + "resourceVersion=1"},
		{name: "watch resourceVersion not a number", path: cm, query: w + "resourceVersion=abc"},
		{name: "watch timeoutSeconds not a number", path: cm, query: "watch=1&timeoutSeconds=abc"},

		// Watches: bookmarks and initial events.
		{name: "allowWatchBookmarks=true", path: cm, query: "watch=1&timeoutSeconds=3&allowWatchBookmarks=true&resourceVersion=" + fx.rvLast},
		{name: "allowWatchBookmarks=f", path: cm, query: "watch=1&timeoutSeconds=3&allowWatchBookmarks=f&resourceVersion=" + fx.rvLast},
		{name: "allowWatchBookmarks=false", path: cm, query: "watch=1&timeoutSeconds=3&allowWatchBookmarks=false&resourceVersion=" + fx.rvLast},
		{name: "sendInitialEvents", path: cm, query: w + "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"},
		{name: "sendInitialEvents across namespaces", path: cmAll, query: w + sel + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"},
		{name: "sendInitialEvents custom resources", path: widAll, query: w + sel + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"},
		{name: "sendInitialEvents from a resourceVersion", path: cm, query: w + from + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"},
		{name: "sendInitialEvents without resourceVersionMatch", path: cm, query: w + "sendInitialEvents=true&allowWatchBookmarks=true"},
		{name: "sendInitialEvents without bookmarks", path: cm, query: w + "sendInitialEvents=true&resourceVersionMatch=NotOlderThan"},
		{name: "sendInitialEvents=false", path: cm, query: w + "sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=" + fx.rvLast},
		{name: "sendInitialEvents protobuf", path: cm, accept: pb, query: w + "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"},

		// Watches: selectors, kinds and formats.
		{name: "watch set-based selector across namespaces", path: cmAll, query: w + sel + "%2Ctier+in+%28web%29&" + from},
		{name: "watch fieldSelector", path: cm, query: w + "fieldSelector=metadata.name%3Da&" + from},
		{name: "watch fieldSelector of a deleted object", path: cm, query: w + "fieldSelector=metadata.name%3Dgone&" + from},
		{name: "watch bad labelSelector", path: cm, query: w + "labelSelector=a+in+%28"},
		{name: "watch custom resources", path: widAll, query: w + sel + "&" + from},
		{name: "watch namespaces", path: nss, query: w + sel},
		{name: "watch clusterroles", path: roles, query: w + sel},
		{name: "watch protobuf", path: cm, accept: pb, query: w + from},
		{name: "watch PartialObjectMetadata", path: cm, accept: pom, query: w + from},
		{name: "watch PartialObjectMetadata protobuf", path: cm, accept: "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", query: w + from},
		{name: "watch Table", path: cm, accept: table, query: w + "resourceVersion=" + fx.rvLast},
		{name: "watch unknown resource", path: "/api/v1/namespaces/" + ns + "/widgets", query: w},

		// Last: WrapConfig takes the daemon's slow answer at a future
		// resourceVersion for an outage, and falls back on the API server
		// for a while: shapes after these would be compared with the API
		// server's own answers.
		{name: "list resourceVersion future", path: cm, query: "resourceVersion=" + strconv.FormatUint(fx.floor+1000000, 10)},
		{name: "watch resourceVersion future", path: cm, query: w + "resourceVersion=" + strconv.FormatUint(fx.floor+1000000, 10)},
	}
}

// TestDifferentialAgainstAPIServer sends every shape of the table to the
// API server, through WrapConfig and through informerctl proxy, and
// compares the answers (status, headers that matter, list metadata, items
// and their order, objects byte for byte, envelopes' key order, watch
// events and their framing). A difference not in diffAllowed fails.
func TestDifferentialAgainstAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fx := newDiffFixture(ctx, t)
	shapes := diffShapes(fx)
	if len(shapes) < 100 {
		t.Fatalf("%d shapes, want at least 100", len(shapes))
	}
	names := map[string]bool{}
	for _, s := range shapes {
		if names[s.name] {
			t.Fatalf("two shapes named %q", s.name)
		}
		names[s.name] = true
	}
	for name, kinds := range diffAllowed {
		if !names[name] && !strings.HasPrefix(name, "python: ") {
			t.Errorf("diffAllowed names %q, which is not a shape of the table", name)
		}
		for _, k := range kinds {
			if _, ok := diffKinds[k]; !ok {
				t.Errorf("diffAllowed[%q] names %q, which is not a kind of diffKinds", name, k)
			}
		}
	}
	var sum diffSummary
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			targets := fx.admin
			if s.who == "restricted" {
				targets = fx.limited
			}
			extra := ""
			if s.prep != nil {
				extra = s.prep(ctx, t)
			}
			before := targets[1].outcomes()
			views := fanOut(ctx, s, extra, fx.floorFor(s), targets)
			after := targets[1].outcomes()
			for k := range after {
				after[k] -= before[k]
			}
			t.Logf("wrapconfig's requests: %v", after)
			var diffs []string
			for _, tg := range targets[1:] {
				for _, d := range differences(views["direct"], views[tg.name]) {
					diffs = append(diffs, tg.name+": "+d)
				}
			}
			if after["fell_back"] > 0 {
				sum.fellBack = append(sum.fellBack, s.name)
			}
			if after["served"] > 0 {
				sum.served++
				if len(diffs) == 0 {
					sum.identicalServed++
				}
			}
			sum.record(t, s.name, diffs)
		})
	}
	t.Run("python", func(t *testing.T) { fx.python(ctx, t, &sum) })
	sum.report(t)
}

// diffSummary counts the table's outcomes.
type diffSummary struct {
	tried, identical int
	// served is how many shapes WrapConfig served from the daemon, at
	// least in part (the others it passed through or fell back on);
	// identicalServed how many of them were identical.
	served, identicalServed int
	fellBack                []string // shapes WrapConfig answered from the API server, the daemon taken for down
	allowed                 []string // "shape (kinds)"
	stale                   []string // "shape: kind" allowed but not seen
}

// record counts one shape and fails t for a difference that no kind
// allowed for the shape explains.
func (s *diffSummary) record(t *testing.T, name string, diffs []string) {
	t.Helper()
	s.tried++
	kinds := diffAllowed[name]
	used := map[string]bool{}
	var unexplained []string
	for _, d := range diffs {
		explained := false
		for _, k := range kinds {
			if diffKinds[k].match(d) {
				used[k], explained = true, true
			}
		}
		if !explained {
			unexplained = append(unexplained, d)
		}
	}
	for _, k := range kinds {
		if !used[k] {
			s.stale = append(s.stale, name+": "+k)
		}
	}
	switch {
	case len(diffs) == 0:
		s.identical++
	case len(unexplained) == 0:
		var reasons []string
		for _, k := range kinds {
			if used[k] {
				reasons = append(reasons, k)
			}
		}
		s.allowed = append(s.allowed, name+" ("+strings.Join(reasons, ", ")+")")
		t.Logf("differs, as allowed (%s):\n  %s", strings.Join(reasons, ", "), strings.Join(diffs, "\n  "))
	default:
		could := map[string]bool{}
		unknown := 0
		for _, d := range unexplained {
			matched := false
			for k, dk := range diffKinds {
				if k != "impersonation" && dk.match(d) {
					could[k], matched = true, true
				}
			}
			if !matched {
				unknown++
			}
		}
		t.Errorf("differs from the API server in what diffAllowed[%q] (%q) does not explain: known kinds %q, %d entries of no known kind:\n  %s",
			name, kinds, slices.Sorted(maps.Keys(could)), unknown, strings.Join(unexplained, "\n  "))
	}
}

func (s *diffSummary) report(t *testing.T) {
	t.Logf("differential table: %d shapes tried, %d identical, %d deliberately different (WrapConfig served %d shapes from the daemon, %d of them identical):\n  %s",
		s.tried, s.identical, len(s.allowed), s.served, s.identicalServed, strings.Join(s.allowed, "\n  "))
	if len(s.fellBack) > 0 {
		t.Logf("WrapConfig fell back on the API server (the daemon taken for down) for: %q", s.fellBack)
	}
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(diffKinds)) {
		kinds = append(kinds, k+": "+diffKinds[k].reason)
	}
	t.Logf("the kinds of difference allowed:\n  %s", strings.Join(kinds, "\n  "))
	if len(s.stale) > 0 {
		t.Errorf("allowed kinds that no longer differ (remove them from diffAllowed, and their reasons from docs/adoption.md):\n  %s", strings.Join(s.stale, "\n  "))
	}
}
