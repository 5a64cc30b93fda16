package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// A handler that runs a refused statement gets an error naming it, and
// the call cannot commit whatever the handler returns: the row it wrote
// before is gone, the call is not recorded, and a retry runs it. Every
// form, through each of Tx's statement methods, on the store under test.
func TestTx_RefusesTransactionControl(t *testing.T) {
	t.Parallel()
	forms := []struct{ stmt, named string }{
		{"BEGIN", "BEGIN"},
		{"BEGIN IMMEDIATE", "BEGIN"},
		{"START TRANSACTION", "START"},
		{"COMMIT", "COMMIT"},
		{"end", "end"},
		{"ROLLBACK", "ROLLBACK"},
		{"ROLLBACK TO unit", "ROLLBACK"},
		{"ABORT", "ABORT"},
		{"SAVEPOINT s", "SAVEPOINT"},
		{"RELEASE unit", "RELEASE"},
		{"ATTACH DATABASE 'other.db' AS other", "ATTACH"},
		{"DETACH other", "DETACH"},
		{"VACUUM", "VACUUM"},
		{"PREPARE TRANSACTION 'x'", "PREPARE"},
		{"COMMIT PREPARED 'x'", "COMMIT"},
		{"ROLLBACK PREPARED 'x'", "ROLLBACK"},
		{"SET synchronous_commit = off", "SET"},
		{"SET LOCAL synchronous_commit = off", "SET"},
		{"RESET ALL", "RESET"},
		{"DISCARD ALL", "DISCARD"},
		{"LISTEN x", "LISTEN"},
		{"UNLISTEN x", "UNLISTEN"},
		{"DEALLOCATE ALL", "DEALLOCATE"},
		{"PRAGMA synchronous = OFF", "PRAGMA"},
		{"PRAGMA main.journal_mode = DELETE", "PRAGMA"},
		{"PRAGMA wal_checkpoint(TRUNCATE)", "PRAGMA"},
		{"INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0); COMMIT", "COMMIT"},
		{"/* first */ COMMIT", "COMMIT"},
		{"-- first\nCOMMIT", "COMMIT"},
		{"\n ;; commit;", "commit"},
	}
	if onPostgres() {
		forms = append(forms, struct{ stmt, named string }{"SELECT set_config('synchronous_commit', 'off', true)", "set_config"})
	}
	methods := []struct {
		name string
		run  func(ctx context.Context, tx outbox.Tx, q string) error
	}{
		{"ExecContext", func(ctx context.Context, tx outbox.Tx, q string) error {
			_, err := tx.ExecContext(ctx, q)
			return err
		}},
		{"QueryContext", func(ctx context.Context, tx outbox.Tx, q string) error {
			rows, err := tx.QueryContext(ctx, q)
			if err == nil {
				rows.Close()
			}
			return err
		}},
		{"QueryRowContext", func(ctx context.Context, tx outbox.Tx, q string) error {
			var x any
			return tx.QueryRowContext(ctx, q).Scan(&x)
		}},
		{"PrepareContext", func(ctx context.Context, tx outbox.Tx, q string) error {
			st, err := tx.PrepareContext(ctx, q)
			if err == nil {
				st.Close()
			}
			return err
		}},
	}

	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	type in struct{ N int }
	var (
		mu      sync.Mutex
		refuse  = map[int]func(context.Context, outbox.Tx) error{} // N: the refused statement of N's first attempt
		refused = map[int]error{}                                  // what it returned
		after   = map[int]error{}                                  // what a statement after it returned
	)
	outbox.AddTool(l, s, &mcp.Tool{Name: "refuse"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, struct{}, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, in.N); err != nil {
			return nil, struct{}{}, err
		}
		mu.Lock()
		run := refuse[in.N]
		delete(refuse, in.N)
		mu.Unlock()
		if run == nil {
			return nil, struct{}{}, nil
		}
		err := run(ctx, tx)
		_, err2 := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, -in.N)
		mu.Lock()
		refused[in.N], after[in.N] = err, err2
		mu.Unlock()
		// The worst handler: it ignores the refusal and answers success.
		return nil, struct{}{}, nil
	}, nil)
	cs := connect(t, s)

	n := 0
	for _, f := range forms {
		for _, m := range methods {
			n++
			t.Run(fmt.Sprintf("%s/%s", strings.TrimSpace(strings.ReplaceAll(f.stmt, "\n", " ")), m.name), func(t *testing.T) {
				n := n
				mu.Lock()
				refuse[n] = func(ctx context.Context, tx outbox.Tx) error { return m.run(ctx, tx, f.stmt) }
				mu.Unlock()
				key := fmt.Sprintf("refuse-%d", n)
				res := call(t, cs, "refuse", key, in{n})
				mu.Lock()
				err, err2 := refused[n], after[n]
				mu.Unlock()
				if !errors.Is(err, outbox.ErrStatementRefused) || !strings.Contains(err.Error(), f.named) {
					t.Fatalf("the handler got %v, want a refusal naming %q", err, f.named)
				}
				if err2 == nil {
					t.Error("a statement after the refusal ran")
				}
				if !res.IsError {
					t.Fatalf("the call answered success: %s", text(res))
				}
				if got := count(t, db.Read, `SELECT count(*) FROM charges WHERE amount IN ($1, $2)`, n, -n); got != 0 {
					t.Fatalf("%d rows of the refused call committed", got)
				}
				if got := count(t, db.Read, `SELECT count(*) FROM calls WHERE key = $1`, key); got != 0 {
					t.Fatalf("the refused call left %d rows in calls, want none", got)
				}
				res = call(t, cs, "refuse", key, in{n})
				if res.IsError {
					t.Fatalf("the retry failed: %s", text(res))
				}
				if got := count(t, db.Read, `SELECT count(*) FROM charges WHERE amount = $1`, n); got != 1 {
					t.Fatalf("the retry left %d rows, want 1", got)
				}
			})
		}
	}
}

