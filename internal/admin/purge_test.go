package admin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// settle puts the effects of the call with key into state, as of at: the
// dispatcher or an operator would have written delivered_at for delivered
// and updated_at for every change.
func settle(t *testing.T, db *schema.DB, key, state string, at time.Time) {
	t.Helper()
	_, err := db.Write.Exec(`
UPDATE effects SET state = $1, updated_at = $2, delivered_at = CASE WHEN $1 = 'delivered' THEN CAST($2 AS BIGINT) END
WHERE call_id = (SELECT id FROM calls WHERE key = $3)`, state, at.UnixMilli(), key)
	if err != nil {
		t.Fatal(err)
	}
}

func purge(t *testing.T, db *schema.DB, r outbox.Retention, now time.Time, dryRun bool) admin.PurgeCounts {
	t.Helper()
	c, err := admin.Purge(context.Background(), db, &admin.PurgeOptions{Retention: r, Now: now, DryRun: dryRun})
	if err != nil {
		t.Fatalf("purge (dry run %v): %v", dryRun, err)
	}
	return c
}

func TestPurge_RemovesOnlyWhatExpired(t *testing.T) {
	t.Parallel()
	start := time.Now()
	clk := &clock{t: start}
	b := setup(t, &outbox.Options{Now: clk.Now})
	for i, key := range []string{"delivered-old", "delivered-young", "cancelled-old", "pending", "dead", "unknown"} {
		callCharge(t, b.session, key, 100+i)
	}
	settle(t, b.db, "delivered-old", "delivered", start)
	settle(t, b.db, "delivered-young", "delivered", start.Add(2*24*time.Hour))
	settle(t, b.db, "cancelled-old", "cancelled", start)
	settle(t, b.db, "dead", "dead", start)
	settle(t, b.db, "unknown", "unknown", start)
	clk.Add(8 * 24 * time.Hour) // every key above has expired (24 h)
	callCharge(t, b.session, "fresh", 999)
	settle(t, b.db, "fresh", "delivered", clk.Now())

	// The call with a young delivered effect goes: the effect no longer
	// needs its call, and keeps its own Idempotency-Key.
	want := admin.PurgeCounts{Calls: 3, DeliveredEffects: 1, CancelledEffects: 1}
	if got := purge(t, b.db, outbox.Retention{}, clk.Now(), true); got != want {
		t.Errorf("dry run: %+v, want %+v", got, want)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls`); n != 7 {
		t.Fatalf("dry run deleted calls: %d left of 7", n)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM effects`); n != 7 {
		t.Fatalf("dry run deleted effects: %d left of 7", n)
	}
	if got := purge(t, b.db, outbox.Retention{}, clk.Now(), false); got != want {
		t.Errorf("purge: %+v, want %+v", got, want)
	}

	calls := keysOf(t, b.db, `SELECT key FROM calls ORDER BY key`)
	if want := "[dead fresh pending unknown]"; calls != want {
		t.Errorf("calls left: %s, want %s", calls, want)
	}
	effects := keysOf(t, b.db, `SELECT e.state || ':' || coalesce(c.key, '-') FROM effects e LEFT JOIN calls c ON c.id = e.call_id ORDER BY e.id`)
	if want := "[delivered:- pending:pending dead:dead unknown:unknown delivered:fresh]"; effects != want {
		t.Errorf("effects left (state:call key): %s, want %s", effects, want)
	}
	if got := purge(t, b.db, outbox.Retention{}, clk.Now(), false); got != (admin.PurgeCounts{}) {
		t.Errorf("second purge: %+v, want nothing", got)
	}

	// Years later, what still needs a dispatcher or an operator is there.
	clk.Add(10 * 365 * 24 * time.Hour)
	if got := purge(t, b.db, outbox.Retention{}, clk.Now(), false); got != (admin.PurgeCounts{Calls: 1, DeliveredEffects: 2}) {
		t.Errorf("purge years later: %+v, want the fresh call and both delivered effects", got)
	}
	effects = keysOf(t, b.db, `SELECT e.state || ':' || coalesce(c.key, '-') FROM effects e LEFT JOIN calls c ON c.id = e.call_id ORDER BY e.id`)
	if want := "[pending:pending dead:dead unknown:unknown]"; effects != want {
		t.Errorf("effects left years later: %s, want %s", effects, want)
	}
}

