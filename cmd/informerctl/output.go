package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// terminalWidth returns a function that reads f's width in columns (0 if
// f is not a terminal), again at each call, to follow resizes.
func terminalWidth(f *os.File) func() int {
	return func() int {
		w, _, err := term.GetSize(int(f.Fd()))
		if err != nil {
			return 0
		}
		return w
	}
}

// truncateLines cuts every line of s to at most width runes (0: no
// limit), so that a table redrawn in place takes one terminal row per line.
func truncateLines(s string, width int) string {
	if width <= 0 {
		return s
	}
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		body, nl := strings.CutSuffix(l, "\n")
		if r := []rune(body); len(r) > width {
			body = string(r[:width])
		}
		if nl {
			body += "\n"
		}
		lines[i] = body
	}
	return strings.Join(lines, "")
}

// table prints rows in columns, as kubectl does: each column as wide as
// its widest cell so far, separated by three spaces, the last column
// unpadded. Rows printed later keep the widths of earlier ones (growing
// them if they must), so that a watch's rows line up with its snapshot.
type table struct {
	widths []int
}

// print writes rows, computing the widths over all of them first.
func (t *table) print(w io.Writer, rows ...[]string) error {
	for _, r := range rows {
		for i, c := range r {
			if i >= len(t.widths) {
				t.widths = append(t.widths, 0)
			}
			t.widths[i] = max(t.widths[i], len(c))
		}
	}
	var b, line strings.Builder
	for _, r := range rows {
		line.Reset()
		for i, c := range r {
			line.WriteString(c)
			if i < len(r)-1 {
				line.WriteString(strings.Repeat(" ", t.widths[i]-len(c)+3))
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Output formats of get and watch.
const (
	outputTable = ""
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
	outputName  = "name"
)

func checkOutput(cmd, o string) error {
	switch o {
	case outputTable, outputWide, outputJSON, outputYAML, outputName:
		return nil
	}
	return usagef(cmd, "-o %q: want wide, json, yaml or name (or nothing, for a table)", o)
}

// objectColumns are the table columns of objects: NAMESPACE (with
// withNamespace), NAME, AGE and, wide, RESOURCEVERSION and LABELS.
func objectColumns(withNamespace, wide bool) []string {
	var cols []string
	if withNamespace {
		cols = append(cols, "NAMESPACE")
	}
	cols = append(cols, "NAME", "AGE")
	if wide {
		cols = append(cols, "RESOURCEVERSION", "LABELS")
	}
	return cols
}

// objectRow is o's row under objectColumns, its age as of now.
func objectRow(o *unstructured.Unstructured, withNamespace, wide bool, now time.Time) []string {
	var row []string
	if withNamespace {
		row = append(row, o.GetNamespace())
	}
	row = append(row, o.GetName(), age(o, now))
	if wide {
		l := labels.Set(o.GetLabels()).String()
		if l == "" {
			l = "<none>"
		}
		row = append(row, o.GetResourceVersion(), l)
	}
	return row
}

// age is how long ago o was created, as kubectl prints it ("5m", "3d4h").
func age(o *unstructured.Unstructured, now time.Time) string {
	ts := o.GetCreationTimestamp()
	if ts.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(ts.Time))
}

// objectName is o as `-o name` prints it: kind[.group]/name, lower case,
// as kubectl does.
func objectName(o *unstructured.Unstructured) string {
	gk := schema.FromAPIVersionAndKind(o.GetAPIVersion(), o.GetKind()).GroupKind()
	return strings.ToLower(gk.String()) + "/" + o.GetName()
}

// marshal encodes v as indented JSON (as kubectl does, 4 spaces) or YAML,
// ending in a newline.
func marshal(v any, format string) ([]byte, error) {
	if format == outputYAML {
		return yaml.Marshal(v)
	}
	b, err := json.MarshalIndent(v, "", "    ")
	return append(b, '\n'), err
}

// writeError returns err unless it is nil, naming what failed to print.
func writeError(err error) error {
	if err != nil {
		return fmt.Errorf("writing the output: %w", err)
	}
	return nil
}
