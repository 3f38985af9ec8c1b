// Package docs_test checks that the operator's documentation is complete.
package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestEveryMetricIsDocumented: every metric the daemon's packages create
// (prometheus.New{Counter,Gauge,Histogram,Summary}[Vec] and NewDesc,
// anywhere outside tests, test/ and hack/) has a section in metrics.md,
// and metrics.md documents no informerd_ metric that no longer exists.
func TestEveryMetricIsDocumented(t *testing.T) {
	registered := registeredMetrics(t)
	doc, err := os.ReadFile("metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^### `(informerd_[a-z_]+)`").FindAllSubmatch(doc, -1) {
		documented[string(m[1])] = true
	}
	var names []string
	for name := range registered {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !documented[name] {
			t.Errorf("%s (%s) has no section \"### `%s`\" in docs/metrics.md: add its type, labels, meaning and an alert", name, registered[name], name)
		}
	}
	for name := range documented {
		if _, ok := registered[name]; !ok {
			t.Errorf("docs/metrics.md documents %s, which nothing registers any more", name)
		}
	}
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// literal is the string literal e, or fails the test.
func literal(t *testing.T, e ast.Expr, where string) string {
	t.Helper()
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		t.Fatalf("%s: a metric's name is not a string literal; write it out so that it can be found and documented", where)
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// optsName is the Name of the prometheus.*Opts literal e; Namespace and
// Subsystem are refused so that the full name is written in one place.
func optsName(t *testing.T, e ast.Expr, where string) string {
	t.Helper()
	if u, ok := e.(*ast.UnaryExpr); ok {
		e = u.X
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		t.Fatalf("%s: a metric's options are not a literal; write them out so that its name can be found and documented", where)
	}
	name := ""
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		switch {
		case isIdent(kv.Key, "Name"):
			name = literal(t, kv.Value, where)
		case isIdent(kv.Key, "Namespace"), isIdent(kv.Key, "Subsystem"):
			t.Fatalf("%s: give the metric's whole name in Name, not Namespace or Subsystem", where)
		}
	}
	if name == "" {
		t.Fatalf("%s: a metric without Name", where)
	}
	return name
}

// registeredMetrics scans the daemon's packages for the metrics they
// create: name -> where.
func registeredMetrics(t *testing.T) map[string]string {
	t.Helper()
	registered := map[string]string{} // name -> where
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "hack", "test", "examples", "_output":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !isIdent(sel.X, "prometheus") {
				return true
			}
			where := fset.Position(call.Pos()).String()
			switch {
			case sel.Sel.Name == "NewDesc":
				registered[literal(t, call.Args[0], where)] = where
			case regexp.MustCompile(`^New(Counter|Gauge|Histogram|Summary)(Vec)?$`).MatchString(sel.Sel.Name):
				registered[optsName(t, call.Args[0], where)] = where
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(registered) < 30 {
		t.Fatalf("found only %d metrics: the scan is broken", len(registered))
	}
	return registered
}
