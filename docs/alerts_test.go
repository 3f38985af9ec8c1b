package docs_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const ruleFile = "../deploy/components/monitoring/prometheusrule.yaml"

// prometheusRule is what the tests read of the PrometheusRule.
type prometheusRule struct {
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
				For   string `json:"for"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

func readRule(t *testing.T) (prometheusRule, []byte) {
	t.Helper()
	data, err := os.ReadFile(ruleFile)
	if err != nil {
		t.Fatal(err)
	}
	var r prometheusRule
	if err := yaml.Unmarshal(data, &r); err != nil {
		t.Fatalf("%s: %v", ruleFile, err)
	}
	return r, data
}

// documentedAlerts are the expressions of metrics.md's "Alert" paragraphs
// (the indented lines after one), with their "for:" if they say one.
func documentedAlerts(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	forRe := regexp.MustCompile(`for: (\w+)`)
	inAlert, last := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Alert"):
			inAlert = true
		case strings.HasPrefix(line, "#"):
			inAlert, last = false, ""
		case inAlert && last != "" && strings.HasPrefix(line, "      "): // an expression goes on
			delete(out, last)
			last += " " + strings.Join(strings.Fields(line), " ")
			out[last] = ""
		case inAlert && strings.HasPrefix(line, "    "):
			expr, comment, _ := strings.Cut(strings.TrimSpace(line), "#")
			last = strings.Join(strings.Fields(expr), " ")
			out[last] = ""
			if m := forRe.FindStringSubmatch(comment); m != nil {
				out[last] = m[1]
			}
		case inAlert && last != "" && forRe.MatchString(line):
			out[last] = forRe.FindStringSubmatch(line)[1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAlertsAreTheDocumentedOnes: the PrometheusRule has one alert per
// expression metrics.md gives, with the same expression and "for:" where
// metrics.md says one, and no other.
func TestAlertsAreTheDocumentedOnes(t *testing.T) {
	docs := documentedAlerts(t)
	r, _ := readRule(t)
	rules := map[string]string{}
	for _, g := range r.Spec.Groups {
		for _, rule := range g.Rules {
			expr := strings.Join(strings.Fields(rule.Expr), " ")
			rules[expr] = rule.For
			docFor, ok := docs[expr]
			switch {
			case !ok:
				t.Errorf("alert %s (%s) is not in metrics.md", rule.Alert, expr)
			case docFor != "" && docFor != rule.For:
				t.Errorf("alert %s: for %q, metrics.md says %q", rule.Alert, rule.For, docFor)
			}
		}
	}
	for expr := range docs {
		if _, ok := rules[expr]; !ok {
			t.Errorf("metrics.md's alert %q has no rule in %s", expr, ruleFile)
		}
	}
}

// promtool returns the promtool that hack/monitoring/build.sh builds (and
// caches outside the clone), or $INFORMERD_PROMTOOL.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("INFORMERD_PROMTOOL"); p != "" {
		return p
	}
	out, err := exec.Command("../hack/monitoring/build.sh").Output()
	if err != nil {
		t.Fatalf("building promtool (hack/monitoring/build.sh): %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return filepath.Join(lines[len(lines)-1], "promtool")
}

// TestAlerts: the rules pass `promtool check rules`, and each alert fires
// when it should and stays silent when it should not (`promtool test
// rules` on alerts_test.yaml, which has a test for every alert).
func TestAlerts(t *testing.T) {
	r, data := readRule(t)
	var spec struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	rules, err := yaml.Marshal(spec.Spec)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var covered struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &covered); err != nil {
		t.Fatal(err)
	}
	var tested []string
	for _, tc := range covered.Tests {
		for _, a := range tc.AlertRuleTest {
			tested = append(tested, a.Alertname)
		}
	}
	for _, g := range r.Spec.Groups {
		for _, rule := range g.Rules {
			if !slices.Contains(tested, rule.Alert) {
				t.Errorf("alert %s has no test in alerts_test.yaml", rule.Alert)
			}
		}
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"rules.yaml": rules, "alerts_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
