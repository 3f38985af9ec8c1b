package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fixture = `{"machine":{"cpu":"test","cpus":2,"kubernetes":"v1.37.2","date":"2026-12-03"},"runs":[
{"mode":"direct","clients":1,"upstreamWatches":2,"apiserverCpuSeconds":16.8,"nodeCpuSeconds":6.7,"latencyP99Millis":11.4,"clientHeapPerObject":21160},
{"mode":"direct","clients":10,"upstreamWatches":20,"apiserverCpuSeconds":39.1,"nodeCpuSeconds":78,"latencyP99Millis":29.1,"clientHeapPerObject":21325},
{"mode":"shared-nostore","clients":1,"upstreamWatches":4,"apiserverCpuSeconds":17.8,"nodeCpuSeconds":4.1,"latencyP99Millis":13.6,"daemonHeapPerObject":4796},
{"mode":"shared-nostore","clients":10,"upstreamWatches":4,"apiserverCpuSeconds":17.9,"nodeCpuSeconds":18.5,"latencyP99Millis":32.1,"daemonHeapPerObject":4818}]}`

// TestDraw writes every plot, each an SVG naming every mode.
func TestDraw(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "results.json")
	if err := os.WriteFile(in, []byte(fixture), 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := draw(in, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"apiserver-cpu.svg", "watches.svg", "node-cpu.svg", "p99.svg", "bytes-per-object.svg"}
	if len(files) != len(want) {
		t.Fatalf("wrote %v, want %v", files, want)
	}
	for i, f := range files {
		if filepath.Base(f) != want[i] {
			t.Errorf("file %d = %s, want %s", i, f, want[i])
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if !strings.HasPrefix(s, "<?xml") || !strings.Contains(s, "<svg") {
			t.Errorf("%s is not an SVG", f)
		}
		for _, m := range []string{"direct", "shared-nostore"} {
			if !strings.Contains(s, m) {
				t.Errorf("%s does not name mode %s", f, m)
			}
		}
	}
}

// TestDrawRefusesEmptyResults: results without runs are an error, not
// empty plots.
func TestDrawRefusesEmptyResults(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "results.json")
	if err := os.WriteFile(in, []byte(`{"runs":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := draw(in, dir); err == nil || !strings.Contains(err.Error(), "no runs") {
		t.Fatalf("draw = %v, want an error saying there are no runs", err)
	}
}
