package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestMain lets the test binary stand in for outbox-load when measure
// re-runs its own executable as the baseline server.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == serveBareCommand {
		os.Exit(serveBare(os.Args[2:]))
	}
	os.Exit(m.Run())
}

var (
	buildOnce   sync.Once
	builtBinary string
	buildErr    error
)

// mcpOutbox builds mcp-outbox once for the tests of this package.
func mcpOutbox(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outbox-load-test-")
		if err != nil {
			buildErr = err
			return
		}
		builtBinary = filepath.Join(dir, "mcp-outbox")
		var log bytes.Buffer
		cmd := execGo("build", "-o", builtBinary, "../mcp-outbox")
		cmd.Stderr = &log
		if err := cmd.Run(); err != nil {
			buildErr = err
			builtBinary = log.String()
		}
	})
	if buildErr != nil {
		t.Fatalf("build mcp-outbox: %v\n%s", buildErr, builtBinary)
	}
	return builtBinary
}

// rows returns the table rows of out by cell title and side, each row's
// fields after the side's name.
func rows(out string) map[string]map[string][]string {
	res := map[string]map[string][]string{}
	var cell string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case strings.Contains(l, " clients") && !strings.HasPrefix(l, "outbox-load"):
			cell = l
			res[cell] = map[string][]string{}
		case cell != "" && len(f) > 1 && f[0] != "side":
			res[cell][f[0]] = f[1:]
		}
	}
	return res
}

// The load tool runs its whole plan end to end at a tiny size on SQLite:
// every cell has a row per side, with calls, no errors, and allocations per
// call wherever the servers can tell (HTTP). The figures mean nothing at
// this size.
func TestRunPlanSQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mcp-outbox and runs servers")
	}
	bin := mcpOutbox(t)
	var out, log bytes.Buffer
	code := run(context.Background(), []string{"--clients", "1,3", "--duration", "300ms", "--warmup", "100ms",
		"--rounds", "1", "--mcp-outbox", bin}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log.String())
	}
	got := rows(out.String())
	wantCells := []string{
		"http stateless, keyed, 1 clients", "http stateless, keyed, 3 clients",
		"http session, keyed, 3 clients", "http stateless, keyless, 3 clients",
		"stdio, keyed, 1 clients", "stdio, keyed, 3 clients",
	}
	if len(got) != len(wantCells) {
		t.Errorf("%d cells, want %d\n%s", len(got), len(wantCells), out.String())
	}
	for _, c := range wantCells {
		for _, side := range []string{"limit", "careful", "expert", "layer"} {
			f := got[c][side]
			if len(f) != 15 {
				t.Errorf("%s, %s: row %q\n%s", c, side, f, out.String())
				continue
			}
			if rate, _ := strconv.ParseFloat(f[0], 64); rate <= 0 {
				t.Errorf("%s, %s: %s calls/s", c, side, f[0])
			}
			if f[14] != "0" {
				t.Errorf("%s, %s: %s errors", c, side, f[14])
			}
			p99, err1 := time.ParseDuration(f[5])
			most, err2 := time.ParseDuration(f[6])
			if err1 != nil || err2 != nil || most < p99 || p99 <= 0 {
				t.Errorf("%s, %s: p99 %q, max %q", c, side, f[5], f[6])
			}
			allocs := f[10]
			if strings.HasPrefix(c, "stdio") != (allocs == "n/a") {
				t.Errorf("%s, %s: allocs/call %q", c, side, allocs)
			}
		}
	}
}

