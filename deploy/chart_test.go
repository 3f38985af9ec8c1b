// Package deploy_test checks that the Helm chart helm/informerd and the
// kustomize manifests beside it say the same thing: each setting the two
// share renders the same objects from both, so neither can drift. TestDeploy
// (test/e2e) installs both for real.
package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const chart = "helm/informerd"

// helmBin returns $INFORMERD_HELM, else the helm that
// test/controlplane/build.sh builds with the control plane (and caches
// outside the clone).
func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("INFORMERD_HELM"); p != "" {
		return p
	}
	out, err := exec.Command("../test/controlplane/build.sh").Output()
	if err != nil {
		t.Fatalf("building helm (test/controlplane/build.sh): %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return filepath.Join(lines[len(lines)-1], "helm")
}

// object is one decoded manifest.
type object = map[string]any

// key names an object as the API server does.
func key(o object) string {
	ns, _ := at(o, "metadata.namespace").(string)
	return fmt.Sprintf("%v %s/%v", o["kind"], ns, at(o, "metadata.name"))
}

// decode splits a multi-document YAML stream into its objects, by key.
func decode(t *testing.T, data []byte) map[string]object {
	t.Helper()
	out := map[string]object{}
	d := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var o object
		err := d.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decoding rendered manifests: %v\n%s", err, data)
		}
		if o == nil {
			continue
		}
		if _, dup := out[key(o)]; dup {
			t.Fatalf("%s rendered twice", key(o))
		}
		out[key(o)] = o
	}
}

// kustomize renders the kustomization in dir as kubectl kustomize does.
func kustomize(t *testing.T, dir string) map[string]object {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	data, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, data)
}

// helmTemplate renders the chart into namespace informerd with the given
// --set values, as helm install -n informerd would install it.
func helmTemplate(t *testing.T, set ...string) map[string]object {
	t.Helper()
	data, err := helmRun(t, set...)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, data)
}

func helmRun(t *testing.T, set ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", "informerd", chart, "--namespace", "informerd"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// diff lists where got and want differ, by path.
func diff(path string, got, want any) []string {
	if reflect.DeepEqual(got, want) {
		return nil
	}
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			break
		}
		var out []string
		for k := range g {
			if _, ok := w[k]; !ok {
				out = append(out, fmt.Sprintf("%s.%s: extra %v", path, k, g[k]))
			}
		}
		for k, wv := range w {
			if gv, ok := g[k]; ok {
				out = append(out, diff(path+"."+k, gv, wv)...)
			} else {
				out = append(out, fmt.Sprintf("%s.%s: missing, want %v", path, k, wv))
			}
		}
		slices.Sort(out)
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			break
		}
		var out []string
		for i := range w {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), g[i], w[i])...)
		}
		return out
	}
	return []string{fmt.Sprintf("%s: got %v, want %v", path, got, want)}
}

// same fails unless the chart's objects are the kustomization's, field by
// field.
func same(t *testing.T, fromHelm, fromKustomize map[string]object) {
	t.Helper()
	for k, want := range fromKustomize {
		got, ok := fromHelm[k]
		if !ok {
			t.Errorf("the chart does not render %s", k)
			continue
		}
		for _, d := range diff(k, got, want) {
			t.Errorf("the chart differs from kustomize: %s", d)
		}
	}
	for k := range fromHelm {
		if _, ok := fromKustomize[k]; !ok {
			t.Errorf("the chart renders %s, which kustomize does not", k)
		}
	}
}

