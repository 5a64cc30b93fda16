package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
)

// BenchmarkCharge compares one sequential charge over in-memory transports:
// the bare ledger (no layer; the same handler, statements in autocommit),
// the layer with a new key per call, and a replay of a recorded call.
// synchronous=FULL throughout. Compare the sub-benchmarks of one run.
func BenchmarkCharge(b *testing.B) {
	ctx := context.Background()
	args := map[string]any{"amount": 100}
	b.Run("bare", func(b *testing.B) {
		db := openDB(b)
		s := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
		ledger.RegisterBare(db, s, nil)
		cs := connect(b, s)
		for i := 0; b.Loop(); i++ {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("layer", func(b *testing.B) {
		bd := setup(b, nil, nil)
		for i := 0; b.Loop(); i++ {
			res, err := bd.session.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args,
				Meta: mcp.Meta{"idempotencyKey": fmt.Sprint("k", i)}})
			if err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		bd := setup(b, nil, nil)
		p := &mcp.CallToolParams{Name: "charge", Arguments: args, Meta: mcp.Meta{"idempotencyKey": "same"}}
		if _, err := bd.session.CallTool(ctx, p); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := bd.session.CallTool(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
