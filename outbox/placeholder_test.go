package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// A handler written with SQLite's '?' placeholders is told, on PostgreSQL,
// what PostgreSQL's bare syntax error does not say; on SQLite the same
// statement runs.
func TestTx_QuestionMarkPlaceholders(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	got := make(chan error, 1)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "qmark", Description: "Inserts with ? placeholders."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (?, ?, 0)`, 1, "usd")
			got <- err
			return nil, nil, err
		}, nil)
	call(t, b.session, "qmark", "qmark-1", map[string]any{})
	err := <-got
	if !onPostgres() {
		if err != nil {
			t.Fatalf("on SQLite: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "write $1, $2") {
		t.Errorf("on PostgreSQL: %v; want the hint about $N placeholders", err)
	}
}

// The same for QueryRowContext, whose error only Scan reports: an INSERT
// … RETURNING written with '?' gets the hint too.
func TestTx_QuestionMarkPlaceholdersQueryRow(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	got := make(chan error, 1)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "qmark_row", Description: "Inserts with ? placeholders, RETURNING."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (?, ?, 0) RETURNING id`, 1, "usd").Scan(&id)
			got <- err
			return nil, nil, err
		}, nil)
	call(t, b.session, "qmark_row", "qmark-row-1", map[string]any{})
	err := <-got
	if !onPostgres() {
		if err != nil {
			t.Fatalf("on SQLite: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "write $1, $2") || !strings.Contains(err.Error(), "42601") {
		t.Errorf("on PostgreSQL: %v; want PostgreSQL's error with the hint about $N placeholders", err)
	}
}
