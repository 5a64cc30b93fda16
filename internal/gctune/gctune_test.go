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
		fmt.Printf("%d %d %s", p, now, source)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestApply(t *testing.T) {
	for _, tc := range []struct {
		gogc string // "" leaves GOGC out of the environment
		want string
	}{
		{"", "400 400 default"},
		{"100", "100 100 env"},
		{"250", "250 250 env"},
		{"off", "-1 -1 env"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		env := []string{"GCTUNE_REPORT=1"}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "GOGC=") {
				env = append(env, kv)
			}
		}
		if tc.gogc != "" {
			env = append(env, "GOGC="+tc.gogc)
		}
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GOGC=%q: %v", tc.gogc, err)
		}
		if got := string(out); got != tc.want {
			t.Errorf("GOGC=%q: got %q, want %q (percent applied, percent in force, source)", tc.gogc, got, tc.want)
		}
	}
}
