package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestServeSIGTERMDuringCall stops `serve --http` with SIGTERM while a
// charge runs (--demo-delay, in the handler's transaction). With a
// --shutdown-timeout longer than the call, the client gets its answer and
// serve exits 0. With a shorter one, serve hands the call over: it says so,
// exits 0 (not "context deadline exceeded", exit 1), nothing of the call is
// committed, and a retry after a restart runs it exactly once.
func TestServeSIGTERMDuringCall(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"sqlite", "postgres"} {
		for _, tc := range []struct {
			name       string
			delay      string // of the charge
			bound      string // --shutdown-timeout
			handedOver bool
		}{
			{"bound longer than the call", "3s", "60s", false},
			{"bound shorter than the call", "2m", "1s", true},
		} {
			t.Run(store+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				testSIGTERMDuringCall(t, store, tc.delay, tc.bound, tc.handedOver)
			})
		}
	}
}

func testSIGTERMDuringCall(t *testing.T, store, delay, bound string, handedOver bool) {
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	var env []string
	if store == "postgres" {
		if testing.Short() {
			t.Skip("starts PostgreSQL")
		}
		dbPath = pgtest.Database(t)
		env = []string{"MCP_OUTBOX_LEASE=1s"}
	}
	cmd := exec.Command(bin, "serve", "--db", dbPath, "--http", "127.0.0.1:0", "--log-level", "warn",
		"--demo-delay", delay, "--shutdown-timeout", bound)
	cmd.Env = append(os.Environ(), env...)
	lines := startLines(t, cmd)
	u := strings.TrimSpace(strings.SplitN(waitLine(t, lines, "serving MCP at "), "serving MCP at ", 2)[1])
	// A stateful session: its client holds the standalone GET stream open,
	// which the shutdown must not wait for. With the go-sdk's default
	// retries, as a client has: the stream ends at shutdown right after
	// the call's answer was written, and a client that may not reconnect
	// (connectHTTP's MaxRetries -1) fails the session at once, at times
	// before it has read the answer already in its socket.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "sigterm-test", Version: "v0"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: u}, &mcp.ClientSessionOptions{ProtocolVersion: statefulVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })

	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	answers := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, chargeCall("sigterm", 700))
		answers <- answer{res, err}
	}()
	db := openLedgerDB(t, dbPath)
	waitChargeRunning(t, db, store)
	signalled := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if handedOver {
		waitLine(t, lines, "were handed over")
	}
	var a answer
	select {
	case a = <-answers:
	case <-time.After(2 * time.Minute):
		t.Fatal("the call got no answer and no error")
	}
	waitProcess(t, cmd, time.Minute)
	took := time.Since(signalled)
	wantExitedZero(t, cmd)
	t.Logf("exited %s after SIGTERM", took.Round(time.Millisecond))
	if store == "postgres" {
		awaitServerSessionsGone(t, db)
	}

	if !handedOver {
		if a.err != nil || a.res.IsError {
			t.Fatalf("call during the shutdown: %v %v, want its answer", a.err, a.res)
		}
		if got, want := structuredChargeID(t, a.res), onlyChargeID(t, db); got != want {
			t.Errorf("answered charge_id %d, the ledger holds %d", got, want)
		}
		if c := onlyCall(t, db); c.state != "completed" {
			t.Errorf("call %+v, want completed", c)
		}
		return
	}
	if a.err == nil {
		t.Errorf("call handed over at shutdown answered %v, want the connection closed without an answer", a.res)
	}
	if took > 30*time.Second {
		t.Errorf("exited %s after SIGTERM, want soon after the %s bound", took, bound)
	}
	if n := countRows(t, db, `SELECT count(*) FROM charges`) + countRows(t, db, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("%d charges and effects committed by a call handed over at shutdown, want none", n)
	}
	// What mcphttp.ServeWith says of the claim: on SQLite it stays, for a
	// retry to take over; on PostgreSQL a first attempt's rolled back.
	if store == "sqlite" {
		if c := onlyCall(t, db); c.state != "in_flight" {
			t.Errorf("call handed over: %+v, want its in_flight claim", c)
		}
	} else if n := countRows(t, db, `SELECT count(*) FROM calls`); n != 0 {
		t.Errorf("%d calls after a first attempt was handed over on PostgreSQL, want none", n)
	}

	u2, _ := startHTTP(t, bin, dbPath, env)
	cs2 := connectHTTP(t, u2, statefulVersion, httpClient(t, ""))
	retry := mustSucceed(t, cs2, chargeCall("sigterm", 700))
	wantReplay(t, retry, false, "meta")
	if got, want := structuredChargeID(t, retry), onlyChargeID(t, db); got != want {
		t.Errorf("retry answered charge_id %d, the ledger holds %d", got, want)
	}
	if n := countRows(t, db, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects has %d rows, want 1", n)
	}
	if c := onlyCall(t, db); c.state != "completed" {
		t.Errorf("call %+v after the retry, want completed", c)
	}
}

