package outbox

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func openGroup(t testing.TB) *groupCommit {
	t.Helper()
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "g.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Write.Exec(`CREATE TABLE t (v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	return newGroupCommit(db, defaults.MaxBatchCalls, time.Hour, time.Now)
}

// committed waits for b's outcome; a batch left open with nobody to commit
// it never gets one, which fails the test instead of hanging it.
func committed(t *testing.T, b *batch) {
	t.Helper()
	select {
	case <-b.done:
		if b.err != nil {
			t.Fatalf("batch: %v", b.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was never committed")
	}
}

// A unit that ends while another waits leaves the batch open for it. If the
// waiter gives up at that moment (its context ends as the turn reaches it),
// it must still commit the batch, or the first unit waits for ever.
func TestGroupCommit_WaiterGivingUpCommits(t *testing.T) {
	g := openGroup(t)
	for i := range 200 {
		first, err := g.enter(context.Background(), true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := first.exec(`INSERT INTO t VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() {
			u, err := g.enter(ctx, true)
			if err == nil {
				u.leave(false)
			}
			gaveUp <- err
		}()
		deadline := time.Now().Add(10 * time.Second)
		for g.waiting() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the second unit never queued")
			}
			time.Sleep(time.Millisecond) // polling interval
		}
		// The waiter's context ends as the first unit leaves: either the
		// waiter leaves the queue first and the first unit commits, or the
		// turn and the open batch reach a waiter that is giving up.
		cancel()
		b := first.leave(true)
		committed(t, b)
		<-gaveUp
	}
	var n int
	if err := g.db.Read.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 200 {
		t.Fatalf("rows = %d, %v; want 200", n, err)
	}
}

// A statement seen while a batch holds the writer runs unprepared; the next
// batch prepares it. A context that ends while preparing leaves it to try
// again, rather than marking it as not preparable.
func TestStmtCache_PreparesBetweenBatches(t *testing.T) {
	g := openGroup(t)
	const q = `INSERT INTO t VALUES ($1)`
	for i := range 3 {
		u, err := g.enter(context.Background(), true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := u.exec(q, i); err != nil {
			t.Fatal(err)
		}
		committed(t, u.leave(true))
	}
	g.stmts.mu.Lock()
	st, ok := g.stmts.stmts[q]
	g.stmts.mu.Unlock()
	if !ok || st == nil {
		t.Fatalf("statement not prepared after two batches")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g.stmts.lookup(`SELECT count(*) FROM t`)
	g.stmts.prepare(ctx)
	g.stmts.mu.Lock()
	_, cached := g.stmts.stmts[`SELECT count(*) FROM t`]
	pending := g.stmts.pending[`SELECT count(*) FROM t`]
	g.stmts.mu.Unlock()
	if cached || !pending {
		t.Errorf("after a cancelled prepare: cached %v, pending %v; want it pending", cached, pending)
	}
}

// On PostgreSQL a unit's transaction is its own, and it ends without
// RELEASE: COMMIT answers for a statement error that ended the
// transaction. The batch must say that nothing committed, never that the
// commit is unknown (which would send the call to read its row again as if
// it might have committed).
func TestGroupCommit_OwnTransactionEndedByError(t *testing.T) {
	ctx := context.Background()
	db, err := schema.Open(ctx, pgtest.Database(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Write.Exec(`CREATE TABLE t (v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	g := newGroupCommit(db, defaults.MaxBatchCalls, time.Hour, time.Now)
	rows := func() (n int) {
		t.Helper()
		if err := db.Read.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// failingUnit enters a unit, inserts v, then runs a statement that
	// fails and so ends the transaction.
	failingUnit := func(v int) *unit {
		t.Helper()
		u, err := g.enter(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := u.exec(`INSERT INTO t VALUES ($1)`, v); err != nil {
			t.Fatal(err)
		}
		if _, err := u.exec(`INSERT INTO t VALUES (1/($1::int - 1))`, 1); err == nil {
			t.Fatal("division by zero succeeded")
		}
		return u
	}

	b := failingUnit(1).leave(true)
	<-b.done
	if !errors.Is(b.err, errOwnTxEnded) {
		t.Fatalf("batch error = %v; want %v", b.err, errOwnTxEnded)
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d rows after a transaction an error ended; want 0", n)
	}

	// Undone by its savepoint, the same error leaves the rest to commit.
	u := failingUnit(2)
	if err := u.undo(); err != nil {
		t.Fatal(err)
	}
	if _, err := u.exec(`INSERT INTO t VALUES ($1)`, 3); err != nil {
		t.Fatal(err)
	}
	committed(t, u.leave(true))
	if n := rows(); n != 1 {
		t.Fatalf("%d rows; want 1 (the statement after the undo)", n)
	}
}

// BenchmarkGroupUnit is one unit alone in its batch, the path of every
// claim and outcome of a lone call: enter (BEGIN, SAVEPOINT), two
// statements of the statement cache, leave (RELEASE) and commit. "relaxed" commits with synchronous=NORMAL, as a claim does,
// "durable" with FULL, as an outcome does (its fsync dominates the time;
// compare allocs/op).
func BenchmarkGroupUnit(b *testing.B) {
	for _, durable := range []bool{false, true} {
		name := "relaxed"
		if durable {
			name = "durable"
		}
		b.Run(name, func(b *testing.B) {
			g := openGroup(b)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				u, err := g.enter(ctx, durable)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := u.exec(`INSERT INTO t VALUES ($1)`, i); err != nil {
					b.Fatal(err)
				}
				var n int
				if err := u.queryRow(`SELECT count(*) FROM t WHERE rowid = last_insert_rowid() AND v = $1`, i).Scan(&n); err != nil {
					b.Fatal(err)
				}
				if err := u.leave(true).wait(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
