package e2e

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The cooperating-upstream contract on PostgreSQL (schema/README.md, "On
// PostgreSQL"): the real proxy on a throwaway database, in front of the
// real Python upstream (testdata/py-upstream/server.py on
// mcp_outbox_upstream.py, whose psycopg 3 side these tests are). psycopg is
// installed in one virtual environment, "newest" (mcp 2.3.0); without it,
// or without PostgreSQL, the tests skip (fail under
// MCP_OUTBOX_REQUIRE_INTEROP=1 and MCP_OUTBOX_REQUIRE_POSTGRES=1).

// pgPyVenv is the virtual environment whose requirements include psycopg.
const pgPyVenv = "newest"

// pyPostgresVenv is pyUpstreamVenv for pgPyVenv, which must also hold
// psycopg.
func pyPostgresVenv(t *testing.T) (dir, python string) {
	t.Helper()
	dir, python = pyUpstreamVenv(t, pgPyVenv)
	env := filepath.Join(filepath.Dir(dir), "python", ".venv-"+pgPyVenv)
	if m, _ := filepath.Glob(filepath.Join(env, "lib", "python3*", "site-packages", "psycopg", "__init__.py")); len(m) == 0 {
		skipInterop(t, "Python upstream on PostgreSQL", "testdata/python/.venv-"+pgPyVenv+" has no psycopg: run `make py`")
	}
	return dir, python
}

// pgProxyFixture is a proxyFixture whose database is PostgreSQL: dbPath is
// the database's URL and db a pool on it.
func newPgProxyFixture(t *testing.T) *proxyFixture {
	t.Helper()
	pyPostgresVenv(t)
	url := pgtest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sdb, err := schema.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	sdb.Close()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &proxyFixture{up: pyUpstreamKindVenv(pgPyVenv), dbPath: url, db: db, fake: downstream.Start(t, nil)}
}

// pgProxyCommand is proxyFixture.proxyCommand without MCP_OUTBOX_DB in the
// environment: the upstream learns the database from the proxy.
func pgProxyCommand(t *testing.T, f *proxyFixture, upstreamEnv []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := f.proxyCommand(t, bin, upstreamEnv, args...)
	var env []string
	for _, kv := range cmd.Env {
		if !strings.HasPrefix(kv, "MCP_OUTBOX_DB=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	return cmd
}

// pgCall is what the test reads back of a calls row.
type pgCall struct {
	id                int64
	uid, state, owner string
	result            sql.NullString
	completedAt       sql.NullInt64
}

func readPgCall(t *testing.T, db *sql.DB, key string) pgCall {
	t.Helper()
	var c pgCall
	err := db.QueryRow(`SELECT id, uid, state, owner, result, completed_at FROM calls WHERE key = $1`, key).
		Scan(&c.id, &c.uid, &c.state, &c.owner, &c.result, &c.completedAt)
	if err != nil {
		t.Fatalf("read the call of key %s: %v", key, err)
	}
	return c
}

// TestProxyPostgresPyUpstream: `mcp-outbox proxy --db postgres://...` in
// front of the Python upstream on the same database.
func TestProxyPostgresPyUpstream(t *testing.T) {
	t.Parallel()
	t.Run("Cooperating", testProxyPostgresCooperating)
	t.Run("StaleOwner", testProxyPostgresStaleOwner)
	t.Run("CrashAfterCommit", testProxyPostgresCrashAfterCommit)
	t.Run("NonCooperatingUnknown", testProxyPostgresNonCooperating)
}

// testProxyPostgresCooperating: a charge is recorded once, its business
// row, its effect and its outcome written by the upstream in one
// transaction; the retry is replayed by the proxy, which delivers the
// effect once.
func testProxyPostgresCooperating(t *testing.T) {
	f := newPgProxyFixture(t)
	cs := f.connectProxy(t, pgProxyCommand(t, f, nil, "--cooperating"), nil)

	first := mustSucceed(t, cs, tsCharge("pg-1", "ada", 500))
	wantReplay(t, first, false, "meta")
	again := mustSucceed(t, cs, tsCharge("pg-1", "ada", 500))
	wantReplay(t, again, true, "meta")
	if !strings.Contains(resultText(again), resultText(first)) {
		t.Errorf("replay %q does not carry the original %q", resultText(again), resultText(first))
	}

	call := readPgCall(t, f.db, "pg-1")
	if call.state != "completed" || call.owner != "" || !call.completedAt.Valid {
		t.Fatalf("calls row = %+v, want completed by the upstream", call)
	}
	if !strings.Contains(call.result.String, resultText(first)) {
		t.Errorf("recorded result %s does not hold the answer %q", call.result.String, resultText(first))
	}
	// One transaction: the module writes the charge, the effect and the
	// outcome with the same clock reading, and each names the call.
	var charges, chargeAt, effectAt int64
	var chargeCallID string
	if err := f.db.QueryRow(`SELECT count(*), min(call_id), min(created_at) FROM charges WHERE customer = 'ada'`).
		Scan(&charges, &chargeCallID, &chargeAt); err != nil {
		t.Fatal(err)
	}
	if charges != 1 || chargeCallID != call.uid {
		t.Errorf("ada's charges = %d with call_id %s, want 1 with %s", charges, chargeCallID, call.uid)
	}
	var effectCallID int64
	var effectKey string
	if err := f.db.QueryRow(`SELECT call_id, idempotency_key, created_at FROM effects`).Scan(&effectCallID, &effectKey, &effectAt); err != nil {
		t.Fatal(err)
	}
	if effectCallID != call.id || effectKey != call.uid+"-1" {
		t.Errorf("effect of call %d key %s, want call %d key %s-1", effectCallID, effectKey, call.id, call.uid)
	}
	if chargeAt != call.completedAt.Int64 || effectAt != call.completedAt.Int64 {
		t.Errorf("charge at %d, effect at %d, outcome at %d: want one transaction's time", chargeAt, effectAt, call.completedAt.Int64)
	}
	// The proxy's dispatcher delivers the effect the upstream committed.
	effects := waitEffects(t, f.db, 1, 30*time.Second, "delivered")
	if n := len(requestsFor(f.fake, effects[0].key)); n != 1 {
		t.Errorf("the effect reached the downstream %d times, want once", n)
	}
	if st := callStatus(t, cs, "pg-1"); st["state"] != "completed" {
		t.Errorf("call_status pg-1 = %v, want completed", st)
	}
	// A tool error is recorded too, and replayed.
	failed, err := callTool(t, cs, tsCharge("pg-2", "bob", 0))
	if err != nil || !failed.IsError {
		t.Fatalf("charge of 0: %v %v, want a tool error", failed, err)
	}
	if c := readPgCall(t, f.db, "pg-2"); c.state != "failed" {
		t.Errorf("calls row of a tool error = %+v, want failed", c)
	}
	// Unrecorded tools pass through and read the same database.
	bal := mustSucceed(t, cs, &mcp.CallToolParams{Name: "get_balance", Arguments: map[string]any{"customer": "ada"}})
	if !strings.Contains(resultText(bal), "500") {
		t.Errorf("get_balance = %q, want ada's 500", resultText(bal))
	}
}

// testProxyPostgresStaleOwner: while the upstream works on a call, another
// attempt takes it over (as a second proxy would after this one's lease
// passed). The upstream's fence refuses the owner it was handed: nothing
// of the call is written, and the proxy says the call is not its to
// answer.
func testProxyPostgresStaleOwner(t *testing.T) {
	f := newPgProxyFixture(t)
	// The delay is the window in which the test takes the call over: it
	// polls for the claim, which the proxy writes before it forwards.
	cs := f.connectProxy(t, pgProxyCommand(t, f, []string{"UPSTREAM_CHARGE_DELAY_MS=3000"}, "--cooperating"), nil)

	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, tsCharge("stale-1", "ada", 300))
		done <- answer{res, err}
	}()

	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := f.db.Exec(`UPDATE calls SET owner = 'another-proxy#1', lease_until = $1
		                       WHERE key = 'stale-1' AND state = 'in_flight'`, time.Now().Add(time.Minute).UnixMilli())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not claim the call")
		}
		select {
		case a := <-done:
			t.Fatalf("answered before the takeover: %v %v", a.res, a.err)
		case <-time.After(10 * time.Millisecond):
		}
	}

	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if !a.res.IsError {
		t.Fatalf("a call taken over while the upstream worked was answered %q, want an error", resultText(a.res))
	}
	t.Logf("answer: %s (meta %v)", resultText(a.res), a.res.Meta)
	if c := readPgCall(t, f.db, "stale-1"); c.state != "in_flight" || c.owner != "another-proxy#1" || c.result.Valid {
		t.Errorf("calls row = %+v, want still the other attempt's, without an outcome", c)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 0 {
		t.Errorf("charges = %d, want none: the fence refused the stale owner", n)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("effects = %d, want none", n)
	}
}

