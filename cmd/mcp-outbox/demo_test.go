package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
)

// TestDemoJSON runs `mcp-outbox demo --json` as a user would and checks what
// it prints and its exit code.
func TestDemoJSON(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "demo", "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("demo took %v; stderr:\n%s", time.Since(start).Round(time.Millisecond), stderr.String())
	if err != nil {
		t.Fatalf("demo --json: %v\nstdout:\n%s", err, stdout.String())
	}
	if !strings.Contains(stderr.String(), "[15/15]") {
		t.Errorf("stderr has no progress line for the last of 15 runs")
	}
	var rep struct {
		OK        bool   `json:"ok"`
		Summary   string `json:"summary"`
		Problems  []string
		Scenarios []struct {
			ID           scenario.ID           `json:"id"`
			Number       string                `json:"number"`
			Transport    string                `json:"transport"`
			Retrier      string                `json:"retrier"`
			LogicalCalls int                   `json:"logical_calls"`
			Charges      map[scenario.Mode]int `json:"charges"`
			Runs         []scenario.Result     `json:"runs"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, stdout.String())
	}
	if !rep.OK || len(rep.Problems) > 0 || rep.Summary == "" {
		t.Errorf("ok=%v problems=%q summary=%q", rep.OK, rep.Problems, rep.Summary)
	}
	var ids []string
	for _, s := range rep.Scenarios {
		ids = append(ids, s.Number+":"+string(s.ID))
		if s.Transport == "" || s.Retrier == "" || s.LogicalCalls != 1 {
			t.Errorf("scenario %s: transport %q, retrier %q, logical calls %d", s.ID, s.Transport, s.Retrier, s.LogicalCalls)
		}
		wantBare := 2
		if s.ID == scenario.FrameworkRetry {
			wantBare = 3
		}
		if got := s.Charges[scenario.Bare]; got < wantBare {
			t.Errorf("scenario %s without the layer: %d charges, want at least %d", s.ID, got, wantBare)
		}
		for _, m := range []scenario.Mode{scenario.LayerKey, scenario.LayerNoKey} {
			if got := s.Charges[m]; got != 1 {
				t.Errorf("scenario %s, %s: %d charges, want 1", s.ID, m, got)
			}
		}
		if len(s.Runs) != 3 {
			t.Errorf("scenario %s: %d runs, want 3", s.ID, len(s.Runs))
		}
		for _, r := range s.Runs {
			if r.Charges != s.Charges[r.Mode] || len(r.Attempts) == 0 || r.Attempts[0].What == "" {
				t.Errorf("scenario %s, run %s: charges %d, attempts %+v", s.ID, r.Mode, r.Charges, r.Attempts)
			}
			if r.DB != "" {
				t.Errorf("scenario %s, run %s: reports database %s, which the demo removed", s.ID, r.Mode, r.DB)
			}
		}
	}
	if got, want := strings.Join(ids, " "), "1:timeout 2:crash 3a:http-session 3b:http-stateless 4:framework-retry"; got != want {
		t.Errorf("scenarios %s, want %s", got, want)
	}
}

func TestDemoUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"demo", "--help"}, 0, "Usage: mcp-outbox demo"},
		{[]string{"demo", "--timeout", "2s", "--delay", "1s"}, 2, "must be shorter than --delay"},
		{[]string{"demo", "--delay", "0"}, 2, "must be positive"},
		{[]string{"demo", "extra"}, 2, `unexpected argument "extra"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, strings.NewReader(""), &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("%q: exit %d, want %d; output %q, want it to contain %q", tc.args, code, tc.code,
				stdout.String()+stderr.String(), tc.out)
		}
	}
}