func TestPurge_PurgedKeyIsNotFoundAndRunsAgain(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now})
	callCharge(t, b.session, "old", 100)
	settle(t, b.db, "old", "delivered", clk.Now())
	clk.Add(8 * 24 * time.Hour)
	if got := purge(t, b.db, outbox.Retention{}, clk.Now(), false); got.Calls != 1 {
		t.Fatalf("purge: %+v, want the call", got)
	}
	if st := status(t, b.session, map[string]any{"key": "old"}); st.State != query.NotFound {
		t.Errorf("status of a purged call: %+v, want not_found", st)
	}
	if res := callCharge(t, b.session, "old", 100); callMeta(res)["replayed"] != false {
		t.Errorf("retry of a purged call was replayed: %v", res.Meta)
	}
	if got := charges(t, b); got != 2 {
		t.Errorf("%d charges, want 2: the retry runs again", got)
	}
}

// A call known by a short fingerprint window stays until Calls after its
// completion, but purging can never outlast its key's record either way.
func TestPurge_CallRetention(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now, FingerprintWindow: time.Minute})
	callCharge(t, b.session, "", 100)    // fingerprint: forgotten after a minute
	callCharge(t, b.session, "keyed", 7) // explicit key: after 24 hours
	if _, err := b.db.Write.Exec(`UPDATE effects SET state = 'delivered', delivered_at = $1, updated_at = $1`, clk.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	r := outbox.Retention{Calls: time.Hour}
	clk.Add(30 * time.Minute)
	if got := purge(t, b.db, r, clk.Now(), false); got.Calls != 0 {
		t.Errorf("purge within Calls: %+v, want no calls", got)
	}
	clk.Add(time.Hour)
	if got := purge(t, b.db, r, clk.Now(), false); got.Calls != 1 {
		t.Errorf("purge after Calls: %+v, want the fingerprinted call only", got)
	}
	clk.Add(23 * time.Hour)
	if got := purge(t, b.db, r, clk.Now(), false); got.Calls != 1 {
		t.Errorf("purge after the key's retention: %+v, want the keyed call", got)
	}
}

// More rows than one batch holds are all purged, over several transactions.
func TestPurge_ManyBatches(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	now := time.Now()
	aged := now.Add(-8 * 24 * time.Hour).UnixMilli()
	_, err := db.Write.Exec(`
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500)
INSERT INTO effects (seq, destination, method, path, idempotency_key, state, next_attempt_at, created_at, updated_at, delivered_at)
SELECT 1, 'payments', 'POST', '/v1/charges', 'batch-' || i, 'delivered', $1, $1, $1, $1 FROM n`, aged)
	if err != nil {
		t.Fatal(err)
	}
	if got := purge(t, db, outbox.Retention{}, now, false); got.DeliveredEffects != 2500 {
		t.Errorf("purged %+v, want 2500 delivered effects", got)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects left", n)
	}
}

func TestPurge_RejectsNegative(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	if _, err := admin.Purge(context.Background(), db, &admin.PurgeOptions{Retention: outbox.Retention{Delivered: -time.Hour}, DryRun: true}); err == nil {
		t.Error("negative retention accepted")
	}
}

// Under steady load with purging, the file stops growing: purged pages go
// to the freelist and the next round's rows reuse them.
func TestPurge_SteadyLoadDoesNotGrowTheFile(t *testing.T) {
	sqliteOnly(t, "the file's pages and freelist; PostgreSQL's tables are reclaimed by VACUUM")
	t.Parallel()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now})
	const rounds, perRound = 5, 200
	pages := make([]int, rounds+1)
	for round := 1; round <= rounds; round++ {
		for i := range perRound {
			callCharge(t, b.session, fmt.Sprintf("load-%d-%d", round, i), 100+i)
		}
		if _, err := b.db.Write.Exec(`UPDATE effects SET state = 'delivered', delivered_at = $1, updated_at = $1 WHERE state = 'pending'`,
			clk.Now().UnixMilli()); err != nil {
			t.Fatal(err)
		}
		// The ledger's own rows are the application's to keep or not;
		// dropping them leaves the outbox's tables as what the file holds.
		if _, err := b.db.Write.Exec(`DELETE FROM charges`); err != nil {
			t.Fatal(err)
		}
		clk.Add(defaults.DeliveredRetention + time.Hour)
		got := purge(t, b.db, outbox.Retention{}, clk.Now(), false)
		if got != (admin.PurgeCounts{Calls: perRound, DeliveredEffects: perRound}) {
			t.Fatalf("round %d: purged %+v, want %d calls and effects", round, got, perRound)
		}
		pages[round] = count(t, b.db.Write, `PRAGMA page_count`)
	}
	const slack = 2
	if pages[rounds] > pages[2]+slack {
		t.Errorf("page count by round %v: grows without bound (round %d has %d, round 2 had %d)",
			pages[1:], rounds, pages[rounds], pages[2])
	}
	t.Logf("page count by round: %v", pages[1:])
}