// testProxyPostgresCrashAfterCommit: the upstream commits, then dies before
// answering: the proxy answers with the outcome the upstream committed,
// and the retry replays it.
func testProxyPostgresCrashAfterCommit(t *testing.T) {
	f := newPgProxyFixture(t)
	marker := filepath.Join(t.TempDir(), "crash-once")
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cs := f.connectProxy(t, pgProxyCommand(t, f, []string{"UPSTREAM_CRASH_ONCE_FILE=" + marker}, "--cooperating"), nil)

	res := mustSucceed(t, cs, tsCharge("crash-1", "ada", 300))
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the upstream did not crash (marker still there: %v)", err)
	}
	if m := callMetaOf(res); m == nil || m["state"] != "completed" || m["replayed"] != false {
		t.Errorf("answer after the upstream's crash: meta %v, want the completed outcome, not a replay", res.Meta)
	}
	wantReplay(t, mustSucceed(t, cs, tsCharge("crash-1", "ada", 300)), true, "meta")
	if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges = %d, want 1", n)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM effects e JOIN calls c ON c.id = e.call_id AND c.key = 'crash-1'`); n != 1 {
		t.Errorf("effects of the call = %d, want 1", n)
	}
	waitEffects(t, f.db, 1, 30*time.Second, "delivered")
}