// waitChargeRunning waits until the charge is inside its handler's
// transaction: on SQLite its claim is committed (in_flight); on PostgreSQL
// a fresh key's claim rides uncommitted in the call's transaction, so the
// server's session idles in a transaction during the delay.
func waitChargeRunning(t *testing.T, db *sql.DB, store string) {
	t.Helper()
	q := `SELECT count(*) FROM calls WHERE state = 'in_flight'`
	if store == "postgres" {
		q = `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'mcp-outbox' AND state = 'idle in transaction'`
	}
	pollUntil(t, 30*time.Second, "the charge to run", func() bool { return countRows(t, db, q) > 0 })
}

// waitProcess waits for cmd to end by itself.
func waitProcess(t *testing.T, cmd *exec.Cmd, timeout time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("the server did not exit within %s", timeout)
	}
}

// TestServeSQLiteServesOnceListening: with an SQLite file, serve opens (and
// migrates) the database before it listens, so the first request of a
// client that connects as soon as the port accepts is served, not refused
// with 503 "starting": that window is for a store that can be down.
func TestServeSQLiteServesOnceListening(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "serve", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--http", addr, "--log-level", "warn")
	startLines(t, cmd)

	// Connect at the first moment the port accepts: dial in a tight loop.
	var conn net.Conn
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if conn, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not listen on %s within 30s: %v", addr, err)
		}
		<-tick.C
	}
	defer conn.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + statefulVersion +
		`","capabilities":{},"clientInfo":{"name":"first","version":"0"}}}`
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %s, want 200 (served as soon as serve listens)", resp.Status)
	}
}

// TestServeSIGTERMDuringTaskIsBounded: a task outlives the HTTP request
// that created it, so the HTTP bound does not cover it; the layer's Stop
// waits for it. That wait is bounded by the same --shutdown-timeout: the
// task still running then stops, rolls back and stays in flight for the
// next start, and serve exits 0, saying first what it waits for. Before,
// Stop waited for the task as long as it ran (here two minutes).
func TestServeSIGTERMDuringTaskIsBounded(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	cmd := exec.Command(bin, "serve", "--db", dbPath, "--http", "127.0.0.1:0", "--log-level", "info",
		"--task", "charge=always", "--demo-delay", "2m", "--shutdown-timeout", "1s")
	lines := startLines(t, cmd)
	u := strings.TrimSpace(strings.SplitN(waitLine(t, lines, "serving MCP at "), "serving MCP at ", 2)[1])
	p := &crashTaskPeer{t: t, url: u}
	created, err := p.do("tools/call", map[string]any{"name": "charge", "arguments": map[string]any{"amount": 900},
		"_meta": map[string]any{"idempotencyKey": "sigterm-task"}}, true)
	if err != nil || created["resultType"] != "task" {
		t.Fatalf("CreateTaskResult = %v, %v", created, err)
	}
	db := openLedgerDB(t, dbPath)
	waitChargeRunning(t, db, "sqlite")
	signalled := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLine(t, lines, "stop: waiting for the tasks in flight to finish")
	waitProcess(t, cmd, time.Minute)
	if took := time.Since(signalled); took > 30*time.Second {
		t.Errorf("exited %s after SIGTERM, want soon after the 1s bound", took)
	}
	wantExitedZero(t, cmd)
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE task_id IS NOT NULL AND state = 'in_flight'`); n != 1 {
		t.Errorf("the stopped task: %d rows in flight, want 1, for the next start", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 0 {
		t.Errorf("charges = %d, want 0: the stopped task rolled back", n)
	}
}
