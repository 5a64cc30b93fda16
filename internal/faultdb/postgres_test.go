package faultdb_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func openPostgres(t *testing.T, in *faultdb.Injector) *schema.DB {
	t.Helper()
	db, err := schema.Open(context.Background(), pgtest.Database(t), &schema.Options{Driver: in.DriverName()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Write.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// pgCode is err's SQLSTATE if it is the server's *pgconn.PgError.
func pgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// The errors are the server's, with each kind's SQLSTATE and text.
func TestPostgres_Errors(t *testing.T) {
	t.Parallel()
	want := map[faultdb.Kind]string{
		faultdb.PgConnFailure: "08006", faultdb.PgAdminShutdown: "57P01", faultdb.PgDiskFull: "53100",
		faultdb.PgSerialization: "40001", faultdb.PgLockNotAvailable: "55P03",
	}
	in := faultdb.NewPostgres(1)
	db := openPostgres(t, in)
	for _, k := range faultdb.PgKinds {
		in.Set(faultdb.Rule{Name: k.String(), Stmt: faultdb.Contains("INSERT INTO t"), Kind: k, Rate: 1})
		_, err := db.Write.Exec(`INSERT INTO t VALUES (1)`)
		var got, tmpl *pgconn.PgError
		if !errors.As(err, &got) || !errors.As(faultdb.Err(k), &tmpl) || got.Code != want[k] || got.Message != tmpl.Message || got.Severity != "ERROR" {
			t.Errorf("%s: %T %v, want the server's error %s %q", k, err, err, want[k], tmpl.Message)
		}
	}
	in.Set()
	if n := count(t, db.Read); n != 0 {
		t.Errorf("%d rows after failed inserts outside a transaction", n)
	}
}

// A failed statement aborts the transaction: what follows fails with
// 25P02 until ROLLBACK TO a savepoint, and a COMMIT of an aborted
// transaction rolls it back.
func TestPostgres_Aborts(t *testing.T) {
	t.Parallel()
	in := faultdb.NewPostgres(2)
	db := openPostgres(t, in)
	in.Set(faultdb.Rule{Name: "two", Stmt: faultdb.Contains("VALUES (2)"), Kind: faultdb.PgSerialization, Rate: 1})
	ctx := context.Background()

	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, `INSERT INTO t VALUES (1)`)
	mustExec(t, tx, `SAVEPOINT unit`)
	if _, err := tx.Exec(`INSERT INTO t VALUES (2)`); pgCode(err) != "40001" {
		t.Fatalf("faulted insert: %v, want 40001", err)
	}
	if _, err := tx.Exec(`INSERT INTO t VALUES (3)`); pgCode(err) != "25P02" {
		t.Errorf("insert after the fault: %v, want 25P02 (in_failed_sql_transaction)", err)
	}
	mustExec(t, tx, `ROLLBACK TO unit`)
	mustExec(t, tx, `INSERT INTO t VALUES (4)`)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := values(t, db.Read); len(got) != 2 || got[0] != 1 || got[1] != 4 {
		t.Errorf("rows %v, want [1 4]: the savepoint undid the fault and nothing else", got)
	}

	// Without a savepoint, COMMIT rolls the aborted transaction back.
	tx, err = db.Write.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, `INSERT INTO t VALUES (5)`)
	_, _ = tx.Exec(`INSERT INTO t VALUES (2)`)
	if err := tx.Commit(); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Errorf("commit of an aborted transaction: %v, want pgx.ErrTxCommitRollback", err)
	}
	if got := values(t, db.Read); len(got) != 2 {
		t.Errorf("rows %v after the aborted transaction, want [1 4]", got)
	}
}

func TestPostgres_CommitAndBeginFaults(t *testing.T) {
	t.Parallel()
	in := faultdb.NewPostgres(3)
	db := openPostgres(t, in)
	in.Set(faultdb.Rule{Name: "commit", Op: faultdb.Commit, Tx: faultdb.Ran("INSERT INTO t VALUES (1)"), Kind: faultdb.PgSerialization, Rate: 1})
	for _, v := range []string{"1", "2"} {
		tx, err := db.Write.Begin()
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, tx, `INSERT INTO t VALUES (`+v+`)`)
		err = tx.Commit()
		if (v == "1") != (pgCode(err) == "40001") {
			t.Errorf("commit of a transaction inserting %s: %v", v, err)
		}
	}
	if got := values(t, db.Read); len(got) != 1 || got[0] != 2 {
		t.Errorf("rows %v, want only the committed [2]", got)
	}
	in.Set(faultdb.Rule{Name: "begin", Op: faultdb.Begin, Kind: faultdb.PgConnFailure, Rate: 1, Max: 1})
	if _, err := db.Write.Begin(); pgCode(err) != "08006" || !db.Unavailable(err) {
		t.Errorf("begin: %v, want 08006, which the layer takes for an unavailable store", err)
	}
	tx, err := db.Write.Begin()
	if err != nil {
		t.Fatalf("begin after the fault: %v", err)
	}
	mustExec(t, tx, `INSERT INTO t VALUES (3)`)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func mustExec(t *testing.T, tx *sql.Tx, q string) {
	t.Helper()
	if _, err := tx.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func values(t *testing.T, db *sql.DB) []int {
	t.Helper()
	rows, err := db.Query(`SELECT x FROM t ORDER BY x`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var x int
		if err := rows.Scan(&x); err != nil {
			t.Fatal(err)
		}
		out = append(out, x)
	}
	return out
}
