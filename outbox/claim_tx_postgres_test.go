package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A fresh key's claim rides uncommitted in the call's transaction
// (claim_tx_postgres.go). These tests hold what that must keep, across
// replicas on one database.

// openLeasedDB is openDB, on PostgreSQL through a driver that wraps pgx's
// (committedClaims): for tests of what a claim that is a committed row
// with a lease does (takeovers, clocks), which a fresh key's claim on
// pgx's own driver no longer is.
func openLeasedDB(tb testing.TB) *schema.DB {
	tb.Helper()
	if !onPostgres() {
		return openDB(tb)
	}
	db, err := schema.Open(context.Background(), testTarget(tb), committedClaims())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	mustLedger(tb, db)
	return db
}

// waitingAtKey reports whether some transaction waits for another's at a
// row lock or a unique index: a duplicate's claim waiting for the original.
func waitingAtKey(t *testing.T, r *replica) bool {
	t.Helper()
	return count(t, r.db.Read, `SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'`) > 0
}

// A duplicate on another replica waits at the key for the running
// original and answers with its outcome; meanwhile the other replica's
// status tool, which cannot see the uncommitted claim, answers not_found,
// and the original's own answers in_flight.
func TestPostgres_ClaimInTx_DuplicateJoinsAtTheKey(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	a := newReplica(t, url, nil)
	b := newReplica(t, url, nil)
	close(b.hold) // b's handler, if it runs, does not wait

	first := make(chan *mcp.CallToolResult, 1)
	go func() { first <- call(t, a.session, "pay", "join", payIn{Amount: 3, Hold: true}) }()
	<-a.reached
	if n := count(t, a.db.Read, `SELECT count(*) FROM calls WHERE key = 'join'`); n != 0 {
		t.Fatalf("%d committed rows for a running fresh call, want 0 (its claim is in its transaction)", n)
	}
	if st := status(t, b.session, map[string]any{"key": "join"}); st.State != query.NotFound {
		t.Errorf("status on another replica while the call runs: %s, want not_found", st.State)
	}
	if st := status(t, a.session, map[string]any{"key": "join"}); st.State != query.InFlight {
		t.Errorf("status on the running replica: %s, want in_flight", st.State)
	}
	dup := make(chan *mcp.CallToolResult, 1)
	go func() { dup <- call(t, b.session, "pay", "join", payIn{Amount: 3, Hold: true}) }()
	waitFor(t, func() bool { return waitingAtKey(t, a) })
	close(a.hold)
	if res := <-first; res.IsError {
		t.Fatalf("original: %s %s", errorCode(res), text(res))
	}
	res := <-dup
	if res.IsError || callMeta(res)["replayed"] != true {
		t.Fatalf("duplicate: %s %s, meta %v; want the original's outcome, replayed", errorCode(res), text(res), callMeta(res))
	}
	if n := payCharges(t, a.db); n != 1 || b.runs.Load() != 0 {
		t.Fatalf("charges = %d, runs on b = %d; want 1 and 0", n, b.runs.Load())
	}
}

// A duplicate waits at the key no longer than its in-flight wait, then
// answers in_progress without running the call.
func TestPostgres_ClaimInTx_DuplicateWaitIsBounded(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	a := newReplica(t, url, nil)
	b := newReplica(t, url, &outbox.Options{InFlightWait: 300 * time.Millisecond})
	close(b.hold)

	first := make(chan *mcp.CallToolResult, 1)
	go func() { first <- call(t, a.session, "pay", "bounded", payIn{Amount: 4, Hold: true}) }()
	<-a.reached
	start := time.Now()
	dup := call(t, b.session, "pay", "bounded", payIn{Amount: 4, Hold: true})
	if errorCode(dup) != "in_progress" {
		t.Fatalf("duplicate while the original holds the key: %s %s; want in_progress", errorCode(dup), text(dup))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("duplicate answered after %v, past its in-flight wait", d)
	}
	close(a.hold)
	if res := <-first; res.IsError {
		t.Fatalf("original: %s %s", errorCode(res), text(res))
	}
	if n := payCharges(t, a.db); n != 1 || b.runs.Load() != 0 {
		t.Fatalf("charges = %d, runs on b = %d; want 1 and 0", n, b.runs.Load())
	}
}

