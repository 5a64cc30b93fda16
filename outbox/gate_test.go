package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// gate is a test tool whose handler signals when it starts and waits for
// release before its first statement, so tests can act while a call is in
// flight. It writes one row to charges when it goes on.
type gate struct {
	started  chan struct{} // one value per handler start
	release  chan struct{} // closed to let handlers go on
	runs     atomic.Int32
	lastErrs chan error
}

type gateIn struct {
	N int `json:"n"`
}

type gateOut struct {
	ID int64 `json:"id"`
}

func addGate(l *outbox.Layer, s *mcp.Server) *gate {
	return addGateWith(l, s, nil)
}

// addGateWith registers the gate with opts.
func addGateWith(l *outbox.Layer, s *mcp.Server, opts *outbox.ToolOptions) *gate {
	g := &gate{started: make(chan struct{}, 16), release: make(chan struct{}), lastErrs: make(chan error, 16)}
	outbox.AddTool(l, s, &mcp.Tool{Name: "gate", Description: "test tool"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in gateIn) (*mcp.CallToolResult, gateOut, error) {
			g.runs.Add(1)
			g.started <- struct{}{}
			select {
			case <-g.release:
			case <-ctx.Done():
				return nil, gateOut{}, ctx.Err()
			}
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0) RETURNING id`, in.N).Scan(&id)
			if err != nil {
				g.lastErrs <- err
				return nil, gateOut{}, fmt.Errorf("insert: %w", err)
			}
			return nil, gateOut{ID: id}, nil
		}, opts)
	return g
}
