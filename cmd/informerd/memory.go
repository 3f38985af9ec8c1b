package main

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// defaultLogBytes is -max-log-bytes-total without a memory limit.
const defaultLogBytes = 1 << 30

// logShareOfMemory is the part of the Go memory limit that the event logs
// may refer to by default: the stores, which hold every object once, the
// encoded frames of the events in the logs, the clients' streams and the
// garbage collector's headroom take the rest (docs/operations.md,
// "Memory").
const logShareOfMemory = 4

// goShareOfContainer is the part of the container's memory limit (in
// eighths) that the Go runtime is given as its limit when GOMEMLIMIT is not
// set: the rest is for what the runtime does not count (the binary's pages,
// the kernel's socket buffers and page tables) and for its overshoot while a
// collection runs. The DaemonSet and the chart set GOMEMLIMIT to the same
// share (448MiB of 512Mi).
const goShareOfContainer = 7

// cgroupMemoryFiles are where the container's memory limit is read, cgroup
// v2 first.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memoryLimits are the daemon's memory limits, in bytes; 0 is none.
type memoryLimits struct {
	// container is the container's (cgroup's) memory limit.
	container int64
	// goLimit is the Go runtime's memory limit: GOMEMLIMIT, else
	// goShareOfContainer eighths of container.
	goLimit int64
	// derived: goLimit was set from container, GOMEMLIMIT being unset.
	derived bool
}

// readMemoryLimits reads GOMEMLIMIT as the Go runtime holds it and the
// container's memory limit.
func readMemoryLimits() memoryLimits {
	var cgroup []string
	for _, f := range cgroupMemoryFiles {
		if b, err := os.ReadFile(f); err == nil {
			cgroup = append(cgroup, string(b))
		}
	}
	return limitsOf(debug.SetMemoryLimit(-1), cgroup...)
}

// limitsOf returns the limits for goMemLimit (the runtime's limit;
// math.MaxInt64 is none) and the cgroup files' contents, the first that is
// a limit counting ("max", or a number that is no limit, is none).
func limitsOf(goMemLimit int64, cgroup ...string) memoryLimits {
	var m memoryLimits
	for _, s := range cgroup {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		// cgroup v1 says "no limit" with a huge number rounded to pages.
		if err == nil && n > 0 && n < math.MaxInt64/2 {
			m.container = n
			break
		}
	}
	switch {
	case goMemLimit > 0 && goMemLimit < math.MaxInt64:
		m.goLimit = goMemLimit
	case m.container > 0:
		m.goLimit, m.derived = m.container/8*goShareOfContainer, true
	}
	return m
}

// apply gives the Go runtime its limit, if it was derived from the
// container's (GOMEMLIMIT, when set, is the runtime's already).
func (m memoryLimits) apply() {
	if m.derived {
		debug.SetMemoryLimit(m.goLimit)
	}
}

// source names where goLimit came from, for the log.
func (m memoryLimits) source() string {
	switch {
	case m.derived:
		return "7/8 of the container limit"
	case m.goLimit > 0:
		return "GOMEMLIMIT"
	}
	return "none"
}

// tight reports whether GOMEMLIMIT leaves the container less than
// goShareOfContainer eighths for what the Go runtime does not count.
func (m memoryLimits) tight() bool {
	return m.container > 0 && m.goLimit > m.container/8*goShareOfContainer
}

// logBytes returns the default -max-log-bytes-total: a quarter of the Go
// memory limit, so that the logs cannot take the daemon past it, and
// defaultLogBytes without one.
func (m memoryLimits) logBytes() int64 {
	if m.goLimit <= 0 {
		return defaultLogBytes
	}
	return m.goLimit / logShareOfMemory
}
