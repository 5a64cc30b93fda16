package query_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestMain stops the PostgreSQL server the tests started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// openDB opens a database for a test: SQLite in tb.TempDir, or PostgreSQL
// when MCP_OUTBOX_TEST_STORE=postgres, as the outbox's tests do.
func openDB(tb testing.TB) *schema.DB {
	tb.Helper()
	target := filepath.Join(tb.TempDir(), "test.db")
	if os.Getenv("MCP_OUTBOX_TEST_STORE") == "postgres" {
		target = pgtest.Database(tb)
	}
	db, err := schema.Open(context.Background(), target, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// bigID is an effect id past 32 bits, which every lookup by id must bind.
const bigID = 3_000_000_000

// fixture writes two calls and four effects as of now:
//
//	call "k1" of p, completed: effects 1 delivered 90 s ago, 2 pending, 3 dead 150 s ago
//	call "lost" of p, unknown
//	effect bigID without a call, at "other", unknown 30 s ago
func fixture(t *testing.T, db *schema.DB, now time.Time) (uid string) {
	t.Helper()
	ms := now.UnixMilli()
	for _, s := range []struct {
		q    string
		args []any
	}{
		{`INSERT INTO calls (id, uid, principal, key, key_source, tool, args_hash, state, result, created_at, completed_at, expires_at)
		  VALUES (1, 'call_1', 'p', 'k1', 'meta', 'charge', 'h', 'completed', '{"content":[]}', $1, $2, $3)`,
			[]any{ms - 600_000, ms - 590_000, ms + 3_600_000}},
		{`INSERT INTO calls (id, uid, principal, key, key_source, tool, args_hash, state, created_at, expires_at, on_lost)
		  VALUES (2, 'call_2', 'p', 'lost', 'meta', 'forward', 'h', 'unknown', $1, $2, 'unknown')`,
			[]any{ms - 500_000, ms - 400_000}},
		{`INSERT INTO effects (id, call_id, seq, destination, method, path, idempotency_key, state, attempts, next_attempt_at,
		                      last_status, created_at, updated_at, delivered_at)
		  VALUES (10, 1, 1, 'payments', 'POST', '/a', 'key-1', 'delivered', 1, $1, 200, $1, $2, $2)`,
			[]any{ms - 590_000, ms - 90_000}},
		{`INSERT INTO effects (id, call_id, seq, destination, method, path, idempotency_key, state, next_attempt_at, created_at, updated_at)
		  VALUES (11, 1, 2, 'payments', 'POST', '/b', 'key-2', 'pending', $1, $2, $2)`,
			[]any{ms + 1_000, ms - 590_000}},
		{`INSERT INTO effects (id, call_id, seq, destination, method, path, idempotency_key, state, attempts, next_attempt_at,
		                      last_status, last_error, created_at, updated_at)
		  VALUES (12, 1, 3, 'payments', 'POST', '/c', 'key-3', 'dead', 1, $1, 400, 'refused', $2, $3)`,
			[]any{ms - 590_000, ms - 590_000, ms - 150_000}},
		{`INSERT INTO effects (id, seq, destination, method, path, idempotency_key, state, attempts, next_attempt_at, created_at, updated_at)
		  VALUES ($1, 1, 'other', 'PUT', '/d', 'key-4', 'unknown', 1, $2, $3, $4)`,
			[]any{int64(bigID), ms + 10_000, ms - 60_000, ms - 30_000}},
	} {
		if _, err := db.Write.Exec(s.q, s.args...); err != nil {
			t.Fatal(err)
		}
	}
	return "call_1"
}

// The reads of this package, on the store the tests run on.
func TestQuery_Reads(t *testing.T) {
	t.Parallel()
	testReads(t, openDB(t))
}

// testReads writes the fixture to db and checks every read of this
// package against it.
func testReads(t *testing.T, db *schema.DB) {
	now := time.UnixMilli(1_700_000_000_000)
	uid := fixture(t, db, now)
	ctx := context.Background()

	t.Run("Lookup", func(t *testing.T) {
		st, err := query.Lookup(ctx, db, "p", "k1", now)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != query.Completed || st.CallID != uid || len(st.Effects) != 3 || string(st.Result) != `{"content":[]}` {
			t.Fatalf("status: %+v", st)
		}
		for i, want := range []string{"delivered", "pending", "dead"} {
			if e := st.Effects[i]; e.Seq != i+1 || e.State != want {
				t.Errorf("effect %d: seq %d %s, want seq %d %s", i, e.Seq, e.State, i+1, want)
			}
		}
		if st, _ := query.Lookup(ctx, db, "p", "lost", now); st.State != query.OutcomeUnknown {
			t.Errorf("unknown call past its expiry: %s", st.State)
		}
		if st, _ := query.Lookup(ctx, db, "q", "k1", now); st.State != query.NotFound {
			t.Errorf("another principal's key: %s", st.State)
		}
	})
	t.Run("ListEffects", func(t *testing.T) {
		for _, tc := range []struct {
			f    opsquery.EffectFilter
			want []int64
		}{
			{opsquery.EffectFilter{}, []int64{bigID, 12, 11, 10}},
			{opsquery.EffectFilter{State: "dead"}, []int64{12}},
			{opsquery.EffectFilter{Destination: "other"}, []int64{bigID}},
			{opsquery.EffectFilter{ID: bigID}, []int64{bigID}},
			{opsquery.EffectFilter{Destination: "payments", Limit: 2}, []int64{12, 11}},
		} {
			rows, err := opsquery.ListEffects(ctx, db, tc.f)
			if err != nil {
				t.Fatalf("%+v: %v", tc.f, err)
			}
			var got []int64
			for _, r := range rows {
				got = append(got, r.ID)
			}
			if !equal(got, tc.want) {
				t.Errorf("%+v: ids %v, want %v", tc.f, got, tc.want)
			}
		}
	})
	t.Run("Counts", func(t *testing.T) {
		c, err := opsquery.CountEffects(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if want := (opsquery.Counts{Pending: 1, Delivered: 1, Dead: 1, Unknown: 1}); c != want {
			t.Errorf("counts %+v, want %+v", c, want)
		}
		by, err := opsquery.CountEffectsByDestination(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if len(by) != 2 || by[0].Destination != "other" || by[0].Unknown != 1 || by[1].Destination != "payments" || by[1].Total() != 3 {
			t.Errorf("by destination: %+v", by)
		}
		if n, err := opsquery.CountUnknownCalls(ctx, db); err != nil || n != 1 {
			t.Errorf("unknown calls: %d, %v", n, err)
		}
	})
	t.Run("Lists", func(t *testing.T) {
		stuck, err := opsquery.ListStuckEffects(ctx, db, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(stuck) != 2 || stuck[0].ID != bigID || stuck[1].ID != 12 || stuck[1].Principal != "p" || stuck[1].CallKey != "k1" {
			t.Errorf("stuck effects: %+v", stuck)
		}
		calls, err := opsquery.RecentCalls(ctx, db, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) != 2 || calls[1].Key != "k1" || calls[1].Effects != 3 || calls[1].Delivered != 1 || calls[1].CompletedAt == nil {
			t.Errorf("recent calls: %+v", calls)
		}
		unknown, err := opsquery.ListUnknownCalls(ctx, db, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(unknown) != 1 || unknown[0].Key != "lost" || unknown[0].CallID != "call_2" {
			t.Errorf("unknown calls: %+v", unknown)
		}
		ids, err := opsquery.EffectIDs(ctx, db, uid)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := json.Marshal(ids); string(b) != `{"1":10,"2":11,"3":12}` {
			t.Errorf("effect ids: %s", b)
		}
	})
	t.Run("DeliveryHistory", func(t *testing.T) {
		h, err := opsquery.DeliveryHistory(ctx, db, now, time.Minute, 5)
		if err != nil {
			t.Fatal(err)
		}
		var delivered, failed []int
		for _, b := range h {
			delivered, failed = append(delivered, b.Delivered), append(failed, b.Failed)
		}
		// Buckets of a minute from now-5m: delivered at -90 s is in the
		// fourth, dead at -150 s in the third, unknown at -30 s in the last.
		if b, _ := json.Marshal([][]int{delivered, failed}); string(b) != `[[0,0,0,1,0],[0,0,1,0,1]]` {
			t.Errorf("delivered and failed by bucket: %s", b)
		}
		if !h[0].Start.Equal(now.Add(-5 * time.Minute)) {
			t.Errorf("first bucket starts %s, want %s", h[0].Start, now.Add(-5*time.Minute))
		}
	})
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
