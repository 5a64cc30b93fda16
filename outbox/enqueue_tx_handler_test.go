package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// EnqueueTx called from inside a tool handler is refused at once: on
// SQLite it would wait forever for the writer the handler holds, on
// PostgreSQL its effect would commit apart from the call.
func TestLayer_EnqueueTxInsideHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	got := make(chan error, 1)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "nested", Description: "EnqueueTx in a handler."},
		func(ctx context.Context, _ outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			// A transaction of the read pool: the refusal comes before
			// any statement, so it is never used.
			tx, err := b.db.Read.BeginTx(context.WithoutCancel(ctx), nil)
			if err != nil {
				return nil, nil, err
			}
			defer tx.Rollback()
			_, err = b.layer.EnqueueTx(ctx, tx, outbox.Effect{Destination: "payments", Path: "/x"})
			got <- err
			return nil, nil, err
		}, nil)
	if res := call(t, b.session, "nested", "nested-1", map[string]any{}); !res.IsError {
		t.Fatalf("want the call to fail, got %s", text(res))
	}
	if err := <-got; err == nil || !strings.Contains(err.Error(), "use the handler's Tx.Enqueue") {
		t.Errorf("EnqueueTx inside a handler: %v; want a refusal pointing to Tx.Enqueue", err)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects enqueued; want none", n)
	}
}

// Runner.Notify after EnqueueTx's commit wakes the dispatcher: with polling
// an hour apart, only the Notify can have delivered the effect.
func TestRunner_NotifyAfterEnqueueTx(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	fake := downstream.Start(t, nil)
	opts := payments(fake)
	opts.PollInterval = time.Hour
	r := start(t, b, &outbox.StartOptions{Dispatcher: opts})
	ctx := context.Background()
	// A call's effect, which its commit wakes the dispatcher for: once it
	// is delivered, the dispatcher waits for the next wake-up or its poll
	// an hour later.
	if res := callCharge(t, b.session, "marker", 1); res.IsError {
		t.Fatal(text(res))
	}
	pollUntil(t, "the call's effect delivered", func() bool {
		return count(t, b.db.Read, `SELECT count(*) FROM effects WHERE state = 'delivered'`) == 1
	})
	tx, err := b.db.Write.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.layer.EnqueueTx(ctx, tx, outbox.Effect{Destination: "payments", Path: "/v1/charges", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r.Notify()
	pollUntil(t, "the effect delivered after Notify", func() bool {
		return count(t, b.db.Read, `SELECT count(*) FROM effects WHERE state = 'delivered'`) == 2
	})
}
