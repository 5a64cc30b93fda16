package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// Helpers shared by crash_test.go, http_test.go and cli_test.go.

// awaitServerSessionsGone waits until no server session is left on the
// test's PostgreSQL database. A SIGKILLed server's COMMIT may already be in
// PostgreSQL's hands, and the backend finishes it after the process is
// gone; a check that reads the tables in several statements meanwhile sees
// the commit land between them (the effect without its charge). A backend
// whose client died exits once its statement is done, so no session left
// means the dead server's work has settled, one way or the other.
func awaitServerSessionsGone(t *testing.T, db *sql.DB) {
	t.Helper()
	pollUntil(t, 30*time.Second, "the killed server's PostgreSQL sessions to end", func() bool {
		return countRows(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'mcp-outbox'`) == 0
	})
}

// callRecord is a row of table calls, as the tests check it.
type callRecord struct {
	uid, keySource, state, owner string
	attempts                     int
	leaseUntil                   int64
}

// onlyCall returns the single row of table calls, failing when there is not
// exactly one.
func onlyCall(t *testing.T, db *sql.DB) callRecord {
	t.Helper()
	if n := countRows(t, db, `SELECT count(*) FROM calls`); n != 1 {
		t.Fatalf("calls has %d rows, want 1", n)
	}
	var c callRecord
	err := db.QueryRow(`SELECT uid, key_source, state, owner, attempts, lease_until FROM calls`).
		Scan(&c.uid, &c.keySource, &c.state, &c.owner, &c.attempts, &c.leaseUntil)
	if err != nil {
		t.Fatalf("read call: %v", err)
	}
	return c
}

// onlyChargeID returns the id of the single row of table charges.
func onlyChargeID(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 1 {
		t.Fatalf("charges has %d rows, want 1", n)
	}
	var id int64
	if err := db.QueryRow(`SELECT id FROM charges`).Scan(&id); err != nil {
		t.Fatalf("read charge: %v", err)
	}
	return id
}

// wantKilled checks that a server process ended by SIGKILL. The session
// must be closed first: closing waits for the process.
func wantKilled(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	ps := cmd.ProcessState
	if ps == nil {
		t.Fatal("server process was not waited for")
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("server process ended with %v, want killed by SIGKILL", ps)
	}
}

// crashTransport starts a server of binary on dbPath, with env added, and
// connects a client to it; over stdio or Streamable HTTP.
type crashTransport struct {
	name  string
	start func(t *testing.T, binary, dbPath string, env []string) (*mcp.ClientSession, *exec.Cmd)
	// reap waits for the server process after the client is closed.
	reap func(cmd *exec.Cmd)
}

var crashTransports = []crashTransport{
	{
		name: "stdio",
		start: func(t *testing.T, binary, dbPath string, env []string) (*mcp.ClientSession, *exec.Cmd) {
			return serveStdio(t, binary, dbPath, env)
		},
		reap: func(*exec.Cmd) {}, // closing the session waited for it
	},
	{
		// Stateless 2026-07-28, the go-sdk client's default.
		name: "http",
		start: func(t *testing.T, binary, dbPath string, env []string) (*mcp.ClientSession, *exec.Cmd) {
			url, cmd := startHTTP(t, binary, dbPath, env)
			return connectHTTP(t, url, "", httpClient(t, "")), cmd
		},
		reap: func(cmd *exec.Cmd) { _ = cmd.Wait() },
	},
}

// TestCrashAtFailpoints kills the server with SIGKILL at each point of a
// call's path, restarts it on the same database and retries: the charge
// must exist exactly once, whether the retry replays (the outcome was
// committed) or runs (nothing of the call was). Over stdio and over
// Streamable HTTP, with a key and without one.
//
// And on both stores: on PostgreSQL the server may run on another machine
// than its successor, so a dead attempt's claim is taken over when its
// lease passes (1 s here), not at once.
func TestCrashAtFailpoints(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"sqlite", "postgres"} {
		for _, tr := range crashTransports {
			for _, fp := range []string{failpoint.CallAfterClaim, failpoint.CallBeforeCommit, failpoint.CallAfterCommit} {
				for _, keyed := range []bool{true, false} {
					name, key, source := fp+"/meta_key", "crash-"+fp, "meta"
					if !keyed {
						name, key, source = fp+"/no_key", "", "fingerprint"
					}
					t.Run(store+"/"+tr.name+"/"+name, func(t *testing.T) {
						t.Parallel()
						testCrashAtFailpoint(t, tr, store, fp, key, source)
					})
				}
			}
		}
	}
}

func testCrashAtFailpoint(t *testing.T, tr crashTransport, store, fp, key, source string) {
	committed := fp == failpoint.CallAfterCommit
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	var env []string
	if store == "postgres" {
		if testing.Short() {
			t.Skip("starts PostgreSQL")
		}
		dbPath = pgtest.Database(t)
		env = []string{"MCP_OUTBOX_LEASE=1s"}
	}
	call := func() *mcp.CallToolParams { return chargeCall(key, 1250) }

	cs, cmd := tr.start(t, failpointBin, dbPath, append(env, failpoint.EnvVar+"="+fp+"=crash"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, call())
	if err == nil {
		t.Fatalf("call survived failpoint %s=crash: %v %s", fp, res.Meta, resultText(res))
	}
	// The SDK reports the server's end of a pipe as EOF; over HTTP the
	// request fails.
	if tr.name == "stdio" && !errors.Is(err, io.EOF) && !errors.Is(err, mcp.ErrConnectionClosed) {
		t.Errorf("call error = %v, want the connection closed", err)
	}
	cs.Close()
	tr.reap(cmd)
	wantKilled(t, cmd)

	db := openLedgerDB(t, dbPath)
	var crashed callRecord
	switch {
	case committed:
		if crashed = onlyCall(t, db); crashed.state != "completed" || onlyChargeID(t, db) == 0 {
			t.Fatalf("after a crash after the commit: call %+v, want completed with its charge", crashed)
		}
	case store == "postgres":
		// The claim of a fresh key rides uncommitted in the call's
		// transaction (outbox/claim_tx_postgres.go): the kill rolled it
		// back with everything else, and the key is free at once.
		if n := countRows(t, db, `SELECT count(*) FROM calls`) + countRows(t, db, `SELECT count(*) FROM charges`) +
			countRows(t, db, `SELECT count(*) FROM effects`); n != 0 {
			t.Fatalf("%d calls, charges and effects in the database after a crash before the commit, want none", n)
		}
	default:
		if crashed = onlyCall(t, db); crashed.state != "in_flight" || crashed.owner == "" {
			t.Fatalf("after a crash before the commit: call %+v, want the dead attempt's in_flight claim", crashed)
		}
		if n := countRows(t, db, `SELECT count(*) FROM charges`) + countRows(t, db, `SELECT count(*) FROM effects`); n != 0 {
			t.Fatalf("%d charges and effects on disk from an attempt that never committed", n)
		}
	}

	cs2, _ := tr.start(t, bin, dbPath, env)
	retry := mustSucceed(t, cs2, call())
	m := wantReplay(t, retry, committed, source)

	chargeID := onlyChargeID(t, db)
	if got := structuredChargeID(t, retry); got != chargeID {
		t.Errorf("retry answered charge_id %d, the ledger holds %d", got, chargeID)
	}
	if n := countRows(t, db, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects has %d rows, want 1", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM effects e JOIN calls c ON e.call_id = c.id`); n != 1 {
		t.Errorf("%d effects belong to the recorded call, want 1", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'in_flight'`); n != 0 {
		t.Errorf("%d calls left in_flight", n)
	}
	final := onlyCall(t, db)
	if final.state != "completed" || final.owner != "" || m["callId"] != final.uid {
		t.Errorf("recorded call %+v, result meta %v: want completed, no owner, same callId", final, m)
	}
	// A retry of an uncommitted call takes the dead attempt's row over (the
	// call keeps its uid, so its effect keys stay stable) rather than
	// starting a new one.
	wantAttempts := 2
	if committed {
		wantAttempts = 1
	}
	if crashed.uid == "" {
		// PostgreSQL: no row survived the crash, so the retry's claim is
		// a call of its own (its effect keys are new too: none was sent).
		wantAttempts, crashed.uid = 1, final.uid
	}
	if final.attempts != wantAttempts || final.uid != crashed.uid {
		t.Errorf("call attempts %d uid %s, want %d attempts on the crashed call's uid %s",
			final.attempts, final.uid, wantAttempts, crashed.uid)
	}
}

// TestFailpointErrorBeforeCommit makes the commit fail: the client gets a
// tool error, nothing of the call is on disk, and a retry runs it.
func TestFailpointErrorBeforeCommit(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	call := func() *mcp.CallToolParams { return chargeCall("fail-before-commit", 700) }

	cs, _ := serveStdio(t, failpointBin, dbPath, []string{failpoint.EnvVar + "=" + failpoint.CallBeforeCommit + "=error"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, call())
	if err != nil {
		t.Fatalf("call: protocol error %v, want a tool error", err)
	}
	if !res.IsError {
		t.Fatalf("call succeeded although its commit failed: %s", resultText(res))
	}
	if !strings.Contains(resultText(res), "failpoint "+failpoint.CallBeforeCommit) {
		t.Errorf("tool error %q does not say what failed", resultText(res))
	}
	if m := callMetaOf(res); m != nil {
		t.Errorf("failed commit still reports a recorded call: %v", m)
	}
	db := openLedgerDB(t, dbPath)
	for _, table := range []string{"charges", "calls", "effects"} {
		if n := countRows(t, db, `SELECT count(*) FROM `+table); n != 0 {
			t.Errorf("%s has %d rows after a failed commit, want 0", table, n)
		}
	}
	cs.Close()

	cs2, _ := serveStdio(t, bin, dbPath, nil)
	retry := mustSucceed(t, cs2, call())
	wantReplay(t, retry, false, "meta")
	if got, want := structuredChargeID(t, retry), onlyChargeID(t, db); got != want {
		t.Errorf("retry answered charge_id %d, the ledger holds %d", got, want)
	}
}

// TestFailpointErrorAfterCommit loses the response of a committed call in
// a process that keeps running: a retry on the same connection replays.
func TestFailpointErrorAfterCommit(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	call := func() *mcp.CallToolParams { return chargeCall("fail-after-commit", 900) }

	cs, _ := serveStdio(t, failpointBin, dbPath, []string{failpoint.EnvVar + "=" + failpoint.CallAfterCommit + "=error"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, call())
	if err != nil || !res.IsError {
		t.Fatalf("call = %v, %v; want a tool error", res, err)
	}
	db := openLedgerDB(t, dbPath)
	chargeID := onlyChargeID(t, db)
	retry := mustSucceed(t, cs, call())
	wantReplay(t, retry, true, "meta")
	if got := structuredChargeID(t, retry); got != chargeID {
		t.Errorf("replay answered charge_id %d, the ledger holds %d", got, chargeID)
	}
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges has %d rows, want 1", n)
	}
}

// TestLeaseHandoffAcrossProcesses: process A claims a call and stalls
// without holding any lock; after A's lease passes, process B gets the same
// call, takes it over and commits; when A wakes, the fence (the owner
// check of its commit) must stop it from committing a second charge.
func TestLeaseHandoffAcrossProcesses(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	// A's stall must outlast its lease plus B's whole call; B's process is
	// started before A's call, so B's part takes milliseconds.
	const stall = 4 * time.Second
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	call := func() *mcp.CallToolParams { return chargeCall("handoff-1", 4200) }

	csA, _ := serveStdio(t, failpointBin, dbPath,
		[]string{fmt.Sprintf("%s=%s=sleep(%s)", failpoint.EnvVar, failpoint.CallAfterClaim, stall)},
		"--lease", lease.String())
	csB, _ := serveStdio(t, bin, dbPath, nil)
	db := openLedgerDB(t, dbPath)

	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	fromA := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := csA.CallTool(ctx, call())
		fromA <- outcome{res, err}
	}()

	// Wait until A's claim is on disk and its lease has passed.
	var claimA callRecord
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM calls`).Scan(&n); err != nil {
			t.Fatalf("poll calls: %v", err)
		}
		if n == 1 {
			claimA = onlyCall(t, db)
			if claimA.state != "in_flight" {
				t.Fatalf("A's call is %s before its stall ended", claimA.state)
			}
			if claimA.leaseUntil < time.Now().UnixMilli() {
				break
			}
		}
		select {
		case o := <-fromA:
			t.Fatalf("A answered during its stall: %v %v", o.res, o.err)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatal("A's claim did not appear with a passed lease within 10s")
		}
	}

	resB := mustSucceed(t, csB, call())
	mB := wantReplay(t, resB, false, "meta")
	select {
	case o := <-fromA:
		t.Fatalf("A answered before B's takeover was checked (stall too short?): %v %v", o.res, o.err)
	default:
	}
	afterB := onlyCall(t, db)
	if afterB.state != "completed" || afterB.uid != claimA.uid || afterB.attempts != 2 || mB["callId"] != claimA.uid {
		t.Fatalf("after B's takeover: call %+v, B's meta %v; want completed on A's call (uid %s) in 2 attempts", afterB, mB, claimA.uid)
	}
	chargeID := onlyChargeID(t, db)
	if got := structuredChargeID(t, resB); got != chargeID {
		t.Errorf("B answered charge_id %d, the ledger holds %d", got, chargeID)
	}

	var a outcome
	select {
	case a = <-fromA:
	case <-time.After(stall + 20*time.Second):
		t.Fatal("A never answered")
	}
	if a.err != nil {
		t.Fatalf("A: protocol error %v, want a tool error", a.err)
	}
	if !a.res.IsError {
		t.Fatalf("A committed after losing its claim: %v %s", a.res.Meta, resultText(a.res))
	}
	if !strings.Contains(resultText(a.res), "taken over") {
		t.Errorf("A's error %q does not say the call was taken over", resultText(a.res))
	}
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges has %d rows after A woke, want 1", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects has %d rows after A woke, want 1", n)
	}
	final := onlyCall(t, db)
	if final.state != "completed" || final.owner != "" || final.uid != claimA.uid {
		t.Errorf("call after A woke: %+v, want B's completed record", final)
	}
	// Whoever retries now gets B's outcome.
	again := mustSucceed(t, csB, call())
	wantReplay(t, again, true, "meta")
	if got := structuredChargeID(t, again); got != chargeID {
		t.Errorf("replay answered charge_id %d, want %d", got, chargeID)
	}

	t.Run("loser's error points at the recorded outcome", func(t *testing.T) {
		text := resultText(a.res)
		code, _ := a.res.Meta[outbox.MetaKeyError].(string)
		if code != "in_progress" || strings.Contains(text, "a retry runs it again") {
			t.Errorf("the loser's answer is code %q %q; the call is recorded by its new owner and a retry "+
				"replays it, so it should be the in_progress error naming the status tool", code, text)
		}
	})
}
