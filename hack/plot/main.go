// Command plot draws the results of `make bench` (test/bench's JSON) as
// SVG plots next to it: how the API server's CPU, its watches, the node's
// CPU and the update latency grow with the number of processes N in each
// mode, and what each mode keeps per object.
//
//	go run . -in ../../_output/bench/results.json
//
// writes apiserver-cpu.svg, watches.svg, node-cpu.svg, p99.svg and
// bytes-per-object.svg in the directory of -in (or -out).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// results is the part of test/bench's report that the plots use.
type results struct {
	Machine struct {
		CPU        string `json:"cpu"`
		CPUs       int    `json:"cpus"`
		Kubernetes string `json:"kubernetes"`
		Date       string `json:"date"`
	} `json:"machine"`
	Runs []run `json:"runs"`
}

type run struct {
	Mode                string  `json:"mode"`
	Clients             int     `json:"clients"`
	UpstreamWatches     int     `json:"upstreamWatches"`
	APIServerCPUSeconds float64 `json:"apiserverCpuSeconds"`
	NodeCPUSeconds      float64 `json:"nodeCpuSeconds"`
	LatencyP99Millis    float64 `json:"latencyP99Millis"`
	ClientHeapPerObject float64 `json:"clientHeapPerObject"`
	DaemonHeapPerObject float64 `json:"daemonHeapPerObject"`
}

func main() {
	in := flag.String("in", "_output/bench/results.json", "the results of make bench (test/bench's JSON)")
	out := flag.String("out", "", "the directory to write the plots in (default: that of -in)")
	flag.Parse()
	if *out == "" {
		*out = filepath.Dir(*in)
	}
	files, err := draw(*in, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	for _, f := range files {
		fmt.Println(f)
	}
}

// draw reads the results at in and writes the plots in dir, returning
// their paths.
func draw(in, dir string) ([]string, error) {
	b, err := os.ReadFile(in)
	if err != nil {
		return nil, err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", in, err)
	}
	if len(r.Runs) == 0 {
		return nil, fmt.Errorf("%s: no runs", in)
	}
	caption := fmt.Sprintf("make bench, %s (%s, %d CPUs, Kubernetes %s)", r.Machine.Date, r.Machine.CPU, r.Machine.CPUs, r.Machine.Kubernetes)
	var files []string
	for _, p := range []struct {
		file, title, y string
		value          func(run) float64
	}{
		{"apiserver-cpu.svg", "API server CPU", "CPU seconds", func(x run) float64 { return x.APIServerCPUSeconds }},
		{"watches.svg", "Watches at the API server", "watches", func(x run) float64 { return float64(x.UpstreamWatches) }},
		{"node-cpu.svg", "Node CPU (clients and daemon)", "CPU seconds", func(x run) float64 { return x.NodeCPUSeconds }},
		{"p99.svg", "Update latency, p99", "milliseconds", func(x run) float64 { return x.LatencyP99Millis }},
	} {
		pl, err := againstN(r.Runs, p.title+"\n"+caption, p.y, p.value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.file, err)
		}
		f := filepath.Join(dir, p.file)
		if err := pl.Save(6*vg.Inch, 4*vg.Inch, f); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	pl, err := perObject(r.Runs, "Heap per object, N = "+fmt.Sprint(maxN(r.Runs))+"\n"+caption)
	if err != nil {
		return nil, fmt.Errorf("bytes-per-object.svg: %w", err)
	}
	f := filepath.Join(dir, "bytes-per-object.svg")
	if err := pl.Save(6*vg.Inch, 4*vg.Inch, f); err != nil {
		return nil, err
	}
	return append(files, f), nil
}

// modes returns the runs' modes in the order they first appear.
func modes(runs []run) []string {
	var ms []string
	for _, x := range runs {
		if !slices.Contains(ms, x.Mode) {
			ms = append(ms, x.Mode)
		}
	}
	return ms
}

func maxN(runs []run) int {
	n := 0
	for _, x := range runs {
		n = max(n, x.Clients)
	}
	return n
}

// againstN plots value against N, one line per mode.
func againstN(runs []run, title, y string, value func(run) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "processes watching (N)"
	p.Y.Label.Text = y
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
	var lines []any
	for _, m := range modes(runs) {
		var xys plotter.XYs
		for _, x := range runs {
			if x.Mode == m {
				xys = append(xys, plotter.XY{X: float64(x.Clients), Y: value(x)})
			}
		}
		slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
		lines = append(lines, m, xys)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	return p, nil
}

// perObject is a bar chart of the heap per object each mode keeps at the
// largest N: in each client process and in the daemon.
func perObject(runs []run, title string) (*plot.Plot, error) {
	n := maxN(runs)
	ms := modes(runs)
	client, daemon := make(plotter.Values, len(ms)), make(plotter.Values, len(ms))
	for _, x := range runs {
		if x.Clients == n {
			i := slices.Index(ms, x.Mode)
			client[i], daemon[i] = x.ClientHeapPerObject, x.DaemonHeapPerObject
		}
	}
	if slices.Max(client) == 0 && slices.Max(daemon) == 0 {
		return nil, errors.New("no heap per object measured")
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "bytes per object"
	p.Legend.Top = true
	w := vg.Points(18)
	for i, s := range []struct {
		name string
		v    plotter.Values
		c    color.Color
	}{{"each client process", client, plotutil.Color(0)}, {"the daemon (once per node)", daemon, plotutil.Color(1)}} {
		bars, err := plotter.NewBarChart(s.v, w)
		if err != nil {
			return nil, err
		}
		bars.Color = s.c
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(2*i-1) * w / 2
		p.Add(bars)
		p.Legend.Add(s.name, bars)
	}
	p.NominalX(ms...)
	return p, nil
}