// A claim left by an attempt that died and whose call was never retried is
// purged once its lease is long past; a live claim is not.
func TestPurge_AbandonedClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	now := time.Now()
	for _, c := range []struct {
		key   string
		lease time.Time
	}{{"abandoned", now.Add(-48 * time.Hour)}, {"running", now.Add(time.Minute)}} {
		if _, err := b.db.Write.Exec(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at)
			VALUES ($1, 'local', $2, 'meta', 'charge', '', 'in_flight', 'elsewhere/1/1/ab#1', $3, $4, $5)`,
			"call_"+c.key, c.key, c.lease.UnixMilli(), c.lease.UnixMilli(), now.Add(time.Hour).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if got := purge(t, b.db, outbox.Retention{}, now, false); got.Calls != 1 {
		t.Fatalf("purged %+v, want the abandoned claim only", got)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = 'running'`); n != 1 {
		t.Error("a live claim was purged")
	}
}

// A claim of a call forwarded to a process whose work is outside the call's
// transaction (on_lost = 'unknown') may have run there: once abandoned it
// becomes an unknown call, owned by nobody, not a deleted row a retry would
// run again. Unknown calls are never purged.
func TestPurge_AbandonedForwardedClaimsBecomeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	now := time.Now()
	long := now.Add(-48 * time.Hour)
	for _, c := range []struct {
		key, state, onLost string
		lease, expires     time.Time
	}{
		{"lost-forwarded", "in_flight", "unknown", long, now.Add(-time.Hour)},
		{"running-forwarded", "in_flight", "unknown", now.Add(time.Minute), now.Add(time.Hour)},
		{"recent-forwarded", "in_flight", "unknown", now.Add(-time.Hour), now.Add(time.Hour)}, // within the grace
		{"lost-local", "in_flight", "rerun", long, now.Add(-time.Hour)},
		{"settled-unknown", "unknown", "unknown", time.UnixMilli(0), long},
	} {
		owner := "elsewhere/1/1/ab#1"
		if c.state == "unknown" {
			owner = ""
		}
		if _, err := b.db.Write.Exec(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at, on_lost)
			VALUES ($1, 'local', $2, 'meta', 'charge', '', $3, $4, $5, $6, $7, $8)`,
			"call_"+c.key, c.key, c.state, owner, c.lease.UnixMilli(), long.UnixMilli(), c.expires.UnixMilli(), c.onLost); err != nil {
			t.Fatal(err)
		}
	}
	rows := func() string {
		return keysOf(t, b.db, `SELECT key || ':' || state || ':' || owner || ':' || CASE WHEN lease_until > 0 THEN '1' ELSE '0' END FROM calls ORDER BY id`)
	}
	before := rows()
	want := admin.PurgeCounts{Calls: 1, UnknownCalls: 1}
	if got := purge(t, b.db, outbox.Retention{}, now, true); got != want {
		t.Errorf("dry run: %+v, want %+v", got, want)
	}
	if after := rows(); after != before {
		t.Errorf("dry run changed calls: %s -> %s", before, after)
	}
	if got := purge(t, b.db, outbox.Retention{}, now, false); got != want {
		t.Errorf("purge: %+v, want %+v", got, want)
	}
	wantRows := "[lost-forwarded:unknown::0 running-forwarded:in_flight:elsewhere/1/1/ab#1:1 " +
		"recent-forwarded:in_flight:elsewhere/1/1/ab#1:1 settled-unknown:unknown::0]"
	if got := rows(); got != wantRows {
		t.Errorf("calls after purge (key:state:owner:leased): %s, want %s", got, wantRows)
	}
	// Its key has expired, but an unknown call is reported as such: a retry
	// would not run it.
	st, err := query.Lookup(context.Background(), b.db, "local", "lost-forwarded", now)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != query.OutcomeUnknown || !strings.Contains(st.Message, "resolve-call") {
		t.Errorf("status of the abandoned forwarded call: %+v, want unknown", st)
	}
	if got := purge(t, b.db, outbox.Retention{}, now, false); got != (admin.PurgeCounts{}) {
		t.Errorf("second purge: %+v, want nothing", got)
	}

	// Years later every forwarded claim is unknown, and all are still there.
	if got := purge(t, b.db, outbox.Retention{}, now.Add(10*365*24*time.Hour), false); got != (admin.PurgeCounts{UnknownCalls: 2}) {
		t.Errorf("purge years later: %+v, want the two live claims marked unknown", got)
	}
	if got := keysOf(t, b.db, `SELECT key || ':' || state FROM calls ORDER BY id`); got != "[lost-forwarded:unknown running-forwarded:unknown recent-forwarded:unknown settled-unknown:unknown]" {
		t.Errorf("calls years later: %s", got)
	}
}

// TestPurge_RaceWithRetryOfCancelledEffect: an operator retries a cancelled
// effect of an expired call while a purge runs. Either the retry comes
// first and the call stays (a pending effect holds it), or the purge does
// and the call is gone before the retry; never a pending effect whose call
// the purge deleted under it. The interleaving that lost it: the purge
// read the effect as cancelled, the retry committed, the purge deleted the
// call. A transaction that holds the effect's row lock makes both wait
// there, retry first.
func TestPurge_RaceWithRetryOfCancelledEffect(t *testing.T) {
	outboxtest.PostgresOnly(t)
	t.Parallel()
	ctx := context.Background()
	start := time.Now()
	clk := &clock{t: start}
	b := setup(t, &outbox.Options{Now: clk.Now})
	callCharge(t, b.session, "cancelled", 100)
	clk.Add(8 * 24 * time.Hour) // the call's key has expired
	settle(t, b.db, "cancelled", "cancelled", clk.Now())
	id := effectID(t, b.db, "cancelled")

	holder, err := b.db.Write.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.ExecContext(ctx, `SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	retried := make(chan error, 1)
	go func() { retried <- admin.RetryEffect(ctx, b.db, id) }()
	waitLockWaiters(t, b.db, 1)
	purged := make(chan error, 1)
	go func() {
		_, err := admin.Purge(ctx, b.db, &admin.PurgeOptions{Now: clk.Now()})
		purged <- err
	}()
	// The purge either finishes (it skipped the call whose effect is being
	// retried) or waits behind the retry for the effect's row.
	select {
	case err := <-purged:
		if err != nil {
			t.Fatal(err)
		}
		purged <- nil
	case <-waitLockWaitersAsync(b.db, 2):
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-retried; err != nil {
		t.Fatalf("retry: %v", err)
	}
	if err := <-purged; err != nil {
		t.Fatalf("purge: %v", err)
	}
	var state string
	var callID *int64
	if err := b.db.Read.QueryRow(`SELECT state, call_id FROM effects WHERE id = $1`, id).Scan(&state, &callID); err != nil {
		t.Fatal(err)
	}
	if state != "pending" || callID == nil {
		t.Errorf("effect after the race: state %s, call %v; want pending and still its call's", state, callID)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = 'cancelled'`); n != 1 {
		t.Errorf("calls with the key: %d, want 1 (a pending effect holds it)", n)
	}
}

// lockWaiters counts this database's backends waiting for a lock.
func lockWaiters(t *testing.T, db *schema.DB) int {
	return count(t, db.Read, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
}

// waitLockWaiters waits until n backends wait for a lock.
func waitLockWaiters(t *testing.T, db *schema.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for lockWaiters(t, db) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d backends waiting for a lock after 30 s", n)
		}
		time.Sleep(5 * time.Millisecond) // polling pg_stat_activity, with a deadline
	}
}

// waitLockWaitersAsync is closed once n backends wait for a lock; it is
// never closed if that does not happen within 30 s.
func waitLockWaitersAsync(db *schema.DB, n int) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var got int
			if err := db.Read.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got); err == nil && got >= n {
				close(c)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return c
}