// TestHelmChartMatchesKustomize: the chart with default values renders the
// objects of deploy/ (the kustomize base: Namespace, RBAC, the non-root
// DaemonSet with its init container); with tls.enabled those of
// overlays/node-ip (components/tls); with the monitoring values as well,
// those of components/monitoring on top, from the same files.
func TestHelmChartMatchesKustomize(t *testing.T) {
	monitoring := filepath.Join(t.TempDir(), "monitoring")
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(monitoring, 0o755); err != nil {
		t.Fatal(err)
	}
	// kustomize takes relative paths only.
	rel, err := filepath.Rel(monitoring, abs)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("resources: [%s]\ncomponents: [%s]\n", filepath.Join(rel, "overlays/node-ip"), filepath.Join(rel, "components/monitoring"))
	if err := os.WriteFile(filepath.Join(monitoring, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, dir string
		set       []string
	}{
		{"defaults", ".", nil},
		{"tls", "overlays/node-ip", []string{"tls.enabled=true"}},
		{"tls+monitoring", monitoring, []string{"tls.enabled=true", "monitoring.prometheusRule=true", "monitoring.dashboard=true"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := kustomize(t, tt.dir)
			if len(want) < 7 {
				t.Fatalf("kustomize %s rendered %d objects", tt.dir, len(want))
			}
			same(t, helmTemplate(t, tt.set...), want)
		})
	}
}

// podSpec returns the rendered DaemonSet's pod spec.
func podSpec(t *testing.T, objs map[string]object) map[string]any {
	t.Helper()
	ds, ok := objs["DaemonSet informerd/informerd"]
	if !ok {
		t.Fatal("no DaemonSet informerd/informerd")
	}
	return ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
}

// container returns the pod spec's container or init container.
func container(t *testing.T, spec map[string]any, init bool) map[string]any {
	t.Helper()
	field := "containers"
	if init {
		field = "initContainers"
	}
	return spec[field].([]any)[0].(map[string]any)
}

func args(c map[string]any) []string {
	var out []string
	for _, a := range c["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

// at returns the value at a dotted path of o ("" if there is none).
func at(o any, path string) any {
	for _, p := range strings.Split(path, ".") {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

// TestHelmChartValues: each value that deploy/ has no counterpart for lands
// where it should, and nowhere else changes; bad combinations fail the
// render with a message naming the value.
func TestHelmChartValues(t *testing.T) {
	base := helmTemplate(t)
	baseRules := at(base["ClusterRole /informerd"], "rules").([]any)

	t.Run("image", func(t *testing.T) {
		spec := podSpec(t, helmTemplate(t, "image.repository=registry.example/informerd", "image.tag=v0.1.0", "image.pullPolicy=Always"))
		for _, init := range []bool{false, true} {
			c := container(t, spec, init)
			if c["image"] != "registry.example/informerd:v0.1.0" || c["imagePullPolicy"] != "Always" {
				t.Errorf("%s: image %v, pull policy %v", c["name"], c["image"], c["imagePullPolicy"])
			}
		}
	})
	t.Run("scheduling and resources", func(t *testing.T) {
		spec := podSpec(t, helmTemplate(t, "nodeSelector.pool=infra", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
			"resources.limits.memory=1Gi", "goMemLimit=900MiB"))
		if !reflect.DeepEqual(spec["nodeSelector"], map[string]any{"pool": "infra"}) {
			t.Errorf("nodeSelector %v", spec["nodeSelector"])
		}
		if !reflect.DeepEqual(spec["tolerations"], []any{map[string]any{"key": "dedicated", "operator": "Exists"}}) {
			t.Errorf("tolerations %v", spec["tolerations"])
		}
		c := container(t, spec, false)
		if at(c, "resources.limits.memory") != "1Gi" || at(c, "resources.requests.memory") != "192Mi" {
			t.Errorf("resources %v", c["resources"])
		}
		env := c["env"].([]any)
		if !slices.ContainsFunc(env, func(e any) bool { return reflect.DeepEqual(e, map[string]any{"name": "GOMEMLIMIT", "value": "900MiB"}) }) {
			t.Errorf("env %v, want GOMEMLIMIT=900MiB", env)
		}
	})
	t.Run("GOMEMLIMIT from the memory limit", func(t *testing.T) {
		// 7/8 of the limit, as the daemon derives it when it reads only
		// the container's (cmd/informerd/memory.go).
		for _, tt := range []struct{ limit, want string }{
			{"512Mi", "448MiB"}, {"1Gi", "896MiB"}, {"536870912", "448MiB"}, {"1000M", "875000000"},
		} {
			c := container(t, podSpec(t, helmTemplate(t, "resources.limits.memory="+tt.limit)), false)
			env := c["env"].([]any)
			if !slices.ContainsFunc(env, func(e any) bool { return reflect.DeepEqual(e, map[string]any{"name": "GOMEMLIMIT", "value": tt.want}) }) {
				t.Errorf("limit %s: env %v, want GOMEMLIMIT=%s", tt.limit, env, tt.want)
			}
		}
		c := container(t, podSpec(t, helmTemplate(t, "resources.limits=null")), false)
		for _, e := range c["env"].([]any) {
			if at(e, "name") == "GOMEMLIMIT" {
				t.Errorf("without a memory limit: %v, want no GOMEMLIMIT", e)
			}
		}
	})
	t.Run("flags", func(t *testing.T) {
		related := "servers.v1beta3.policy.linkerd.io,selector=spec.podSelector,port=spec.port"
		objs := helmTemplate(t, "serveSensitive={secrets,certificatesigningrequests.certificates.k8s.io}",
			"addressRelated[0]="+strings.ReplaceAll(related, ",", `\,`), "extraArgs={-log-format=json}")
		got := args(container(t, podSpec(t, objs), false))
		want := append(args(container(t, podSpec(t, base), false)),
			"-serve-sensitive=secrets,certificatesigningrequests.certificates.k8s.io", "-address-related="+related, "-log-format=json")
		if !slices.Equal(got, want) {
			t.Errorf("args %q, want %q", got, want)
		}
	})
	t.Run("extra RBAC", func(t *testing.T) {
		objs := helmTemplate(t, "rbac.extraRules[0].apiGroups={networking.k8s.io}", "rbac.extraRules[0].resources={networkpolicies}", "rbac.extraRules[0].verbs={list,watch}")
		got := at(objs["ClusterRole /informerd"], "rules").([]any)
		want := append(slices.Clone(baseRules), map[string]any{"apiGroups": []any{"networking.k8s.io"}, "resources": []any{"networkpolicies"}, "verbs": []any{"list", "watch"}})
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ClusterRole informerd's rules %v, want the base's and the extra one: %v", got, want)
		}
	})
	t.Run("cert-manager", func(t *testing.T) {
		objs := helmTemplate(t, "tls.enabled=true", "tls.secretName=informerd-cert", "tls.certManager.enabled=true", "tls.certManager.issuerRef.name=ca", "tls.certManager.issuerRef.kind=ClusterIssuer")
		c, ok := objs["Certificate informerd/informerd"]
		if !ok {
			t.Fatalf("no Certificate; rendered %v", slices.Sorted(maps.Keys(objs)))
		}
		want := map[string]any{"secretName": "informerd-cert", "dnsNames": []any{"informerd"}, "issuerRef": map[string]any{"name": "ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}
		if !reflect.DeepEqual(c["spec"], want) {
			t.Errorf("Certificate spec %v, want %v", c["spec"], want)
		}
		vols := podSpec(t, objs)["volumes"].([]any)
		if at(vols[len(vols)-1], "secret.secretName") != "informerd-cert" {
			t.Errorf("volumes %v, want the Certificate's Secret mounted", vols)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		objs := helmTemplate(t, "tls.enabled=true", "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom",
			"metrics.readerServiceAccount.name=prometheus", "metrics.readerServiceAccount.namespace=monitoring")
		sm, ok := objs["ServiceMonitor informerd/informerd"]
		if !ok {
			t.Fatal("no ServiceMonitor")
		}
		ep := at(sm, "spec.endpoints").([]any)[0]
		if at(ep, "port") != "metrics" || at(ep, "scheme") != "https" || at(ep, "tlsConfig.serverName") != "informerd" ||
			at(ep, "tlsConfig.ca.secret.name") != "informerd-tls" || at(ep, "bearerTokenFile") == nil || at(sm, "metadata.labels.release") != "prom" {
			t.Errorf("ServiceMonitor %v", sm)
		}
		// It selects the metrics Service, and only by its labels.
		svc := objs["Service informerd/informerd-metrics"]
		labels, _ := at(svc, "metadata.labels").(map[string]any)
		for k, v := range at(sm, "spec.selector.matchLabels").(map[string]any) {
			if labels[k] != v {
				t.Errorf("the ServiceMonitor selects %s=%v; the Service informerd-metrics has labels %v", k, v, at(svc, "metadata.labels"))
			}
		}
		b := objs["ClusterRoleBinding /informerd-metrics-reader"]
		if at(b, "roleRef.name") != "informerd-metrics-reader" || !reflect.DeepEqual(b["subjects"], []any{map[string]any{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}}) {
			t.Errorf("ClusterRoleBinding informerd-metrics-reader %v", b)
		}
	})
	t.Run("namespace", func(t *testing.T) {
		objs := helmTemplate(t, "namespace.create=false")
		if _, ok := objs["Namespace /informerd"]; ok || len(objs) != len(base)-1 {
			t.Errorf("namespace.create=false rendered %v", slices.Sorted(maps.Keys(objs)))
		}
	})
	for _, tt := range []struct {
		set  []string
		want string
	}{
		{[]string{"tls.certManager.enabled=true"}, "need tls.enabled"},
		{[]string{"metrics.serviceMonitor.enabled=true"}, "need tls.enabled"},
		{[]string{"tls.enabled=true", "tls.certManager.enabled=true"}, "tls.certManager.issuerRef.name"},
		{[]string{"metrics.readerServiceAccount.name=prometheus"}, "metrics.readerServiceAccount.namespace"},
		{[]string{"resources.limits.memory=0.5Gi"}, "set goMemLimit"},
	} {
		if _, err := helmRun(t, tt.set...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("helm template --set %v: %v; want an error naming %q", tt.set, err, tt.want)
		}
	}
}

// TestHelmChartLint: helm lint passes, strict, with the defaults and with
// every option on.
func TestHelmChartLint(t *testing.T) {
	for _, set := range [][]string{nil, {"tls.enabled=true", "tls.certManager.enabled=true", "tls.certManager.issuerRef.name=ca",
		"metrics.serviceMonitor.enabled=true", "monitoring.prometheusRule=true", "monitoring.dashboard=true"}} {
		args := []string{"lint", "--strict", chart, "--namespace", "informerd"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		if out, err := exec.Command(helmBin(t), args...).CombinedOutput(); err != nil {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
