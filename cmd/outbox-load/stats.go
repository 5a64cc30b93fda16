package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuOf sums the user and system time of the processes (Linux /proc).
func cpuOf(procs []*exec.Cmd) time.Duration {
	var total time.Duration
	for _, p := range procs {
		if p.Process == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Process.Pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
	}
	return total
}

// selfCPU is this process's user and system time: the load's own cost,
// which shares the machine with the servers.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mallocsOf sums the Go runtime's count of heap allocations of the servers,
// from the go_memstats_mallocs_total of their /metrics. ok is false when
// one of them does not tell (a stdio server has no HTTP side).
func mallocsOf(ctx context.Context, metricsURLs []string) (total float64, ok bool) {
	if len(metricsURLs) == 0 {
		return 0, false
	}
	for _, u := range metricsURLs {
		n, err := scrapeMallocs(ctx, u)
		if err != nil {
			return 0, false
		}
		total += n
	}
	return total, true
}

func scrapeMallocs(ctx context.Context, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_mallocs_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("%s: no go_memstats_mallocs_total", url)
}

// percentile is the p-quantile of sorted; p = 1 is the largest, which
// shows a stall that p99 can hide (a few calls held for seconds).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

// peakRSSOf sums the servers' peak resident set sizes (VmHWM), in bytes.
func peakRSSOf(procs []*exec.Cmd) int64 {
	var total int64
	for _, p := range procs {
		if p.Process == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Process.Pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}
