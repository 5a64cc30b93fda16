package outbox_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
)

// A tool that asks the client for confirmation (SEP-2322 multi round-trip)
// before charging: the first run's work and the continuation are one
// logical call, whichever side drives the retry.
func TestCall_MultiRoundTrip(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			l, _ := outbox.New(db, nil)
			s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
			runs := 0
			outbox.AddTool(l, s, &mcp.Tool{Name: "confirm_charge"}, func(ctx context.Context, tx outbox.Tx, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
				runs++
				// Work done before asking must not survive into the commit.
				if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0)`); err != nil {
					return nil, struct{}{}, err
				}
				if len(req.Params.InputResponses) == 0 {
					return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
						"ok": &mcp.ElicitParams{Message: "Charge 1 cent?", RequestedSchema: map[string]any{"type": "object"}},
					}}, struct{}{}, nil
				}
				return nil, struct{}{}, nil
			}, nil)

			st, ct := mcp.NewInMemoryTransports()
			ss, err := s.Connect(context.Background(), mcpstdio.NewTransport(st, nil), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ss.Close()
			client := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "v0"}, &mcp.ClientOptions{
				ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
				},
			})
			cs, err := client.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()

			res := call(t, cs, "confirm_charge", "mrtr-1", map[string]any{})
			if res.IsError || callMeta(res)["state"] != "completed" {
				t.Fatalf("result: %v %s", res.Meta, text(res))
			}
			if runs != 2 {
				t.Errorf("handler runs = %d, want 2 (ask, then act)", runs)
			}
			if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
			if again := call(t, cs, "confirm_charge", "mrtr-1", map[string]any{}); callMeta(again)["replayed"] != true || runs != 2 {
				t.Errorf("retry: %v, runs %d", again.Meta, runs)
			}
		})
	}
}