// A handler that works outside the database for longer than the lease
// (a slow API between two statements) keeps its call: the layer touches
// its transaction every third of the lease, so PostgreSQL's idle timer
// (idle_in_transaction_session_timeout, set from the lease) never ends
// the session of a live process. A duplicate on another replica still
// waits at the key and then replays. The opposite, a process that stops
// talking (SIGSTOP) past its lease and then commits nothing, is
// TestReplicas_StoppedPastLeaseDoesNotCommit in cmd/mcp-outbox: a paused
// process cannot be imitated in this one.
func TestPostgres_ClaimInTx_IdleHandlerPastLeaseCommits(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	const lease = 300 * time.Millisecond
	a := newReplica(t, url, &outbox.Options{Lease: lease})
	b := newReplica(t, url, &outbox.Options{InFlightWait: 20 * time.Second})
	close(b.hold) // b's handler, if it runs, does not wait
	release := sync.OnceFunc(func() { close(a.hold) })
	t.Cleanup(release) // a failing test does not leave the handler waiting

	first := make(chan *mcp.CallToolResult, 1)
	go func() { first <- call(t, a.session, "pay", "idle", payIn{Amount: 6, Hold: true}) }()
	<-a.reached
	// Wait until a's transaction has lived four leases: without the
	// touches, PostgreSQL would have ended it after one.
	waitFor(t, func() bool {
		return count(t, a.db.Read, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
			AND clock_timestamp() - xact_start > interval '1200 milliseconds'`) == 1
	})
	dup := make(chan *mcp.CallToolResult, 1)
	go func() { dup <- call(t, b.session, "pay", "idle", payIn{Amount: 6, Hold: true}) }()
	waitFor(t, func() bool { return waitingAtKey(t, a) })
	release()
	if res := <-first; res.IsError {
		t.Fatalf("handler idle past its lease: %s %s; want its success", errorCode(res), text(res))
	}
	if res := <-dup; res.IsError || callMeta(res)["replayed"] != true {
		t.Fatalf("duplicate: %s %s, meta %v; want the original's outcome, replayed", errorCode(res), text(res), callMeta(res))
	}
	if n := payCharges(t, a.db); n != 1 || b.runs.Load() != 0 {
		t.Fatalf("charges = %d, runs on b = %d; want 1 and 0", n, b.runs.Load())
	}
}

// A replica cut off from the database while its handler runs (here its
// connection is ended, which rolls back its uncommitted claim) loses the
// call to another replica, which runs it. The cut-off replica must not
// tell its client that a retry runs the call again: a retry gets the
// other replica's outcome, replayed.
func TestPostgres_ClaimInTx_CutOffReplicaSaysRetryReplays(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	a := newReplica(t, url, nil)
	b := newReplica(t, url, nil)
	close(b.hold)
	release := sync.OnceFunc(func() { close(a.hold) })
	t.Cleanup(release)

	first := make(chan *mcp.CallToolResult, 1)
	go func() { first <- call(t, a.session, "pay", "cut-off", payIn{Amount: 4, Hold: true}) }()
	<-a.reached
	// The partition: a's transaction, which holds its claim, ends.
	if n := count(t, b.db.Read, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()) AS t`); n != 1 {
		t.Fatalf("ended %d transactions, want a's one", n)
	}
	if res := call(t, b.session, "pay", "cut-off", payIn{Amount: 4}); res.IsError || callMeta(res)["replayed"] != false {
		t.Fatalf("b's call: %s %s; want it run", errorCode(res), text(res))
	}
	release()
	res := <-first
	if !res.IsError || errorCode(res) != "not_recorded" || strings.Contains(text(res), "runs it again") ||
		!strings.Contains(text(res), "a retry gets its outcome, replayed") {
		t.Fatalf("cut-off replica's answer: %s %s; want that a retry gets the other's outcome", errorCode(res), text(res))
	}
	if again := call(t, a.session, "pay", "cut-off", payIn{Amount: 4}); again.IsError || callMeta(again)["replayed"] != true {
		t.Fatalf("retry: %s %s; want b's outcome replayed", errorCode(again), text(again))
	}
	if n := payCharges(t, a.db); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
}

// heapOnly reports whether the live version of the row of key is a
// heap-only tuple: the outcome updated it in place on its page (HOT),
// adding no entry to any of calls' indexes. It reads the page with
// pageinspect, a contrib module: the test skips where it is not installed.
func heapOnly(t *testing.T, r *replica, key string) bool {
	t.Helper()
	if _, err := r.db.Write.Exec(`CREATE EXTENSION IF NOT EXISTS pageinspect`); err != nil {
		t.Skipf("pageinspect (PostgreSQL's contrib) is not installed: %v", err)
	}
	var hot bool
	err := r.db.Read.QueryRow(`
SELECT (p.t_infomask2 & 32768) <> 0 -- HEAP_ONLY_TUPLE
FROM calls c, heap_page_items(get_raw_page('calls', (c.ctid::text::point)[0]::integer)) p
WHERE c.key = $1 AND p.lp = (c.ctid::text::point)[1]::integer`, key).Scan(&hot)
	if err != nil {
		t.Fatal(err)
	}
	return hot
}

// A fresh call's claim in its transaction inserts the row as the outcome
// leaves it (claim_tx_postgres.go): the outcome of a call that ends within
// its expiry's slack changes no indexed column, so PostgreSQL updates the
// row in place (HOT), and the key names the call for its retention from
// the claim. A call that outlasts the slack gets the expiry it always had,
// its outcome's time plus the retention.
func TestPostgres_ClaimInTx_OutcomeUpdatesInPlace(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	clk := &clock{t: time.Now()}
	opts := &outbox.Options{Now: clk.Now, KeyRetention: time.Hour}
	a, b := newReplica(t, url, opts), newReplica(t, url, opts)

	short := make(chan *mcp.CallToolResult, 1)
	go func() { short <- call(t, b.session, "pay", "short", payIn{Amount: 1, Hold: true}) }()
	<-b.reached
	clk.Add(500 * time.Millisecond) // within the slack (a second)
	close(b.hold)
	if res := <-short; res.IsError {
		t.Fatalf("short call: %s %s", errorCode(res), text(res))
	}
	var state, owner string
	var expiresAfter int64
	err := a.db.Read.QueryRow(`SELECT state, owner, expires_at - created_at FROM calls WHERE key = 'short'`).Scan(&state, &owner, &expiresAfter)
	if err != nil {
		t.Fatal(err)
	}
	if state != "completed" || owner != "" {
		t.Fatalf("short call's row: state %q, owner %q", state, owner)
	}
	if want := time.Hour.Milliseconds(); expiresAfter != want {
		t.Errorf("short call expires %d ms after its claim, want %d (the retention)", expiresAfter, want)
	}
	if !heapOnly(t, b, "short") {
		t.Error("the short call's outcome moved its row off its page: an entry in every index of calls (not HOT)")
	}

	long := make(chan *mcp.CallToolResult, 1)
	go func() { long <- call(t, a.session, "pay", "long", payIn{Amount: 2, Hold: true}) }()
	<-a.reached
	clk.Add(2 * time.Second) // past the slack
	close(a.hold)
	if res := <-long; res.IsError {
		t.Fatalf("long call: %s %s", errorCode(res), text(res))
	}
	err = a.db.Read.QueryRow(`SELECT expires_at - completed_at FROM calls WHERE key = 'long'`).Scan(&expiresAfter)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Hour.Milliseconds(); expiresAfter != want {
		t.Errorf("long call expires %d ms after its outcome, want %d (the retention)", expiresAfter, want)
	}
}