// A refused QueryRowContext still returns a usable *sql.Row, whose Err and
// Scan report the refusal.
func TestTx_RefusedRow(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	var rowErr, scanErr error
	outbox.AddTool(l, s, &mcp.Tool{Name: "row"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
		row := tx.QueryRowContext(ctx, `COMMIT`)
		var x int
		rowErr, scanErr = row.Err(), row.Scan(&x)
		return nil, struct{}{}, scanErr
	}, nil)
	res := call(t, connect(t, s), "row", "r1", map[string]any{})
	if !errors.Is(rowErr, outbox.ErrStatementRefused) || !errors.Is(scanErr, outbox.ErrStatementRefused) {
		t.Fatalf("Err() = %v, Scan() = %v, want the refusal", rowErr, scanErr)
	}
	if !res.IsError {
		t.Fatalf("the call answered success: %s", text(res))
	}
}

// SQLite ends the whole transaction when a statement's ON CONFLICT
// ROLLBACK fires; a statement the handler ran after that would run in
// autocommit mode and commit at once, without the call's outcome. The
// attempt notices, runs nothing more, and records nothing.
func TestTx_NothingRunsAfterSQLiteEndedTheTransaction(t *testing.T) {
	t.Parallel()
	sqliteOnly(t, "ON CONFLICT ROLLBACK")
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	var conflict, later error
	outbox.AddTool(l, s, &mcp.Tool{Name: "conflict"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
		var id int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0) RETURNING id`).Scan(&id); err != nil {
			return nil, struct{}{}, err
		}
		_, conflict = tx.ExecContext(ctx, `INSERT OR ROLLBACK INTO charges (id, amount, currency, created_at) VALUES ($1, 2, 'usd', 0)`, id)
		_, later = tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (3, 'usd', 0)`)
		return nil, struct{}{}, nil
	}, nil)
	res := call(t, connect(t, s), "conflict", "c1", map[string]any{})
	if conflict == nil || later == nil {
		t.Fatalf("conflict: %v; statement after it: %v; want both to fail", conflict, later)
	}
	if !res.IsError {
		t.Fatalf("the call answered success: %s", text(res))
	}
	if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 0 {
		t.Fatalf("%d rows committed without the call's outcome", got)
	}
}

// The layer does not see the errors of statements a handler prepared, so
// after one of them ended the shared transaction (ON CONFLICT ROLLBACK),
// the next would run in autocommit mode. SQLite's commit hook refuses any
// commit while a handler holds the writer: nothing is committed, and the
// call, its savepoint gone, is not recorded.
func TestTx_PreparedStatementCannotCommit(t *testing.T) {
	t.Parallel()
	sqliteOnly(t, "ON CONFLICT ROLLBACK and the commit hook")
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	var conflict, later error
	outbox.AddTool(l, s, &mcp.Tool{Name: "prepared"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
		insert, err := tx.PrepareContext(ctx, `INSERT OR ROLLBACK INTO charges (id, amount, currency, created_at) VALUES ($1, $2, 'usd', 0)`)
		if err != nil {
			return nil, struct{}{}, err
		}
		if _, err := insert.ExecContext(ctx, 1, 1); err != nil {
			return nil, struct{}{}, err
		}
		_, conflict = insert.ExecContext(ctx, 1, 2) // ends the transaction
		_, later = insert.ExecContext(ctx, 3, 3)    // would commit at once
		return nil, struct{}{}, nil
	}, nil)
	res := call(t, connect(t, s), "prepared", "p1", map[string]any{})
	if conflict == nil || later == nil {
		t.Fatalf("conflict: %v; statement after it: %v; want both to fail", conflict, later)
	}
	if !res.IsError {
		t.Fatalf("the call answered success: %s", text(res))
	}
	if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 0 {
		t.Fatalf("%d rows committed without the call's outcome", got)
	}
}