// --profile-dir has each server, the layer and a bare one alike, write
// its CPU and allocations profiles when it stops.
func TestRunProfileDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mcp-outbox and runs servers")
	}
	bin := mcpOutbox(t)
	dir := filepath.Join(t.TempDir(), "profiles")
	var out, log bytes.Buffer
	code := run(context.Background(), []string{"--quick", "--clients", "1", "--duration", "200ms", "--warmup", "50ms",
		"--rounds", "1", "--sides", "expert,layer", "--profile-dir", dir, "--mcp-outbox", bin}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log.String())
	}
	for _, side := range []string{"expert", "layer"} {
		for _, kind := range []string{"cpu", "allocs"} {
			name := filepath.Join(dir, "cell1-"+side+"-1c-r1."+kind+".pprof")
			if st, err := os.Stat(name); err != nil || st.Size() == 0 {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

// On PostgreSQL the plan is the HTTP stateless cells with a side of
// several replicas.
func TestRunPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mcp-outbox and starts PostgreSQL")
	}
	if err := pgtest.Available(); err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	bin := mcpOutbox(t)
	var out, log bytes.Buffer
	code := run(context.Background(), []string{"--store", "postgres", "--clients", "4", "--duration", "300ms", "--warmup", "100ms",
		"--rounds", "1", "--replicas", "2", "--rtt", "2ms", "--mcp-outbox", bin}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log.String())
	}
	got := rows(out.String())["http stateless, keyed, 4 clients, 2ms RTT to PostgreSQL"]
	for _, side := range []string{"limit", "careful", "pgx", "layer", "layer-x2"} {
		if f := got[side]; len(f) != 17 || f[16] != "0" || f[12] == "n/a" {
			t.Errorf("side %q: row %q (want calls, allocations and 0 errors)\n%s", side, f, out.String())
		}
	}
	if f := got["limit"]; len(f) == 17 && f[9] != "-" {
		t.Errorf("limit: database CPU %q per call, but it has no database", f[9])
	}
	// Round trips, commits and the database's CPU per call, for every
	// side that writes. The CPU is read from /proc in clock ticks (10 ms),
	// so one side's 300 ms at 4 clients can round to 0; all of them
	// together cannot.
	var dbTotal time.Duration
	for _, side := range []string{"careful", "pgx", "layer", "layer-x2"} {
		f := got[side]
		if len(f) != 17 {
			continue
		}
		rts, err1 := strconv.ParseFloat(f[14], 64)
		commits, err2 := strconv.ParseFloat(f[15], 64)
		if err1 != nil || err2 != nil || rts < 1 || commits < 1 {
			t.Errorf("side %q: %q round trips and %q commits per call", side, f[14], f[15])
		}
		db, err := time.ParseDuration(f[9])
		if err != nil || db < 0 {
			t.Errorf("side %q: database CPU %q per call", side, f[9])
		}
		dbTotal += db
	}
	if dbTotal <= 0 {
		t.Errorf("no side measured any database CPU:\n%s", out.String())
	}
	if f := got["careful"]; len(f) == 17 && f[9] != "0s" && f[10] != "1.00x" {
		t.Errorf("careful: database CPU %q of its own", f[10])
	}
}

// Bad flags are refused before anything starts.
func TestRunRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--clients", "0"}, {"--clients", "8,x"}, {"--store", "mysql"}, {"--rounds", "0"}, {"extra"},
		{"--rtt", "1ms"}, {"--store", "postgres", "--rtt", "fast"},
	} {
		var out, log bytes.Buffer
		if code := run(context.Background(), args, &out, &log); code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, code, log.String())
		}
	}
}

func execGo(args ...string) *exec.Cmd { return exec.Command("go", args...) }

// The tasks mode runs end to end at a tiny size on SQLite: each level has
// a row for plain calls, task creations and tasks/get polls, each with
// calls and no errors (a plain answer where a task was asked, or a poll
// that does not find its task, would count as one).
func TestRunTasksSQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mcp-outbox and runs servers")
	}
	bin := mcpOutbox(t)
	var out, log bytes.Buffer
	code := run(context.Background(), []string{"--tasks", "--clients", "1,3", "--duration", "300ms", "--warmup", "100ms",
		"--rounds", "1", "--mcp-outbox", bin}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log.String())
	}
	if !strings.Contains(out.String(), "command: outbox-load --tasks --clients 1,3") {
		t.Errorf("no command line in\n%s", out.String())
	}
	got := rows(out.String())
	for _, c := range []string{"tasks, 1 clients", "tasks, 3 clients"} {
		for _, load := range []string{"plain", "task", "get"} {
			f := got[c][load]
			if len(f) != 9 {
				t.Errorf("%s, %s: row %q\n%s", c, load, f, out.String())
				continue
			}
			if rate, _ := strconv.ParseFloat(f[0], 64); rate <= 0 {
				t.Errorf("%s, %s: %s calls/s", c, load, f[0])
			}
			if f[8] != "0" {
				t.Errorf("%s, %s: %s errors", c, load, f[8])
			}
		}
	}
}
