package main

import (
	"maps"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	v := []int64{50, 10, 40, 20, 30, 60, 70, 80, 90, 100}
	for p, want := range map[float64]float64{0.5: 50, 0.99: 100, 0.1: 10, 1: 100, 0: 10} {
		if got := percentile(v, p); got != want {
			t.Errorf("percentile(%v) = %v, want %v", p, got, want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v, want 0", got)
	}
	if v[0] != 50 {
		t.Error("percentile sorted its input in place")
	}
}

func TestMetricSum(t *testing.T) {
	exp := []byte(`# HELP apiserver_request_total x
apiserver_request_total{code="200",resource="configmaps",verb="LIST"} 3
apiserver_request_total{code="200",resource="configmaps",verb="WATCH"} 5
apiserver_request_total{code="410",resource="configmaps",verb="LIST"} 1
apiserver_request_total{code="200",resource="pods",verb="LIST"} 7
apiserver_request_total_other{resource="configmaps",verb="LIST"} 100
go_gc_heap_live_bytes 1.2345e+06
`)
	if got := metricSum(exp, "apiserver_request_total", `verb="LIST"`, `resource="configmaps"`); got != 4 {
		t.Errorf("LISTs of configmaps = %v, want 4 (both codes, no other metric)", got)
	}
	if got := metricSum(exp, "go_gc_heap_live_bytes"); got != 1234500 {
		t.Errorf("a metric without labels = %v", got)
	}
}

func TestProcReaders(t *testing.T) {
	dir := t.TempDir()
	stat := filepath.Join(dir, "status")
	if err := os.WriteFile(stat, []byte("Name:\tx\nVmRSS:\t   2048 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := statusField(stat, "VmRSS:"); err != nil || got != 2048*1024 {
		t.Errorf("statusField = %d, %v; want 2 MiB", got, err)
	}
	if _, err := statusField(stat, "VmHWM:"); err == nil {
		t.Error("a missing line is not an error")
	}
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; { // use some CPU
	}
	cpu, err := procCPUSeconds(os.Getpid())
	own, _, _ := selfUsage()
	if err != nil || cpu <= 0 || math.Abs(cpu-own) > 0.1 {
		t.Errorf("CPU seconds from /proc = %v (%v); getrusage says %v", cpu, err, own)
	}
	if _, err := parseInts("1,x"); err == nil {
		t.Error("parseInts accepted x")
	}
	if got, err := parseInts(" 1, 10 ,50"); err != nil || len(got) != 3 || got[2] != 50 {
		t.Errorf("parseInts = %v, %v", got, err)
	}
}

func TestIdleRunDerive(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		run                           idleRun
		cpuPerMin, goroutines, heapPS float64
	}{
		{
			name:      "baseline: per minute only",
			run:       idleRun{WindowSeconds: 30, DaemonCPUSeconds: 0.5},
			cpuPerMin: 1,
		},
		{
			// The first process opened 334 of 1,000 streams (ceil); the
			// other 666 are what the figures divide by.
			name: "from the first process's streams to all",
			run: idleRun{Streams: 1000, Processes: 3, WindowSeconds: 60, DaemonCPUSeconds: 60,
				Empty: daemonState{Goroutines: 10}, First: daemonState{Goroutines: 1010, HeapLiveBytes: 1 << 20},
				All: daemonState{Goroutines: 1010 + 2*666, HeapLiveBytes: 1<<20 + 666*4096}},
			cpuPerMin: 60, goroutines: 2, heapPS: 4096,
		},
		{
			name: "one process: from no streams",
			run: idleRun{Streams: 100, Processes: 1, WindowSeconds: 60,
				Empty: daemonState{Goroutines: 10, HeapLiveBytes: 1000}, All: daemonState{Goroutines: 310, HeapLiveBytes: 1000 + 100*500}},
			goroutines: 3, heapPS: 500,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run
			r.derive()
			if r.DaemonCPUSecondsPerMinute != tc.cpuPerMin || r.GoroutinesPerStream != tc.goroutines || r.HeapBytesPerStream != tc.heapPS {
				t.Errorf("CPU s/min %v, goroutines/stream %v, heap B/stream %v; want %v, %v, %v",
					r.DaemonCPUSecondsPerMinute, r.GoroutinesPerStream, r.HeapBytesPerStream, tc.cpuPerMin, tc.goroutines, tc.heapPS)
			}
		})
	}
}

func TestMakeCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-bin", "/x/bin"}, "make bench-idle"},
		{[]string{"-bin", "/x/bin", "-streams", "10"}, "make bench-idle BENCH_IDLE_FLAGS='-streams 10'"},
		{[]string{"-window=5s", "-bin=/x/bin"}, "make bench-idle BENCH_IDLE_FLAGS='-window=5s'"},
	} {
		if got := makeCommand("make bench-idle", "BENCH_IDLE_FLAGS", tc.args); got != tc.want {
			t.Errorf("makeCommand(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// TestMetricByLabel: samples are summed by their label's value, and those
// without the label, or of another metric, are left out.
func TestMetricByLabel(t *testing.T) {
	b := []byte(`# HELP apiserver_watch_events_total x
apiserver_watch_events_total{group="",resource="pods",version="v1"} 10
apiserver_watch_events_total{group="apps",resource="pods",version="v1"} 5
apiserver_watch_events_total{group="",resource="configmaps",version="v1"} 2.5
apiserver_watch_events_total 7
apiserver_watch_events_total_other{resource="pods"} 100
`)
	got := metricByLabel(b, "apiserver_watch_events_total", "resource")
	if want := map[string]float64{"pods": 15, "configmaps": 2.5}; !maps.Equal(got, want) {
		t.Errorf("metricByLabel = %v, want %v", got, want)
	}
	if d := mapDelta(map[string]float64{"pods": 15, "nodes": 3}, map[string]float64{"pods": 10, "nodes": 3}); !maps.Equal(d, map[string]float64{"pods": 5}) {
		t.Errorf("mapDelta = %v, want only pods 5", d)
	}
}
