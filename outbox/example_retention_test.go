package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A tool with its own retention: its keys are remembered for an hour
// instead of the layer's 24, and its records kept for a day. call_status
// says until when a retry with the key replays (expiresAt, counted from
// the call's completion); after that, a retry runs the tool again.
func ExampleToolRetention() {
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
	server := layer.NewServer(&mcp.Implementation{Name: "quotes", Version: "v1"}, nil)
	outbox.AddTool(layer, server, &mcp.Tool{Name: "quote", Description: "Quote a price."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "42 EUR"}}}, struct{}{}, nil
		}, &outbox.ToolOptions{Retention: outbox.ToolRetention{Key: time.Hour, Outcome: 24 * time.Hour}})

	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, mcpstdio.NewTransport(st, nil), nil); err != nil {
		log.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	if _, err := client.CallTool(ctx, &mcp.CallToolParams{
		Name: "quote", Arguments: map[string]any{}, Meta: mcp.Meta{"idempotencyKey": "quote-1"},
	}); err != nil {
		log.Fatal(err)
	}
	res, err := client.CallTool(ctx, &mcp.CallToolParams{Name: outbox.StatusToolName, Arguments: map[string]any{"key": "quote-1"}})
	if err != nil {
		log.Fatal(err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var status struct {
		State       string    `json:"state"`
		CompletedAt time.Time `json:"completedAt"`
		ExpiresAt   time.Time `json:"expiresAt"`
	}
	if err := json.Unmarshal(b, &status); err != nil {
		log.Fatal(err)
	}
	fmt.Println(status.State, "; a retry with the key replays for", status.ExpiresAt.Sub(status.CompletedAt))
	// Output:
	// completed ; a retry with the key replays for 1h0m0s
}
