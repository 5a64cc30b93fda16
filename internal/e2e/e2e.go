// Package e2e is the harness of mcp-outbox's end-to-end tests: it builds
// the binary once per test process, starts `serve` and `proxy` as real
// subprocesses, and holds the calls and checks that both test packages use
// (cmd/mcp-outbox/e2e, whose tests start processes, and cmd/mcp-outbox,
// whose tests run package main in-process and start a process here and
// there). A test package cannot import another's _test.go files, so what
// both need lives here, once.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// mainPkg is the command the tests build: by import path, so that a test
// package anywhere in the module builds the same binary.
const mainPkg = "github.com/mcp-outbox/mcp-outbox/cmd/mcp-outbox"

// Binaries builds mcp-outbox twice into a temporary directory: bin a
// normal build, failpointBin with -tags failpoints. cleanup removes them
// and stops the shared PostgreSQL cluster, if a test started one; a
// TestMain calls it after m.Run.
func Binaries() (bin, failpointBin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "mcp-outbox-test-")
	if err != nil {
		return "", "", nil, err
	}
	bin = filepath.Join(dir, "mcp-outbox")
	failpointBin = filepath.Join(dir, "mcp-outbox-failpoints")
	for _, b := range []struct{ out, tags string }{{bin, ""}, {failpointBin, "failpoints"}} {
		// -buildvcs=auto stamps the commit (TestVersionCommand reads it)
		// even where GOFLAGS says -buildvcs=false, as on some CI machines.
		args := []string{"build", "-buildvcs=auto", "-o", b.out}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		cmd := exec.Command("go", append(args, mainPkg)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			os.RemoveAll(dir)
			return "", "", nil, fmt.Errorf("build test binary: %w", err)
		}
	}
	return bin, failpointBin, func() { pgtest.StopShared(); os.RemoveAll(dir) }, nil
}

// ServeStdio starts `binary serve --db dbPath args...` as a real subprocess
// speaking MCP on stdio, with env added to the environment, and returns a
// connected client session and the process. The session is closed and the
// process reaped at cleanup.
func ServeStdio(t *testing.T, binary, dbPath string, env []string, args ...string) (*mcp.ClientSession, *exec.Cmd) {
	t.Helper()
	return ServeStdioTo(t, TestWriter{t}, binary, dbPath, env, args...)
}

// ServeStdioTo is ServeStdio with the server's stderr going to stderr.
func ServeStdioTo(t *testing.T, stderr io.Writer, binary, dbPath string, env []string, args ...string) (*mcp.ClientSession, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"serve", "--db", dbPath, "--log-level", "warn"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to %s serve: %v", filepath.Base(binary), err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, cmd
}

// StartHTTP starts `binary serve --http 127.0.0.1:0` and returns the /mcp
// URL, read from the address the server prints on stderr.
func StartHTTP(t *testing.T, binary, dbPath string, env []string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"serve", "--db", dbPath, "--http", "127.0.0.1:0", "--log-level", "warn"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return StartHTTPCommand(t, cmd), cmd
}

// StartHTTPCommand starts a command that serves MCP over HTTP (serve or
// proxy with --http) and returns the /mcp URL it prints on stderr. The
// process is killed at cleanup.
func StartHTTPCommand(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	cmd.Stderr = nil
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			t.Log(line)
			if _, u, ok := strings.Cut(line, "serving MCP at "); ok {
				urls <- u
			}
		}
	}()
	select {
	case u := <-urls:
		return u
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not report its address", filepath.Base(cmd.Path))
		return ""
	}
}

// TestWriter sends a subprocess's stderr to the test log.
type TestWriter struct{ T *testing.T }