// testProxyPostgresNonCooperating: an upstream that ignores claims. The
// proxy records its answers; one lost with the upstream's death makes the
// call unknown, which is never run again.
func testProxyPostgresNonCooperating(t *testing.T) {
	f := newPgProxyFixture(t)
	marker := filepath.Join(t.TempDir(), "crash-once")
	cs := f.connectProxy(t, pgProxyCommand(t, f, []string{"UPSTREAM_COOPERATE=0", "UPSTREAM_CRASH_ONCE_FILE=" + marker}), nil)

	mustSucceed(t, cs, tsCharge("nc-1", "ada", 100))
	wantReplay(t, mustSucceed(t, cs, tsCharge("nc-1", "ada", 100)), true, "meta")
	if c := readPgCall(t, f.db, "nc-1"); c.state != "completed" {
		t.Errorf("calls row of nc-1 = %+v, want completed by the proxy's record", c)
	}

	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := callTool(t, cs, tsCharge("nc-2", "bob", 200))
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || errorCodeOf(res) != "outcome_unknown" {
		t.Fatalf("answer lost by a non-cooperating upstream: %s (meta %v), want an outcome_unknown error", resultText(res), res.Meta)
	}
	retry, err := callTool(t, cs, tsCharge("nc-2", "bob", 200))
	if err != nil {
		t.Fatal(err)
	}
	if !retry.IsError || errorCodeOf(retry) != "outcome_unknown" {
		t.Errorf("retry of an unknown call: %s (meta %v), want an outcome_unknown error", resultText(retry), retry.Meta)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM charges WHERE customer = 'bob'`); n != 1 {
		t.Errorf("bob's charges = %d, want 1: the unknown call must not run again", n)
	}
	if st := callStatus(t, cs, "nc-2"); st["state"] != "unknown" {
		t.Errorf("call_status nc-2 = %v, want unknown", st)
	}

	// The operator's side (resolve-call) is tested in the outbox package.
}

// TestUpstreamContractPyModulePostgres runs the unit tests of the Python
// contract module (testdata/py-upstream/test_mcp_outbox_upstream.py) on a
// PostgreSQL database the proxy's schema created: the fence's row lock, its
// lease check, a takeover it waits for, a failed statement, the settings.
func TestUpstreamContractPyModulePostgres(t *testing.T) {
	t.Parallel()
	dir, python := pyPostgresVenv(t)
	runPyContractModule(t, dir, python, pgtest.Database(t), "PostgresTest")
}
