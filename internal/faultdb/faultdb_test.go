package faultdb_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"modernc.org/sqlite"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func openDB(t *testing.T, in *faultdb.Injector) *schema.DB {
	t.Helper()
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "f.db"), &schema.Options{Driver: in.DriverName()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Write.Exec(`CREATE TABLE t (x)`); err != nil {
		t.Fatal(err)
	}
	return db
}

func count(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The errors are SQLite's: the type, code and text of what the real
// driver returns for the real condition.
func TestErrIsSQLites(t *testing.T) {
	t.Parallel()
	want := map[faultdb.Kind]struct {
		code int
		msg  string
	}{
		faultdb.IOErr:    {10, "disk I/O error (10)"},
		faultdb.Busy:     {5, "database is locked (5) (SQLITE_BUSY)"},
		faultdb.Full:     {13, "database or disk is full (13)"},
		faultdb.ReadOnly: {8, "attempt to write a readonly database (8)"},
	}
	for _, k := range faultdb.Kinds {
		var se *sqlite.Error
		if err := faultdb.Err(k); !errors.As(err, &se) || se.Code() != want[k].code || se.Error() != want[k].msg {
			t.Errorf("Err(%s) = %T %v, want *sqlite.Error code %d %q", k, err, err, want[k].code, want[k].msg)
		}
	}

	// The same condition produced again through schema.Open's DSN gives
	// the same error, equal in every respect.
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "r.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Write.Exec(`CREATE TABLE t (x); PRAGMA query_only = 1`); err != nil {
		t.Fatal(err)
	}
	_, real := db.Write.Exec(`INSERT INTO t VALUES (1)`)
	var a, b *sqlite.Error
	if !errors.As(real, &a) || !errors.As(faultdb.Err(faultdb.ReadOnly), &b) || *a != *b {
		t.Errorf("read-only: real %#v, injected %#v", real, faultdb.Err(faultdb.ReadOnly))
	}
}

func TestStatementFaults(t *testing.T) {
	t.Parallel()
	in := faultdb.New(1)
	db := openDB(t, in)
	in.Set(faultdb.Rule{Name: "ins", Stmt: faultdb.Contains("INSERT INTO t"), Kind: faultdb.Full, Rate: 0.5})
	failed := 0
	for i := range 200 {
		_, err := db.Write.Exec(`INSERT INTO t VALUES ($1)`, i)
		if err != nil {
			if err != faultdb.Err(faultdb.Full) {
				t.Fatalf("insert: %v, want the injected SQLITE_FULL itself", err)
			}
			failed++
		}
	}
	if n := count(t, db.Read); n != 200-failed {
		t.Errorf("%d rows after %d failed inserts of 200: a failed statement must change nothing", n, failed)
	}
	if in.Faults("ins") != failed || in.Seen("ins") != 200 || failed < 70 || failed > 130 {
		t.Errorf("faults %d (counted %d) of %d seen, want about half of 200", failed, in.Faults("ins"), in.Seen("ins"))
	}
	// Statements the rule does not pick are left alone.
	if _, err := db.Write.Exec(`UPDATE t SET x = x + 1`); err != nil {
		t.Fatal(err)
	}
	// Prepared statements carry their text to the rule.
	in.Set(faultdb.Rule{Name: "prep", Stmt: faultdb.Contains("DELETE FROM t"), Kind: faultdb.IOErr, Rate: 1, Max: 1})
	st, err := db.Write.Prepare(`DELETE FROM t WHERE x = $1`)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Exec(1); err != faultdb.Err(faultdb.IOErr) {
		t.Errorf("prepared delete: %v, want the injected I/O error", err)
	}
	if _, err := st.Exec(1); err != nil {
		t.Errorf("prepared delete past Max: %v", err)
	}
}

// The same seed fails the same calls.
func TestSeeded(t *testing.T) {
	t.Parallel()
	pattern := func(seed uint64) []bool {
		in := faultdb.New(seed)
		db := openDB(t, in)
		in.Set(faultdb.Rule{Name: "r", Kind: faultdb.Busy, Rate: 0.3})
		var out []bool
		for i := range 50 {
			_, err := db.Write.Exec(`INSERT INTO t VALUES ($1)`, i)
			out = append(out, err != nil)
		}
		return out
	}
	a, b, c := pattern(7), pattern(7), pattern(8)
	same := func(x, y []bool) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) || same(a, c) {
		t.Errorf("seed 7 twice: %v\n%v\nseed 8: %v", a, b, c)
	}
}

func TestCommitAndBeginFaults(t *testing.T) {
	t.Parallel()
	in := faultdb.New(2)
	db := openDB(t, in)
	in.Set(faultdb.Rule{Name: "commit", Op: faultdb.Commit, Tx: faultdb.Ran("INSERT INTO t VALUES (1)"), Kind: faultdb.IOErr, Rate: 1})
	for _, v := range []int{1, 2} {
		tx, err := db.Write.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(fmt.Sprintf(`INSERT INTO t VALUES (%d)`, v)); err != nil {
			t.Fatal(err)
		}
		err = tx.Commit()
		if (v == 1) != (err != nil) {
			t.Errorf("commit of a transaction inserting %d: %v", v, err)
		}
	}
	// The failed commit left nothing, and the connection is usable.
	if n := count(t, db.Write); n != 1 {
		t.Errorf("%d rows, want only the committed one", n)
	}
	in.Set(faultdb.Rule{Name: "begin", Op: faultdb.Begin, Kind: faultdb.Busy, Rate: 1, Max: 1})
	if _, err := db.Write.Begin(); err != faultdb.Err(faultdb.Busy) {
		t.Errorf("begin: %v, want SQLITE_BUSY", err)
	}
	tx, err := db.Write.Begin()
	if err != nil {
		t.Fatalf("begin after the fault: %v", err)
	}
	tx.Rollback()
}

// Rollback: the statement's failure ends the transaction, as SQLite may
// after an I/O error; what follows runs outside it, and COMMIT fails.
func TestRollbackFault(t *testing.T) {
	t.Parallel()
	in := faultdb.New(3)
	db := openDB(t, in)
	in.Set(faultdb.Rule{Stmt: faultdb.Contains("VALUES (2)"), Kind: faultdb.IOErr, Rate: 1, Rollback: true})
	tx, err := db.Write.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`INSERT INTO t VALUES (1)`, `INSERT INTO t VALUES (2)`, `INSERT INTO t VALUES (3)`} {
		_, _ = tx.Exec(q)
	}
	if err := tx.Commit(); err == nil {
		t.Error("commit after the transaction was rolled back: want an error")
	}
	// Row 1 went with the transaction; row 3 ran outside it.
	var got []int
	rows, err := db.Read.Query(`SELECT x FROM t ORDER BY x`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var x int
		rows.Scan(&x)
		got = append(got, x)
	}
	rows.Close()
	if len(got) != 1 || got[0] != 3 {
		t.Errorf("rows %v, want [3]", got)
	}
}
