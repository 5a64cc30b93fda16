package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// A write in a readOnlyHint tool fails at its statement, with an error
// that says why, and the call answers an error whatever the handler
// returns: the layer never commits that transaction, so the write would
// have vanished while the handler reported it done. Reads still work, and
// the read connection is not left read-only for whoever takes it next.
func TestTx_ReadOnlyToolRefusesWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	writes := []struct {
		name string
		run  func(ctx context.Context, tx outbox.Tx) error
	}{
		{"ExecContext", func(ctx context.Context, tx outbox.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0)`)
			return err
		}},
		{"QueryRowContext", func(ctx context.Context, tx outbox.Tx) error {
			var id int64
			return tx.QueryRowContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (2, 'usd', 0) RETURNING id`).Scan(&id)
		}},
		{"UPDATE", func(ctx context.Context, tx outbox.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE charges SET amount = amount + 1`)
			return err
		}},
		{"CREATE TABLE", func(ctx context.Context, tx outbox.Tx) error {
			_, err := tx.ExecContext(ctx, `CREATE TABLE scratch (x INTEGER)`)
			return err
		}},
		{"Enqueue", func(ctx context.Context, tx outbox.Tx) error {
			// An effect that would never be sent, like a write.
			_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "payments", Path: "/v1/charges", Body: []byte(`{}`)})
			return err
		}},
	}
	type in struct{ N int }
	got := make(chan error, 1)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "lookup", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, struct{}, error) {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM charges`).Scan(&n); err != nil {
				return nil, struct{}{}, err
			}
			if in.N < 0 {
				return nil, struct{}{}, nil // a read alone
			}
			got <- writes[in.N].run(ctx, tx)
			// The worst handler: it ignores the error and answers success.
			return nil, struct{}{}, nil
		}, nil)
	if res := callCharge(t, b.session, "before", 5); res.IsError {
		t.Fatal(text(res))
	}
	for i, w := range writes {
		res := call(t, b.session, "lookup", "", in{N: i})
		err := <-got
		if !errors.Is(err, outbox.ErrReadOnly) || !strings.Contains(err.Error(), "readOnlyHint") || !strings.Contains(err.Error(), `"lookup"`) {
			t.Errorf("%s: the write's error = %v; want ErrReadOnly naming the tool and readOnlyHint", w.name, err)
		}
		if !res.IsError || errorCode(res) != "not_recorded" || !strings.Contains(text(res), "readOnlyHint") ||
			strings.Contains(text(res), "readonly database") || strings.Contains(text(res), "SQLSTATE") {
			t.Errorf("%s: the call answered %v %s; want not_recorded in the layer's words (its write was not kept)", w.name, res.Meta, text(res))
		}
	}
	if n := charges(t, b); n != 1 {
		t.Errorf("charges = %d, want 1", n)
	}
	// Every read connection is writable again: a read-only tool's reads
	// still run, and a write through the read pool (outside any tool) is
	// not refused by a query_only left behind.
	for range 8 {
		if res := call(t, b.session, "lookup", "", in{N: -1}); res.IsError {
			t.Fatalf("read-only call: %s", text(res))
		}
	}
	conns := make([]*sql.Conn, 0, 4)
	for range cap(conns) {
		c, err := b.db.Read.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.ExecContext(context.Background(), `CREATE TEMP TABLE IF NOT EXISTS probe (x INTEGER)`); err != nil {
			t.Errorf("read pool connection after read-only calls: %v", err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
}

// On PostgreSQL an error aborts the transaction: a handler that ignores a
// failed statement meets 25P02 at its next one, which says nothing of the
// first. The next statement's error names the first one; the handler that
// then answers success is told the call did not commit, in the layer's
// words with the call id, never the driver's; the log has the first
// error's SQLSTATE and statement; nothing is recorded, and a retry runs.
func TestTx_FirstErrorWins(t *testing.T) {
	postgresOnly(t)
	t.Parallel()
	logs := &outboxtest.LogBuffer{}
	b := setup(t, &outbox.Options{Logger: logs.Logger()}, nil)
	var runs atomic.Int32
	next := make(chan error, 2)
	type in struct{ Fail bool }
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "sloppy"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, struct{}, error) {
			runs.Add(1)
			if in.Fail {
				// Ignored: division by zero, SQLSTATE 22012.
				_, _ = tx.ExecContext(ctx, `SELECT 1 / (SELECT count(*) FROM charges WHERE amount = -42)`)
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (7, 'usd', 0)`)
			if in.Fail {
				next <- err
				// An effect after the aborted transaction would never be
				// written: Enqueue says so, naming the first error.
				_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "payments", Path: "/v1/charges", Body: []byte(`{}`)})
				next <- err
			}
			return nil, struct{}{}, nil // success, whatever happened
		}, nil)

	res := call(t, b.session, "sloppy", "first-error", in{Fail: true})
	err := <-next
	if err == nil || !strings.Contains(err.Error(), "25P02") || !strings.Contains(err.Error(), "22012") ||
		!strings.Contains(err.Error(), "SELECT 1 / (SELECT count(*)") {
		t.Errorf("statement after the failed one: %v; want 25P02 naming the first error (22012) and its statement", err)
	}
	if err := <-next; err == nil || !strings.Contains(err.Error(), "aborted") || !strings.Contains(err.Error(), "22012") {
		t.Errorf("Enqueue after the failed statement: %v; want an error naming the first one (22012)", err)
	}
	if !res.IsError || errorCode(res) != "not_recorded" || !strings.Contains(text(res), "call_") {
		t.Fatalf("answer: %v %s; want not_recorded naming the call id", res.Meta, text(res))
	}
	for _, driver := range []string{"SQLSTATE", "ERROR:", "current transaction is aborted", "division by zero", "record outcome"} {
		if strings.Contains(text(res), driver) {
			t.Errorf("answer carries the driver's text %q: %s", driver, text(res))
		}
	}
	recs := logs.Records(t, "commit call")
	if len(recs) != 1 {
		t.Fatalf("commit call logged %d times, want 1:\n%s", len(recs), logs.String())
	}
	logged, _ := recs[0]["error"].(string)
	if !strings.Contains(logged, "22012") || !strings.Contains(logged, "SELECT 1 / (SELECT count(*)") {
		t.Errorf("logged error %q; want the first error's SQLSTATE (22012) and statement", logged)
	}
	if id, _ := recs[0]["call_id"].(string); id == "" || !strings.Contains(text(res), id) {
		t.Errorf("the answer does not name the logged call id %q: %s", id, text(res))
	}
	if n := charges(t, b); n != 0 {
		t.Errorf("charges = %d, want 0", n)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = 'first-error'`); n != 0 {
		t.Errorf("calls recorded = %d, want 0", n)
	}
	if res := call(t, b.session, "sloppy", "first-error", in{}); res.IsError || callMeta(res)["replayed"] != false {
		t.Fatalf("retry: %v %s", res.Meta, text(res))
	}
	if runs.Load() != 2 || charges(t, b) != 1 {
		t.Errorf("runs = %d, charges = %d; want 2 and 1", runs.Load(), charges(t, b))
	}

	// A tool whose calls are not recorded (idempotentHint) commits its
	// work on success: the same holds there.
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "sloppy_idem", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, struct{}, error) {
			_, _ = tx.ExecContext(ctx, `SELECT 1 / (SELECT count(*) FROM charges WHERE amount = -43)`)
			_, _ = tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (8, 'usd', 0)`)
			return nil, struct{}{}, nil
		}, nil)
	res = call(t, b.session, "sloppy_idem", "", in{})
	if !res.IsError || errorCode(res) != "not_recorded" || strings.Contains(text(res), "SQLSTATE") {
		t.Errorf("unrecorded tool's answer: %v %s; want not_recorded in the layer's words", res.Meta, text(res))
	}
	recs = logs.Records(t, "commit call")
	if logged, _ := recs[len(recs)-1]["error"].(string); !strings.Contains(logged, "amount = -43") || !strings.Contains(logged, "22012") {
		t.Errorf("unrecorded tool's logged error %q; want the first statement and its SQLSTATE", logged)
	}
	if n := charges(t, b); n != 1 {
		t.Errorf("charges = %d, want 1", n)
	}
}

// With ShowErrors, a handler's plain error reaches the client as a tool
// error, and is still not recorded: a retry runs the handler again.
// Without it the client gets the generic answer; and never, with it or
// not, an error that carries the database's text.
func TestShowErrors(t *testing.T) {
	t.Parallel()
	type in struct {
		Currency string
		Dup      bool // fail a statement, and return its error wrapped
		BadPath  bool // return Enqueue's error wrapped
	}
	handler := func(runs *atomic.Int32) outbox.HandlerFor[in, struct{}] {
		return func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, struct{}, error) {
			runs.Add(1)
			if in.Dup {
				_, err := tx.ExecContext(ctx, `INSERT INTO no_such_table (x) VALUES (1)`)
				return nil, struct{}{}, fmt.Errorf("store the invoice: %w", err)
			}
			if in.BadPath {
				// The server's mistake, not the model's: its text is not
				// for the client.
				_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "payments", Path: "v1/no-slash"})
				return nil, struct{}{}, fmt.Errorf("mail the invoice: %w", err)
			}
			if in.Currency != "usd" {
				return nil, struct{}{}, fmt.Errorf("unsupported currency %q", in.Currency)
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0)`)
			return nil, struct{}{}, err
		}
	}
	for _, tc := range []struct {
		name  string
		opts  *outbox.Options
		topts *outbox.ToolOptions
		shown bool
	}{
		{"default", nil, nil, false},
		{"layer", &outbox.Options{ShowErrors: true}, nil, true},
		{"tool", nil, &outbox.ToolOptions{ShowErrors: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &outboxtest.LogBuffer{}
			opts := outbox.Options{}
			if tc.opts != nil {
				opts = *tc.opts
			}
			opts.Logger = logs.Logger()
			b := setup(t, &opts, nil)
			var runs atomic.Int32
			outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "invoice"}, handler(&runs), tc.topts)

			res := call(t, b.session, "invoice", "eur", in{Currency: "eur"})
			shown := strings.Contains(text(res), `unsupported currency "eur"`)
			if !res.IsError || errorCode(res) != "not_recorded" || shown != tc.shown {
				t.Errorf("validation error: %v %s; want not_recorded, its text shown %v", res.Meta, text(res), tc.shown)
			}
			if again := call(t, b.session, "invoice", "eur", in{Currency: "eur"}); runs.Load() != 2 || callMeta(again)["replayed"] == true {
				t.Errorf("retry: runs = %d, %v; want the handler run again", runs.Load(), again.Meta)
			}
			// An error shown to the model is an answer, not a fault: it is
			// logged at INFO, not at ERROR where alerts look.
			shownLogged := len(logs.Records(t, "tool handler's error shown to the client; nothing recorded"))
			failedLogged := len(logs.Records(t, "tool handler failed; nothing recorded"))
			if tc.shown && (shownLogged != 2 || failedLogged != 0) || !tc.shown && (shownLogged != 0 || failedLogged != 2) {
				t.Errorf("logged shown %d, failed %d times; want the two validation errors logged as %s",
					shownLogged, failedLogged, map[bool]string{true: "shown", false: "failed"}[tc.shown])
			}

			res = call(t, b.session, "invoice", "bad-path", in{Currency: "usd", BadPath: true})
			if !res.IsError || errorCode(res) != "not_recorded" || strings.Contains(text(res), "no-slash") ||
				strings.Contains(text(res), "mail the invoice") {
				t.Errorf("a wrapped Enqueue error: %v %s; want the generic answer", res.Meta, text(res))
			}

			res = call(t, b.session, "invoice", "dup", in{Currency: "usd", Dup: true})
			if !res.IsError || errorCode(res) != "not_recorded" || strings.Contains(text(res), "no_such_table") ||
				strings.Contains(text(res), "store the invoice") || !strings.Contains(text(res), "call id") {
				t.Errorf("a wrapped database error: %v %s; want the generic answer", res.Meta, text(res))
			}
			if n := count(t, b.db.Read, `SELECT count(*) FROM calls`); n != 0 {
				t.Errorf("calls recorded = %d, want 0", n)
			}
		})
	}
}
