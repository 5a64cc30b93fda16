package outbox

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// FuzzCheckStatements checks the guard against SQLite itself: in an open
// transaction holding a marker row, any text the guard allows is run, the
// transaction is rolled back, and the marker must be gone. A text that
// committed (or ended the transaction and wrote the marker again outside
// it) leaves the marker behind. The guard must not panic on any text, for
// either database.
func FuzzCheckStatements(f *testing.F) {
	for _, s := range []string{
		"INSERT INTO t VALUES (1); COMMIT",
		"/* x */ COMMIT",
		"-- x\nCOMMIT",
		"SELECT 1;\ufeffEND",
		"SELECT $a(';COMMIT)",
		"SELECT 'a'';'; COMMIT",
		"SELECT 1 AS [x;COMMIT]",
		"CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; COMMIT",
		"CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN SELECT CASE WHEN 1 THEN 2 END; END;",
		"PRAGMA table_info(marker)",
		"PRAGMA synchronous=OFF",
		"EXPLAIN COMMIT",
		"SAVEPOINT a; RELEASE a",
		"INSERT OR ROLLBACK INTO marker VALUES (1)",
		"DO $$ BEGIN COMMIT; END $$",
		"SELECT E'\\'; COMMIT; --'",
	} {
		f.Add(s)
	}
	db, err := sql.Open("sqlite", filepath.Join(f.TempDir(), "fuzz.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS marker (id INTEGER PRIMARY KEY); CREATE TABLE t (a)`); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, q string) {
		_ = checkStatements(schema.Postgres, q) // must not panic
		if checkStatements(schema.SQLite, q) != nil {
			return
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `BEGIN; INSERT INTO marker (id) VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		// A recursive query may run for ever: the deadline interrupts
		// it, which rolls back (the marker goes with it: still a pass).
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = conn.ExecContext(qctx, q)
		cancel()
		_, _ = conn.ExecContext(ctx, `ROLLBACK`)
		var n int
		if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM marker`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			_, _ = conn.ExecContext(ctx, `DELETE FROM marker`)
			t.Fatalf("guard allowed %q, and it committed the transaction", q)
		}
	})
}
