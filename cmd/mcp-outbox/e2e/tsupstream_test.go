package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// testdata/ts-upstream/server.mjs is a real upstream tool server for the
// proxy, written with the official TypeScript MCP SDK and better-sqlite3. It
// follows the contract of schema/README.md. It needs node and its npm
// packages (npm ci in testdata/ts-upstream, which `make test` does); without
// them the tests that use it are skipped, unless MCP_OUTBOX_REQUIRE_INTEROP=1
// makes that a failure.

// tsUpstreamClaimMeta is the _meta entry of a tools/call that the proxy
// recorded: it hands the claim to the upstream.
const tsUpstreamClaimMeta = "io.github.mcp-outbox/claim"

// tsUpstreamReady starts the line server.mjs prints on stderr once serving.
const tsUpstreamReady = "ts-upstream ready pid="

// tsClaimMeta is the _meta of a tools/call that carries a claim: the call's
// key, its uid (callId), its calls.id (rowId) and calls.owner.
func tsClaimMeta(key, callID string, rowID int64, owner string) mcp.Meta {
	return mcp.Meta{tsUpstreamClaimMeta: map[string]any{
		"key":    key,
		"callId": callID,
		"rowId":  rowID,
		"owner":  owner,
	}}
}

// tsUpstreamDir returns the absolute path of testdata/ts-upstream, or skips
// the test (fails it under MCP_OUTBOX_REQUIRE_INTEROP=1) when node or the npm
// packages are missing.
func tsUpstreamDir(t *testing.T) string {
	t.Helper()
	const what = "TypeScript upstream"
	skipShortInterop(t, what)
	missing := func(why string) { t.Helper(); skipInterop(t, what, why) }
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "ts-upstream"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node is not in PATH")
	}
	for _, pkg := range []string{"@modelcontextprotocol/sdk", "better-sqlite3"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			missing("testdata/ts-upstream/node_modules is missing: run `npm ci` in testdata/ts-upstream, or `make test`")
		}
	}
	// better-sqlite3's install script builds this; npm may skip install scripts.
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "better-sqlite3", "build", "Release", "better_sqlite3.node")); err != nil {
		missing("better-sqlite3's native module was not built (did npm skip its install script?): run `npm ci` in testdata/ts-upstream")
	}
	return dir
}

// tsUpstreamCommand returns an unstarted `node server.mjs` of
// testdata/ts-upstream (absolute path, run in that directory) serving the
// SQLite file dbPath, which must already hold the outbox tables
// (schema.Open). env adds or overrides variables (UPSTREAM_COOPERATE=0,
// UPSTREAM_CRASH_ONCE_FILE=..., UPSTREAM_HTTP_PORT=0, ...); UPSTREAM_*
// variables of the test's own environment are not passed on. Its stderr goes
// to the test log; replace cmd.Stderr to read it. It skips or fails the test
// like tsUpstreamDir.
func tsUpstreamCommand(t *testing.T, dbPath string, env ...string) *exec.Cmd {
	t.Helper()
	dir := tsUpstreamDir(t)
	cmd := exec.Command("node", filepath.Join(dir, "server.mjs"))
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "UPSTREAM_") && !strings.HasPrefix(kv, "MCP_OUTBOX_DB=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "MCP_OUTBOX_DB="+dbPath)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = testWriter{t}
	return cmd
}

// lineWatch is an io.Writer for a subprocess's stderr: it logs each line to
// the test and remembers the first line with a given prefix.
type lineWatch struct {
	t      *testing.T
	prefix string
	found  chan string // receives the first matching line, once

	mu   sync.Mutex
	buf  string
	seen bool
	all  strings.Builder // every whole line so far
}

// String returns every whole line written so far.
func (w *lineWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

func newLineWatch(t *testing.T, prefix string) *lineWatch {
	return &lineWatch{t: t, prefix: prefix, found: make(chan string, 1)}
}

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf += string(p)
	for {
		line, rest, ok := strings.Cut(w.buf, "\n")
		if !ok {
			break
		}
		w.buf = rest
		w.all.WriteString(line + "\n")
		w.t.Logf("%s", line)
		if !w.seen && strings.HasPrefix(line, w.prefix) {
			w.seen = true
			w.found <- line
		}
	}
	return len(p), nil
}

// upstreamKind is one implementation of the upstream the proxy tests run:
// the same tools and behaviour in another language, on that language's
// contract module.
type upstreamKind struct {
	name    string // the subtest's name: "ts", "py", ...
	ready   string // the start of its ready line on stderr
	command func(t *testing.T, dbPath string, env ...string) *exec.Cmd
	check   func(t *testing.T) // skips, or fails, the test early when it cannot run
}

var (
	tsUpstreamKind = upstreamKind{name: "ts", ready: tsUpstreamReady, command: tsUpstreamCommand,
		check: func(t *testing.T) { t.Helper(); tsUpstreamDir(t) }}
	pyUpstreamKind = upstreamKind{name: "py", ready: pyUpstreamReady, command: pyUpstreamCommand,
		check: func(t *testing.T) { t.Helper(); pyUpstreamDir(t) }}
)

// pyUpstreamKindVenv is the Python upstream in virtual environment venv,
// named py-<venv>.
func pyUpstreamKindVenv(venv string) upstreamKind {
	return upstreamKind{name: "py-" + venv, ready: pyUpstreamReady,
		command: func(t *testing.T, dbPath string, env ...string) *exec.Cmd {
			t.Helper()
			return pyUpstreamCommandVenv(t, venv, dbPath, env...)
		},
		check: func(t *testing.T) { t.Helper(); pyUpstreamVenv(t, venv) }}
}

// upstreamKinds are the upstreams every proxy test runs against.
var upstreamKinds = []upstreamKind{tsUpstreamKind, pyUpstreamKind}

// forEachUpstream runs f as a subtest per upstream kind, named after it.
func forEachUpstream(t *testing.T, kinds []upstreamKind, f func(t *testing.T, up upstreamKind)) {
	t.Helper()
	for _, up := range kinds {
		t.Run(up.name, func(t *testing.T) {
			up.check(t)
			f(t, up)
		})
	}
}
