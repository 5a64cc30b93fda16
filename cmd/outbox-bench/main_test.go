package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestRun_Quick runs every measurement with tiny sizes, to keep the
// program working; its figures mean nothing and are not checked.
func TestRun_Quick(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--quick", "--json", "--dir", t.TempDir()}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr.String())
	}
	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("stdout is not a JSON report: %v\n%s", err, stdout.String())
	}
	if len(rep.Results) != 7 {
		t.Fatalf("%d results, want 7: %+v", len(rep.Results), rep.Results)
	}
	for i, r := range rep.Results {
		if r.ID != i+1 || r.Name == "" || r.Unit == "" || r.BaselineName == "" || r.Target.Op == "" {
			t.Errorf("result %d: %+v", i+1, r)
		}
		if r.Figure <= 0 || r.Baseline <= 0 {
			t.Errorf("result %d (%s): figure %v, baseline %v; want both measured", r.ID, r.Name, r.Figure, r.Baseline)
		}
	}
	if !strings.Contains(stderr.String(), "target 4") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
}

func TestRun_Usage(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Errorf("--help: exit %d, want 0", code)
	}
	if !strings.Contains(stderr.String(), "Usage: outbox-bench") || !strings.Contains(stderr.String(), "-json") {
		t.Errorf("--help printed:\n%s", stderr.String())
	}
	if code := run(context.Background(), []string{"--bogus"}, &stdout, &stderr); code != 2 {
		t.Errorf("--bogus: exit %d, want 2", code)
	}
	if code := run(context.Background(), []string{"extra"}, &stdout, &stderr); code != 2 {
		t.Errorf("an argument: exit %d, want 2", code)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q, want nothing", stdout.String())
	}
}

// TestRun_Only runs the chosen targets and reports only those; a bad list
// is a usage error.
func TestRun_Only(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--quick", "--json", "--only", "3,2", "--dir", t.TempDir()}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr.String())
	}
	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 || rep.Results[0].ID != 2 || rep.Results[1].ID != 3 {
		t.Errorf("--only 3,2 reported %+v, want targets 2 and 3", rep.Results)
	}
	if strings.Contains(stderr.String(), "target 4") || strings.Contains(stderr.String(), "seeding") {
		t.Errorf("--only 3,2 measured more:\n%s", stderr.String())
	}
	for _, bad := range []string{"8", "1,x", "0"} {
		stderr.Reset()
		if code := run(context.Background(), []string{"--only", bad}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "want target numbers") {
			t.Errorf("--only %q: exit %d, stderr %q; want exit 2 naming the target numbers", bad, code, stderr.String())
		}
	}
}
