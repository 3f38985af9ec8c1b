package main

import (
	"math"
	"testing"
)

// TestLogBytesFromMemoryLimit: -max-log-bytes-total defaults to a quarter
// of GOMEMLIMIT, else of the container's limit (cgroup v2, then v1), else
// 1 GiB; "no limit" in any of its spellings is none.
func TestLogBytesFromMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	for _, tt := range []struct {
		name       string
		goMemLimit int64
		cgroup     []string
		want       int64
	}{
		{"the chart: GOMEMLIMIT is the 512 MiB limit", 512 * mib, []string{"536870912\n"}, 128 * mib},
		{"GOMEMLIMIT below the container's limit", 450 * mib, []string{"536870912\n"}, 450 * mib / 4},
		{"no GOMEMLIMIT: the cgroup v2 limit", math.MaxInt64, []string{"536870912\n"}, 128 * mib},
		{"cgroup v2 without a limit, v1 with one", math.MaxInt64, []string{"max\n", "268435456\n"}, 64 * mib},
		{"cgroup v1 without a limit", math.MaxInt64, []string{"9223372036854771712\n"}, 1 << 30},
		{"no limit anywhere", math.MaxInt64, []string{"max\n"}, 1 << 30},
		{"no cgroup files", math.MaxInt64, nil, 1 << 30},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := logBytesFor(limitOf(tt.goMemLimit, tt.cgroup...)); got != tt.want {
				t.Fatalf("%d bytes, want %d", got, tt.want)
			}
		})
	}
}
