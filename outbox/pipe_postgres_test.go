package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// pipedLayer is a layer on PostgreSQL through pgx's own driver, whose
// calls' transactions are pipelined, with a tool that writes a charge
// and then runs what the test gives it.
func pipedLayer(t *testing.T, then func(ctx context.Context, tx outbox.Tx) error) (*schema.DB, *mcp.ClientSession) {
	t.Helper()
	db, err := schema.Open(context.Background(), pgtest.Database(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	mustLedger(t, db)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "piped", Version: "v0"}, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "pay"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in payIn) (*mcp.CallToolResult, struct{}, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, in.Amount); err != nil {
			return nil, struct{}{}, err
		}
		return nil, struct{}{}, then(ctx, tx)
	}, nil)
	return db, connect(t, s)
}

// COMMIT goes out with the outcome, before the outcome's answer is back:
// an outcome whose compare-and-set matches no row must still keep the
// commit from keeping anything. Here the handler itself moves its call's
// row away from its owner, which nothing else can do while the fence
// holds the row.
func TestPostgres_PipedOutcomeThatMissesCommitsNothing(t *testing.T) {
	postgresOnly(t)
	db, cs := pipedLayer(t, func(ctx context.Context, tx outbox.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE calls SET owner = 'elsewhere' WHERE key = 'missed'`)
		return err
	})
	res := call(t, cs, "pay", "missed", payIn{Amount: 7})
	if !res.IsError || !strings.Contains(text(res), outbox.ErrOwnershipLost.Error()) {
		t.Fatalf("got %q, want the ownership lost", text(res))
	}
	if n := payCharges(t, db); n != 0 {
		t.Errorf("%d charges kept by an outcome that missed, want 0", n)
	}
}

// A handler that leaves a row unread, or a statement it prepared open,
// neither hangs its call nor the next call on the connection: the unit
// closes them at its end, as a *sql.Tx would.
func TestPostgres_PipedHandlerLeavesRowsOpen(t *testing.T) {
	postgresOnly(t)
	const unread, prepared = 1, 2
	db, cs := pipedLayer(t, func(ctx context.Context, tx outbox.Tx) error {
		var amount int64
		if err := tx.QueryRowContext(ctx, `SELECT max(amount) FROM charges`).Scan(&amount); err != nil {
			return err
		}
		switch amount {
		case unread:
			_ = tx.QueryRowContext(ctx, `SELECT amount FROM charges`) // never scanned
		case prepared:
			st, err := tx.PrepareContext(ctx, `SELECT count(*) FROM charges WHERE amount = $1`)
			if err != nil {
				return err
			}
			var n int
			return st.QueryRowContext(ctx, amount).Scan(&n) // st never closed
		}
		return nil
	})
	calls := []struct {
		key    string
		amount int64
		sure   bool // the call must commit
	}{{"open-1", unread, false}, {"open-2", prepared, true}, {"open-3", 3, true}, {"open-1", unread, false}, {"open-4", prepared, true}}
	for _, c := range calls {
		res := call(t, cs, "pay", c.key, payIn{Amount: c.amount})
		if res.IsError && c.sure {
			t.Errorf("%s: %s", c.key, text(res))
		}
		// Whether a call that left a row unread commits depends on
		// when the row closes (pgx may drop the connection reading it).
		t.Logf("%s: error %v: %s", c.key, res.IsError, text(res))
		// Charges are deleted so that the next call reads its own.
		if _, err := db.Write.Exec(`DELETE FROM charges WHERE amount <> $1`, c.amount); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE state = 'completed'`); n < 3 {
		t.Errorf("%d calls recorded, want at least 3", n)
	}
}
