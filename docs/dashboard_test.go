package docs_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"sigs.k8s.io/yaml"
)

const dashboardFile = "../deploy/components/monitoring/dashboard.json"

// dashboardQueries returns every PromQL query of the dashboard: its
// panels' targets and its templating variables' queries.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, tg.Expr)
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.*), *\w+\)$`)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			m := labelValues.FindStringSubmatch(q)
			if m == nil {
				t.Fatalf("templating query %q: want label_values(<selector>, <label>)", q)
			}
			qs = append(qs, m[1])
		}
	}
	if len(qs) < 20 {
		t.Fatalf("found only %d queries in %s: the scan is broken", len(qs), dashboardFile)
	}
	return qs
}

// TestDashboardNamesOnlyExportedMetrics: every metric the dashboard's
// queries name is one the daemon exports: its own (registeredMetrics), or
// the Go and process collectors' it registers (cmd/informerd); and every
// query is valid PromQL (promtool check rules, with each query as a
// recording rule).
func TestDashboardNamesOnlyExportedMetrics(t *testing.T) {
	exported := registeredMetrics(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		exported[f.GetName()] = "the Go and process collectors"
	}
	queries := dashboardQueries(t)
	// A metric in a query is always written with its selector's braces.
	metric := regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)
	for _, q := range queries {
		names := metric.FindAllStringSubmatch(q, -1)
		if len(names) == 0 {
			t.Errorf("query %q names no metric (write each as name{...})", q)
		}
		for _, m := range names {
			name := m[1]
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] != "" {
					name = base
				}
			}
			if exported[name] == "" {
				t.Errorf("query %q names %s, which the daemon does not export", q, name)
			}
		}
	}

	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, q := range queries {
		// Grafana's variables, as a value would replace them.
		q = strings.NewReplacer("$instance", ".*", "$job", "informerd").Replace(q)
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: q})
	}
	file, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard.yaml")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}
