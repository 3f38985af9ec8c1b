package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// report is everything one benchmark run measured; it is written as JSON.
type report struct {
	Machine  machine        `json:"machine"`
	Workload workload       `json:"workload"`
	Command  string         `json:"command"`
	Runs     []runResult    `json:"runs"`
	Snapshot snapshotResult `json:"snapshot"`
	Targets  []target       `json:"targets"`
}

// target is one of the ratios informerd aims for, as measured.
type target struct {
	Name  string  `json:"name"`
	Goal  string  `json:"goal"`
	Value float64 `json:"value"`
	Met   bool    `json:"met"`
}

func (r *report) find(mode string, n int) *runResult {
	for i := range r.Runs {
		if r.Runs[i].Mode == mode && r.Runs[i].Clients == n {
			return &r.Runs[i]
		}
	}
	return nil
}

// summarize computes the targets from the runs that were measured.
func (r *report) summarize() {
	add := func(name, goal string, v float64, met bool) {
		r.Targets = append(r.Targets, target{Name: name, Goal: goal, Value: v, Met: met})
	}
	maxN := slices.Max(r.Workload.Clients)
	if s, d := r.find(modeNoStore, maxN), r.find(modeDirect, maxN); s != nil && d != nil {
		add(fmt.Sprintf("daemon's lists+watches for %d resources, N=%d (direct: %d at the API server)", len(resources), maxN, d.UpstreamLists+d.UpstreamWatches),
			"1 list + 1 watch per resource", float64(s.DaemonLists+s.DaemonWatches), s.DaemonLists <= len(resources) && s.DaemonWatches <= len(resources))
		add(fmt.Sprintf("API server CPU, direct / shared, N=%d", maxN), "> 1", d.APIServerCPUSeconds/s.APIServerCPUSeconds,
			d.APIServerCPUSeconds > s.APIServerCPUSeconds)
	}
	for _, pair := range [][2]string{{modeWrappedTyped, modeDirectTyped}, {modeWrappedCtrl, modeDirectCtrl}} {
		if w, d := r.find(pair[0], maxN), r.find(pair[1], maxN); w != nil && d != nil && w.APIServerCPUSeconds > 0 {
			add(fmt.Sprintf("API server CPU, %s / %s, N=%d", pair[1], pair[0], maxN), "> 1", d.APIServerCPUSeconds/w.APIServerCPUSeconds,
				d.APIServerCPUSeconds > w.APIServerCPUSeconds)
		}
	}
	if s, d := r.find(modeNoStore, maxN), r.find(modeDirect, maxN); s != nil && d != nil && d.ClientHeapPerObject > 0 {
		add("daemon heap per object / dynamic informer heap per object", "<= 0.5",
			s.DaemonHeapPerObject/d.ClientHeapPerObject, s.DaemonHeapPerObject <= d.ClientHeapPerObject/2)
	}
	if one, many := r.find(modeNoStore, 1), r.find(modeNoStore, maxN); one != nil && many != nil && maxN > 1 {
		per := (float64(many.DaemonHeapLiveBytes) - float64(one.DaemonHeapLiveBytes)) / float64(maxN-1)
		add(fmt.Sprintf("daemon heap per extra subscriber without a store (N=1 to %d), bytes", maxN), "<= 65536", per, per <= 64<<10)
	}
	for _, n := range r.Workload.Clients {
		if n < 10 {
			continue
		}
		for _, pair := range [][2]string{{modeStore, modeDirect}, {modeNoStore, modeDirect}, {modeSharedTyped, modeDirectTyped}, {modeWrappedTyped, modeDirectTyped}, {modeWrappedCtrl, modeDirectCtrl}} {
			s, d := r.find(pair[0], n), r.find(pair[1], n)
			if s != nil && d != nil && d.LatencyP99Millis > 0 {
				ratio := s.LatencyP99Millis / d.LatencyP99Millis
				add(fmt.Sprintf("p99 latency %s / %s, N=%d", pair[0], pair[1], n), "<= 1.5", ratio, ratio <= 1.5)
			}
		}
	}
	if s := r.Snapshot; s.SharedMillis > 0 {
		ratio := s.DirectJSONMillis / s.SharedMillis
		add(fmt.Sprintf("snapshot of %d objects: direct LIST / informerd", s.Objects), ">= 2", ratio, ratio >= 2)
		ratio = s.DirectDecodedMillis / s.SharedDecodedMillis
		add("the same, both decoded into Unstructured", ">= 2 (informational)", ratio, ratio >= 2)
	}
}

