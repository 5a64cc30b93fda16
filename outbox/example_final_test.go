package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

type PayIn struct {
	Cents int64 `json:"cents"`
}

// A business rejection marked Final is the call's outcome: recorded and
// replayed. An unmarked error would be a fault: nothing recorded, and a
// retry would run the handler again.
func ExampleFinal() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	layer, err := outbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	// The reaper and the task runner until Stop, and a dispatcher: with
	// no destinations, as this server enqueues no effects, so that an
	// Enqueue added later without its destination fails at once.
	running, err := layer.Start(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer running.Stop(context.WithoutCancel(ctx)) // before db.Close: defers run last in, first out
	server := layer.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	runs := 0
	outbox.AddTool(layer, server, &mcp.Tool{Name: "pay", Description: "Pay."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in PayIn) (*mcp.CallToolResult, struct{}, error) {
			runs++
			if in.Cents > 10000 {
				return nil, struct{}{}, outbox.Final(errors.New("card declined: over the limit"))
			}
			return nil, struct{}{}, nil
		}, nil)

	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, mcpstdio.NewTransport(st, nil), nil); err != nil {
		log.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	for range 2 {
		res, err := client.CallTool(ctx, &mcp.CallToolParams{
			Name: "pay", Arguments: PayIn{Cents: 50000}, Meta: mcp.Meta{"idempotencyKey": "pay-1"},
		})
		if err != nil {
			log.Fatal(err)
		}
		call := res.Meta[outbox.MetaKeyCall].(map[string]any)
		fmt.Printf("%s (state %s, replayed %v)\n", res.Content[0].(*mcp.TextContent).Text, call["state"], call["replayed"])
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// card declined: over the limit (state failed, replayed false)
	// card declined: over the limit (state failed, replayed true)
	// handler runs: 1
}
