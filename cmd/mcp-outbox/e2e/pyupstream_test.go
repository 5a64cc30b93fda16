package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// testdata/py-upstream/server.py is the same upstream tool server as
// testdata/ts-upstream/server.mjs, written in Python with the official SDK's
// FastMCP and the standard library's sqlite3, on the contract module
// testdata/py-upstream/mcp_outbox_upstream.py. It runs in one of the virtual
// environments `make py` creates under testdata/python: "seed" (mcp 1.29.1,
// the default) or "latest". MCP_OUTBOX_PY_VENV=latest chooses the other for
// the tests that take the default. Without the environment the tests that
// use it are skipped, unless MCP_OUTBOX_REQUIRE_INTEROP=1 makes that a
// failure.

// pyUpstreamReady starts the line server.py prints on stderr once serving.
const pyUpstreamReady = "py-upstream ready pid="

// pyVenvDefault is the virtual environment pyUpstreamCommand runs in:
// MCP_OUTBOX_PY_VENV, or "seed".
func pyVenvDefault() string {
	if v := os.Getenv("MCP_OUTBOX_PY_VENV"); v != "" {
		return v
	}
	return "seed"
}

// pyUpstreamDir returns the absolute path of testdata/py-upstream, or skips
// the test (fails it under MCP_OUTBOX_REQUIRE_INTEROP=1) when the default
// virtual environment is missing.
func pyUpstreamDir(t *testing.T) string {
	t.Helper()
	dir, _ := pyUpstreamVenv(t, pyVenvDefault())
	return dir
}

// pyUpstreamVenv returns the absolute paths of testdata/py-upstream and of
// the python of virtual environment venv ("seed", "latest", "newest"), or skips the
// test (fails it under MCP_OUTBOX_REQUIRE_INTEROP=1) when that environment
// is missing or has no mcp package.
func pyUpstreamVenv(t *testing.T, venv string) (dir, python string) {
	t.Helper()
	const what = "Python upstream"
	skipShortInterop(t, what)
	missing := func(why string) { t.Helper(); skipInterop(t, what, why) }
	testdata, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	env := filepath.Join(testdata, "python", ".venv-"+venv)
	python = filepath.Join(env, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		missing("testdata/python/.venv-" + venv + " is missing: run `make py`")
	}
	// Asking python would cost a start-up per test; the package's files say
	// the same. FastMCP is mcp.server.fastmcp in mcp 1.x and
	// mcp.server.mcpserver (MCPServer) from 2.0.
	found := false
	for _, pkg := range []string{"fastmcp", "mcpserver"} {
		if m, _ := filepath.Glob(filepath.Join(env, "lib", "python3*", "site-packages", "mcp", "server", pkg, "__init__.py")); len(m) > 0 {
			found = true
		}
	}
	if !found {
		missing("testdata/python/.venv-" + venv + " has no mcp package with FastMCP: run `make py`")
	}
	return filepath.Join(testdata, "py-upstream"), python
}

// pyUpstreamCommand returns an unstarted `python server.py` of
// testdata/py-upstream in the default virtual environment (see
// pyVenvDefault), with exactly the semantics of tsUpstreamCommand: dbPath
// must already hold the outbox tables; env adds or overrides variables;
// UPSTREAM_* variables of the test's own environment are not passed on; its
// stderr goes to the test log. It skips or fails the test like
// pyUpstreamDir.
func pyUpstreamCommand(t *testing.T, dbPath string, env ...string) *exec.Cmd {
	t.Helper()
	return pyUpstreamCommandVenv(t, pyVenvDefault(), dbPath, env...)
}

// pyUpstreamCommandVenv is pyUpstreamCommand in virtual environment venv.
func pyUpstreamCommandVenv(t *testing.T, venv, dbPath string, env ...string) *exec.Cmd {
	t.Helper()
	dir, python := pyUpstreamVenv(t, venv)
	// The venv's python itself, not a shell or an activate script: a
	// SIGKILL of this process is then a SIGKILL of the server.
	cmd := exec.Command(python, filepath.Join(dir, "server.py"))
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		// PYTHONPATH, PYTHONHOME and the like of the test's environment
		// would mix other packages into the venv's.
		if !strings.HasPrefix(kv, "UPSTREAM_") && !strings.HasPrefix(kv, "MCP_OUTBOX_DB=") &&
			!strings.HasPrefix(kv, "PYTHON") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// No __pycache__ written into the source tree by the tests' runs.
	cmd.Env = append(cmd.Env, "PYTHONDONTWRITEBYTECODE=1", "MCP_OUTBOX_DB="+dbPath)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = testWriter{t}
	return cmd
}

// TestUpstreamContractPyModule runs the unit tests of the Python contract
// module (testdata/py-upstream/test_mcp_outbox_upstream.py) on a database
// the proxy's schema created: the fence with a stale owner and at the
// outcome UPDATE, the rollbacks, the busy write lock and what is recorded,
// which the tests through server.py cannot reach.
func TestUpstreamContractPyModule(t *testing.T) {
	t.Parallel()
	dir, python := pyUpstreamVenv(t, pyVenvDefault())
	runPyContractModule(t, dir, python, filepath.Join(t.TempDir(), "shared.db"), "")
}

// runPyContractModule creates the outbox tables at target (a file or a
// postgres:// URL) and runs the contract module's unit tests on it; every
// test must run, none skipped, and the output must name mustRun when it is
// not "" (a test class of the store's own).
func runPyContractModule(t *testing.T, dir, python, target, mustRun string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := schema.Open(ctx, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "-v", "test_mcp_outbox_upstream")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "MCP_OUTBOX_TEST_DB="+target)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("python -m unittest test_mcp_outbox_upstream: %v", err)
	}
	// unittest exits 0 when everything was skipped: make sure it ran.
	if !regexp.MustCompile(`(?m)^Ran [1-9][0-9]* tests?`).Match(out) || strings.Contains(string(out), "skipped") ||
		!strings.Contains(string(out), mustRun) {
		t.Errorf("the module's tests did not all run")
	}
}
