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
// statement runs. QueryRowContext, whose error only Scan reports, tells it
// too: an INSERT … RETURNING with '?' got the bare error once.
func TestTx_QuestionMarkPlaceholders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(context.Context, outbox.Tx) error
	}{
		{"exec", func(ctx context.Context, tx outbox.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (?, ?, 0)`, 1, "usd")
			return err
		}},
		{"query_row", func(ctx context.Context, tx outbox.Tx) error {
			var id int64
			return tx.QueryRowContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (?, ?, 0) RETURNING id`, 1, "usd").Scan(&id)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, nil)
			got := make(chan error, 1)
			outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "qmark", Description: "Inserts with ? placeholders."},
				func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
					err := tc.run(ctx, tx)
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
			if err == nil || !strings.Contains(err.Error(), "write $1, $2") || !strings.Contains(err.Error(), "42601") {
				t.Errorf("on PostgreSQL: %v; want PostgreSQL's error with the hint about $N placeholders", err)
			}
		})
	}
}
