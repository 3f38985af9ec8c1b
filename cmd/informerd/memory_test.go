package main

import (
	"math"
	"testing"
)

// TestMemoryLimits: the Go memory limit is GOMEMLIMIT, else 7/8 of the
// container's limit (cgroup v2, then v1), which the daemon then sets;
// -max-log-bytes-total defaults to a quarter of it, else 1 GiB; "no limit"
// in any of its spellings is none; a GOMEMLIMIT that leaves the container
// less than 1/8 is flagged.
func TestMemoryLimits(t *testing.T) {
	const mib = 1 << 20
	for _, tt := range []struct {
		name       string
		goMemLimit int64
		cgroup     []string
		want       memoryLimits
		logBytes   int64
		tight      bool
	}{
		{"the chart: GOMEMLIMIT 7/8 of the 512 MiB limit", 448 * mib, []string{"536870912\n"}, memoryLimits{container: 512 * mib, goLimit: 448 * mib}, 112 * mib, false},
		{"GOMEMLIMIT is the container's limit", 512 * mib, []string{"536870912\n"}, memoryLimits{container: 512 * mib, goLimit: 512 * mib}, 128 * mib, true},
		{"GOMEMLIMIT without a container limit", 450 * mib, []string{"max\n"}, memoryLimits{goLimit: 450 * mib}, 450 * mib / 4, false},
		{"no GOMEMLIMIT: 7/8 of the cgroup v2 limit", math.MaxInt64, []string{"536870912\n"}, memoryLimits{container: 512 * mib, goLimit: 448 * mib, derived: true}, 112 * mib, false},
		{"cgroup v2 without a limit, v1 with one", math.MaxInt64, []string{"max\n", "268435456\n"}, memoryLimits{container: 256 * mib, goLimit: 224 * mib, derived: true}, 56 * mib, false},
		{"cgroup v1 without a limit", math.MaxInt64, []string{"9223372036854771712\n"}, memoryLimits{}, 1 << 30, false},
		{"no limit anywhere", math.MaxInt64, []string{"max\n"}, memoryLimits{}, 1 << 30, false},
		{"no cgroup files", math.MaxInt64, nil, memoryLimits{}, 1 << 30, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := limitsOf(tt.goMemLimit, tt.cgroup...)
			if m != tt.want {
				t.Fatalf("limits %+v, want %+v", m, tt.want)
			}
			if got := m.logBytes(); got != tt.logBytes {
				t.Errorf("-max-log-bytes-total %d, want %d", got, tt.logBytes)
			}
			if m.tight() != tt.tight {
				t.Errorf("tight %t, want %t", m.tight(), tt.tight)
			}
		})
	}
}
