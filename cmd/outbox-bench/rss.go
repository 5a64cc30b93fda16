package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// resetPeakRSS returns freed memory to the system and resets the process's
// peak resident set size (VmHWM), so that the next peakRSS covers only
// what follows. Linux only.
func resetPeakRSS() error {
	debug.FreeOSMemory()
	// "5" resets the peak RSS to the current RSS (proc(5), since Linux 4.0).
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS: %w", err)
	}
	return nil
}

// peakRSS reads VmHWM from /proc/self/status, in MiB: the stricter
// reading of the target's "60 MB".
func peakRSS() (float64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read peak RSS: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest) // "12345 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("read peak RSS: unexpected VmHWM %q", rest)
		}
		kb, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("read peak RSS: %w", err)
		}
		return kb / 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read peak RSS: %w", err)
	}
	return 0, fmt.Errorf("read peak RSS: no VmHWM in /proc/self/status")
}
