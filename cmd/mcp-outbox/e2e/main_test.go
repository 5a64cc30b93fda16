// Package e2e holds mcp-outbox's end-to-end tests: each starts the binary
// as real processes (serve, proxy, the interop clients and upstreams,
// PostgreSQL) and checks what a user of the command sees. They live apart
// from cmd/mcp-outbox's in-process tests so that go test runs the two
// packages side by side, and so that `make test/short` can leave them out.
// The harness, shared with cmd/mcp-outbox, is internal/e2e.
package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/e2e"
)

// Binaries built once for the tests: bin is a normal build, failpointBin
// is built with -tags failpoints.
var bin, failpointBin string

func TestMain(m *testing.M) {
	var cleanup func()
	var err error
	bin, failpointBin, cleanup, err = e2e.Binaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// The harness under the names these tests were written with.
type syncBuffer = e2e.SyncBuffer

// testWriter sends a subprocess's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { return e2e.TestWriter{T: w.t}.Write(p) }

const statefulVersion = e2e.StatefulVersion

var (
	serveStdio         = e2e.ServeStdio
	serveStdioTo       = e2e.ServeStdioTo
	startHTTP          = e2e.StartHTTP
	startHTTPCommand   = e2e.StartHTTPCommand
	skipInterop        = e2e.SkipInterop
	skipShortInterop   = e2e.SkipShortInterop
	pollUntil          = e2e.PollUntil
	openLedgerDB       = e2e.OpenLedgerDB
	replicaDB          = e2e.ReplicaDB
	countRows          = e2e.CountRows
	chargeCall         = e2e.ChargeCall
	callMetaOf         = e2e.CallMetaOf
	resultText         = e2e.ResultText
	structuredChargeID = e2e.StructuredChargeID
	mustSucceed        = e2e.MustSucceed
	wantReplay         = e2e.WantReplay
	callStatus         = e2e.CallStatus
	httpClient         = e2e.HTTPClient
	bearerClient       = e2e.BearerClient
	connectHTTP        = e2e.ConnectHTTP
	wantTools          = e2e.WantTools
	postInitialize     = e2e.PostInitialize
	sha256Hex          = e2e.SHA256Hex
	paymentsDest       = e2e.PaymentsDest
	requestsFor        = e2e.RequestsFor
)

// cliResult is how a command line ended.
type cliResult struct {
	code           int
	stdout, stderr string
}

// runCLI runs the binary with an environment of vars alone (and PATH).
// cmd/mcp-outbox's tests run the same command lines in-process.
func runCLI(t *testing.T, vars map[string]string, args ...string) cliResult {
	t.Helper()
	r := e2e.RunCLI(t, bin, vars, args...)
	return cliResult{r.Code, r.Stdout, r.Stderr}
}

// newTokenFor runs `token new principal` and returns the token and the
// tokens-file line it printed.
func newTokenFor(t *testing.T, principal string) (token, line string) {
	t.Helper()
	r := runCLI(t, nil, "token", "new", principal)
	if r.code != 0 {
		t.Fatalf("token new %s: exit %d, %s", principal, r.code, r.stderr)
	}
	return strings.TrimSpace(r.stdout), r.stderr
}