func (r *report) print(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "\nmachine: %s, %d CPUs, %d GiB, %s, Kubernetes %s, %s\n", m.CPU, m.CPUs, m.MemoryGiB, m.GoVersion, m.Kubernetes, m.Date)
	wl := r.Workload
	fmt.Fprintf(w, "workload: %d ConfigMaps of %d B + %d Pods; %d updates at %d/s; daemon idle CPU over %s after sync; command: %s\n\n",
		wl.ConfigMaps, wl.ObjectSize, wl.Pods, wl.Updates, wl.Rate, wl.IdleWindow, r.Command)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tN\tLISTs\tWATCHes\tdaemon L+W\tapiserver CPU s\tnode CPU s\tnode RSS MiB\tdaemon CPU s\tdaemon idle CPU s/min\tdaemon CPU s updates\tdaemon CPU us/delivery\tsync s (median)\tp50 ms\tp99 ms\tdelivered/s\tmissed\tclient heap B/obj\tdaemon heap B/obj\t")
	for _, x := range r.Runs {
		daemonHeap := "-"
		if !strings.HasPrefix(x.Mode, "direct") {
			daemonHeap = fmt.Sprintf("%.0f", x.DaemonHeapPerObject)
		}
		clientHeap := fmt.Sprintf("%.0f", x.ClientHeapPerObject)
		if x.Mode == modeNoStore {
			clientHeap = "-"
		}
		daemonLW, daemonCPU := "-", []string{"-", "-", "-", "-"}
		if !strings.HasPrefix(x.Mode, "direct") {
			daemonLW = fmt.Sprintf("%d+%d", x.DaemonLists, x.DaemonWatches)
			daemonCPU = []string{fmt.Sprintf("%.2f", x.DaemonCPUSeconds), fmt.Sprintf("%.2f", x.DaemonIdleCPUSecondsPerMinute),
				fmt.Sprintf("%.2f", x.DaemonUpdatesCPUSeconds), fmt.Sprintf("%.0f", x.DaemonCPUMicrosPerDelivery)}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%.1f\t%.1f\t%.0f\t%s\t%.2f\t%.1f\t%.1f\t%.0f\t%d\t%s\t%s\t\n",
			x.Mode, x.Clients, x.UpstreamLists, x.UpstreamWatches, daemonLW, x.APIServerCPUSeconds, x.NodeCPUSeconds,
			float64(x.NodeRSSBytes)/(1<<20), strings.Join(daemonCPU, "\t"), x.SyncSecondsMedian, x.LatencyP50Millis, x.LatencyP99Millis,
			x.EventsPerS, x.Missed, clientHeap, daemonHeap)
	}
	tw.Flush()
	s := r.Snapshot
	fmt.Fprintf(w, "\nsnapshot of %d ConfigMaps (median of %d): informerd %.1f ms (decoded %.1f ms); direct LIST JSON %.1f ms, dynamic client %.1f ms, protobuf typed %.1f ms\n\n",
		s.Objects, s.Reps, s.SharedMillis, s.SharedDecodedMillis, s.DirectJSONMillis, s.DirectDecodedMillis, s.DirectProtobufMillis)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "target\tgoal\tmeasured\tmet")
	for _, t := range r.Targets {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%v\n", t.Name, t.Goal, t.Value, t.Met)
	}
	tw.Flush()
}

// percentile returns the p-quantile (0..1) of v, nearest rank.
func percentile(v []int64, p float64) float64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return percentileF(f, p)
}

func percentileF(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(v []float64) float64 { return percentileF(v, 0.5) }
