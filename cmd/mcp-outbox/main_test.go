package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// Binaries built once for the tests that need a real process: bin is a
// normal build, failpointBin is built with -tags failpoints.
var bin, failpointBin string

func TestMain(m *testing.M) {
	// Without tests to run (-run '^$', as make fuzz says) or in a fuzz
	// worker process, only fuzz targets run, and none of them starts the
	// binary: building it would spend their fuzzing time (make fuzz/short
	// gives each 5 s).
	flag.Parse()
	if flagValue("test.run") == "^$" || flagValue("test.fuzzworker") == "true" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "mcp-outbox-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
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
		cmd := exec.Command("go", append(args, ".")...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build test binary:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	pgtest.StopShared()
	os.RemoveAll(dir)
	os.Exit(code)
}

func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// serveStdio starts `binary serve --db dbPath args...` as a real subprocess
// speaking MCP on stdio, with env added to the environment, and returns a
// connected client session and the process. The session is closed and the
// process reaped at cleanup.
func serveStdio(t *testing.T, binary, dbPath string, env []string, args ...string) (*mcp.ClientSession, *exec.Cmd) {
	t.Helper()
	return serveStdioTo(t, testWriter{t}, binary, dbPath, env, args...)
}

// serveStdioTo is serveStdio with the server's stderr going to stderr.
func serveStdioTo(t *testing.T, stderr io.Writer, binary, dbPath string, env []string, args ...string) (*mcp.ClientSession, *exec.Cmd) {
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

// startHTTP starts `bin serve --http 127.0.0.1:0` and returns the /mcp URL,
// read from the address the server prints on stderr.
func startHTTP(t *testing.T, binary, dbPath string, env []string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"serve", "--db", dbPath, "--http", "127.0.0.1:0", "--log-level", "warn"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return startHTTPCommand(t, cmd), cmd
}

// startHTTPCommand starts a command that serves MCP over HTTP (serve or
// proxy with --http) and returns the /mcp URL it prints on stderr. The
// process is killed at cleanup.
func startHTTPCommand(t *testing.T, cmd *exec.Cmd) string {
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

// testWriter sends a subprocess's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var _ io.Writer = testWriter{}

// The interop tests need programs and packages from outside Go (node and
// the npm packages of testdata/, the Python environments of `make py`).
// Without them a test is skipped, unless MCP_OUTBOX_REQUIRE_INTEROP=1 (make
// test, CI) makes that a failure: there, a skipped interop test would be a
// promise left untested.
func interopRequired() bool { return os.Getenv("MCP_OUTBOX_REQUIRE_INTEROP") == "1" }

// skipInterop skips the test, or fails it when interop is required,
// because what cannot run for why.
func skipInterop(t *testing.T, what, why string) {
	t.Helper()
	if interopRequired() {
		t.Fatalf("%s: %s (MCP_OUTBOX_REQUIRE_INTEROP=1)", what, why)
	}
	t.Skipf("%s skipped: %s; set MCP_OUTBOX_REQUIRE_INTEROP=1 to make this a failure", what, why)
}

// skipShortInterop skips the test in -short mode, unless interop is
// required.
func skipShortInterop(t *testing.T, what string) {
	t.Helper()
	if testing.Short() && !interopRequired() {
		t.Skipf("%s skipped in -short mode", what)
	}
}
