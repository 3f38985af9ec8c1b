package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pythonClient is a program of Debian's python3-kubernetes client: it
// creates five ConfigMaps labelled with its run, lists them in pages of 2,
// updates two, deletes one, lists after each write, and watches from the
// resourceVersion before the first write. It prints what it saw as one
// JSON object, with names stripped of the run so that runs compare.
const pythonClient = `
import json, sys
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

mode, ns, run = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "direct":
    config.load_kube_config(config_file=sys.argv[4])
    api = client.CoreV1Api()
else:
    c = client.Configuration()
    c.host = sys.argv[4]
    api = client.CoreV1Api(client.ApiClient(c))
sel = "py=" + run
short = lambda n: n[len(run) + 1:]
out = {}

def paged():
    pages, items, cont = 0, [], None
    while pages < 10:
        kw = {"label_selector": sel, "limit": 2}
        if cont:
            kw["_continue"] = cont
        r = api.list_namespaced_config_map(ns, **kw)
        pages += 1
        items += r.items
        cont = r.metadata._continue
        if not cont:
            break
    return pages, items

try:
    start = api.list_namespaced_config_map(ns, label_selector=sel).metadata.resource_version
    for i in range(5):
        api.create_namespaced_config_map(ns, {"metadata": {"name": "%s-%d" % (run, i), "labels": {"py": run}}, "data": {"v": "0"}})
    pages, items = paged()
    out["pages of 2 after 5 creates"] = pages
    out["names after create"] = [short(i.metadata.name) for i in items]
    out["managedFields present"] = all(bool(i.metadata.managed_fields) for i in items)
    for i in (1, 3):
        api.patch_namespaced_config_map("%s-%d" % (run, i), ns, {"data": {"v": "1"}})
    out["data after update"] = {short(i.metadata.name): i.data["v"] for i in paged()[1]}
    api.delete_namespaced_config_map("%s-4" % run, ns)
    out["names after delete"] = [short(i.metadata.name) for i in paged()[1]]
    events = []
    try:
        for e in watch.Watch().stream(api.list_namespaced_config_map, ns, label_selector=sel, resource_version=start, timeout_seconds=1):
            events.append([e["type"], short(e["object"].metadata.name), (e["object"].data or {}).get("v")])
    except ApiException as e:
        events.append(["exception", e.status, e.reason])
    out["watch from before the writes"] = events
except ApiException as e:
    out["exception"] = [e.status, e.reason]
print(json.dumps(out, sort_keys=True))
`

// pythonWithKubernetes returns a python3 that imports the kubernetes
// module, or "" if there is none: Debian's is /usr/bin/python3, which may
// not be the first python3 on PATH.
func pythonWithKubernetes(ctx context.Context) string {
	candidates := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append([]string{p}, candidates...)
	}
	for _, p := range candidates {
		if exec.CommandContext(ctx, p, "-c", "import kubernetes").Run() == nil {
			return p
		}
	}
	return ""
}

// python runs pythonClient directly against the API server and through
// the admin's informerctl proxy, and records each thing it saw as a shape
// "python: WHAT" in sum.
func (fx *diffFixture) python(ctx context.Context, t *testing.T, sum *diffSummary) {
	py := pythonWithKubernetes(ctx)
	if py == "" {
		t.Skip("no python3 with the kubernetes module (Debian: apt-get install python3-kubernetes): the client in another language is not compared")
	}
	script := filepath.Join(t.TempDir(), "client.py")
	if err := os.WriteFile(script, []byte(pythonClient), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(mode, server string) map[string]json.RawMessage {
		t.Helper()
		out, err := exec.CommandContext(ctx, py, script, mode, fx.ns0, "py"+mode, server).Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("python %s: %v\n%s", mode, err, exit.Stderr)
		} else if err != nil {
			t.Fatal(err)
		}
		var seen map[string]json.RawMessage
		if err := json.Unmarshal(out, &seen); err != nil {
			t.Fatalf("python %s printed %q: %v", mode, out, err)
		}
		return seen
	}
	direct := run("direct", env.KubeconfigPath)
	proxied := run("proxy", fx.proxyURL)
	var keys []string
	for k := range direct {
		keys = append(keys, k)
	}
	for k := range proxied {
		if _, ok := direct[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		var diffs []string
		if d, p := string(direct[k]), string(proxied[k]); d != p {
			diffs = append(diffs, "proxy: "+k+": "+strings.TrimSpace(p)+", API server "+strings.TrimSpace(d))
		}
		sum.record(t, "python: "+k, diffs)
	}
}
