package gctune

import (
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

// TestMain lets the test binary report its collector target after Apply,
// in a fresh process whose environment the test controls (GOGC is read once,
// when a process starts).
func TestMain(m *testing.M) {
	if os.Getenv("GCTUNE_REPORT") == "1" {
		p, fromEnv := Apply()
		now := debug.SetGCPercent(p)
		source := "default"
		if fromEnv {
			source = "env"
		}
		fmt.Printf("%d %d %s %d", p, now, source, debug.SetMemoryLimit(-1))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestApply(t *testing.T) {
	for _, tc := range []struct {
		gogc     string // "" leaves GOGC out of the environment
		memLimit string // "" leaves GOMEMLIMIT out
		want     string
	}{
		{"", "", "400 400 default 134217728"},
		{"100", "", "100 100 env 134217728"},
		{"250", "", "250 250 env 134217728"},
		{"off", "", "-1 -1 env 134217728"},
		{"", "1GiB", "400 400 default 1073741824"},
		{"", "off", "400 400 default 9223372036854775807"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		env := []string{"GCTUNE_REPORT=1"}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
				env = append(env, kv)
			}
		}
		if tc.gogc != "" {
			env = append(env, "GOGC="+tc.gogc)
		}
		if tc.memLimit != "" {
			env = append(env, "GOMEMLIMIT="+tc.memLimit)
		}
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GOGC=%q: %v", tc.gogc, err)
		}
		if got := string(out); got != tc.want {
			t.Errorf("GOGC=%q: got %q, want %q (percent applied, percent in force, source, memory limit)", tc.gogc, got, tc.want)
		}
	}
}
