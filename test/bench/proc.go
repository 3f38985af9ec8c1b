package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// Linux fixes it at 100 on every architecture Go supports.
const clockTicks = 100

// procCPUSeconds returns the user+system CPU time a process has used.
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields start after
	// the last ')'. utime and stime are fields 14 and 15 of the line.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return float64(utime+stime) / clockTicks, nil
}

// procRSS returns a process's resident set size in bytes.
func procRSS(pid int) (uint64, error) {
	return statusField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
}

// selfUsage returns this process's CPU seconds, current RSS and peak RSS.
func selfUsage() (cpu float64, rss, peak uint64) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		cpu = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
		peak = uint64(ru.Maxrss) * 1024
	}
	rss, _ = statusField("/proc/self/status", "VmRSS:")
	return cpu, rss, peak
}

// statusField reads a "Name:   123 kB" line of a /proc status file.
func statusField(path, name string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("%s: no %s line", path, name)
}

// metricSum adds up the samples of a Prometheus text exposition whose line
// starts with name and contains every one of the label matchers.
func metricSum(exposition []byte, name string, matchers ...string) float64 {
	total := 0.0
	for _, line := range strings.Split(string(exposition), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, m := range matchers {
			ok = ok && strings.Contains(line, m)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total
}

// metricByLabel sums the samples of metric name by the value of label
// (samples without it are left out).
func metricByLabel(exposition []byte, name, label string) map[string]float64 {
	sums := map[string]float64{}
	for _, line := range strings.Split(string(exposition), "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		_, rest, ok := strings.Cut(line, label+`="`)
		if !ok {
			continue
		}
		value, _, _ := strings.Cut(rest, `"`)
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sums[value] += v
		}
	}
	return sums
}

// mapDelta returns after - before, key by key, leaving out zeros.
func mapDelta(after, before map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if v -= before[k]; v != 0 {
			d[k] = v
		}
	}
	return d
}

// scrape fetches a plain-HTTP metrics endpoint, with token if not empty.
func scrape(ctx context.Context, url, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}