func (w TestWriter) Write(p []byte) (int, error) {
	w.T.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// SyncBuffer is a bytes.Buffer safe for a process's output and a test's
// reads at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// CLIResult is how a command line ended.
type CLIResult struct {
	Code           int
	Stdout, Stderr string
}

// RunCLI runs `binary args...` as a process with an empty stdin and an
// environment holding only vars and PATH (the command runs node or python
// for some arguments), so that the developer's own MCP_OUTBOX_* variables
// cannot change a test.
func RunCLI(t *testing.T, binary string, vars map[string]string, args ...string) CLIResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr SyncBuffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(""), &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.Exited():
	default:
		t.Fatalf("mcp-outbox %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return CLIResult{cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()}
}

// The interop tests need programs and packages from outside Go (node and
// the npm packages of testdata/, the Python environments of `make py`).
// Without them a test is skipped, unless MCP_OUTBOX_REQUIRE_INTEROP=1 (make
// test, CI) makes that a failure: there, a skipped interop test would be a
// promise left untested.
func InteropRequired() bool { return os.Getenv("MCP_OUTBOX_REQUIRE_INTEROP") == "1" }

// SkipInterop skips the test, or fails it when interop is required,
// because what cannot run for why.
func SkipInterop(t *testing.T, what, why string) {
	t.Helper()
	if InteropRequired() {
		t.Fatalf("%s: %s (MCP_OUTBOX_REQUIRE_INTEROP=1)", what, why)
	}
	t.Skipf("%s skipped: %s; set MCP_OUTBOX_REQUIRE_INTEROP=1 to make this a failure", what, why)
}

// SkipShortInterop skips the test in -short mode, unless interop is
// required.
func SkipShortInterop(t *testing.T, what string) {
	t.Helper()
	if testing.Short() && !InteropRequired() {
		t.Skipf("%s skipped in -short mode", what)
	}
}

// PollUntil calls done until it reports true, and fails the test if that
// takes longer than timeout.
func PollUntil(t *testing.T, timeout time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", timeout, what)
		}
		<-tick.C
	}
}

// OpenLedgerDB opens the SQLite file a server under test writes, from the
// test process, to check what is on disk. The file must exist: opening
// would create it.
//
// A postgres:// URL opens that database instead.
func OpenLedgerDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	driver, dsn := "sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?_pragma=busy_timeout(5000)"
	if schema.IsPostgresURL(path) {
		driver, dsn = "pgx", path
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// ReplicaDB creates a PostgreSQL database for the test and returns its URL
// and a handle for the assertions.
func ReplicaDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL and servers")
	}
	url := pgtest.Database(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return url, db
}

// CountRows runs a query returning one count.
func CountRows(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// WantTools checks that tools/list names the ledger's tools and the status
// tool.
func WantTools(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	for _, want := range []string{"charge", "refund", "balance", outbox.StatusToolName} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list = %v, missing %s", names, want)
		}
	}
}

// PostInitialize sends a raw initialize request with the given
// Authorization header ("" for none) and returns the status.
func PostInitialize(t *testing.T, url, authorization string) int {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"v0"}}}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := HTTPClient(t, "").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// WantError checks an error answer: its status and a message containing want.
func WantError(t *testing.T, what string, status int, m map[string]any, wantStatus int, want string) {
	t.Helper()
	msg, _ := m["error"].(string)
	if status != wantStatus || !strings.Contains(msg, want) {
		t.Errorf("%s: %d %v; want %d with an error containing %q", what, status, m, wantStatus, want)
	}
}

// SHA256Hex is the hex SHA-256 of s, as --admin-token-sha256 takes it.
func SHA256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// PaymentsDest is the --dest value naming fake as destination "payments".
func PaymentsDest(fake *downstream.Server, settings ...string) string {
	return "payments=" + strings.Join(append([]string{fake.URL()}, settings...), ";")
}

// RequestsFor returns the fake's POST requests (not probes) carrying key.
func RequestsFor(fake *downstream.Server, key string) []downstream.Request {
	var out []downstream.Request
	for _, r := range fake.Requests() {
		if r.Key == key && r.Outcome != downstream.Probed {
			out = append(out, r)
		}
	}
	return out
}
