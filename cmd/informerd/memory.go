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

// logShareOfMemory is the part of the daemon's memory limit that the
// event logs may refer to by default: the stores, which hold every
// object once, the clients' streams and the Go runtime's headroom take
// the rest (docs/operations.md, "Sizing").
const logShareOfMemory = 4

// cgroupMemoryFiles are where the container's memory limit is read, cgroup
// v2 first.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memoryLimit returns the memory the daemon may use: GOMEMLIMIT as the Go
// runtime holds it, else the container's (cgroup's) memory limit, else 0
// for none.
func memoryLimit() int64 {
	var cgroup []string
	for _, f := range cgroupMemoryFiles {
		if b, err := os.ReadFile(f); err == nil {
			cgroup = append(cgroup, string(b))
		}
	}
	return limitOf(debug.SetMemoryLimit(-1), cgroup...)
}

// limitOf returns goMemLimit (the runtime's limit; math.MaxInt64 is none)
// if set, else the first of the cgroup files' contents that is a limit
// ("max", or a number that is no limit, is none), else 0.
func limitOf(goMemLimit int64, cgroup ...string) int64 {
	if goMemLimit > 0 && goMemLimit < math.MaxInt64 {
		return goMemLimit
	}
	for _, s := range cgroup {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		// cgroup v1 says "no limit" with a huge number rounded to pages.
		if err == nil && n > 0 && n < math.MaxInt64/2 {
			return n
		}
	}
	return 0
}

// logBytesFor returns the default -max-log-bytes-total for a memory limit
// (0: none): a quarter of it, so that the logs cannot take the daemon
// past its limit, and defaultLogBytes without one.
func logBytesFor(limit int64) int64 {
	if limit <= 0 {
		return defaultLogBytes
	}
	return limit / logShareOfMemory
}
