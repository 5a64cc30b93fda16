package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"path/filepath"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Once Layer.Start runs a dispatcher, an effect to a destination it does
// not deliver to is refused where it is enqueued, with nothing enqueued,
// instead of waiting forever for a dispatcher that never comes.
func ExampleErrUnknownDestination() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
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
	server := layer.NewServer(&mcp.Implementation{Name: "shop", Version: "v1"}, nil)
	outbox.AddTool(layer, server, &mcp.Tool{Name: "remind", Description: "Mail a reminder."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "mailr", Path: "/v1/send"}) // a typo
			fmt.Println(err)
			fmt.Println("unknown destination:", errors.Is(err, outbox.ErrUnknownDestination))
			return nil, nil, err
		}, nil)

	mailerURL, err := url.Parse("http://127.0.0.1:9090")
	if err != nil {
		log.Fatal(err)
	}
	running, err := layer.Start(ctx, &outbox.StartOptions{Dispatcher: &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "mailer", URL: mailerURL}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := running.Stop(ctx); err != nil {
			log.Fatal(err)
		}
	}()

	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, mcpstdio.NewTransport(st, nil), nil); err != nil {
		log.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	res, err := client.CallTool(ctx, &mcp.CallToolParams{Name: "remind", Arguments: map[string]any{}})
	if err != nil {
		log.Fatal(err)
	}
	var effects int
	if err := db.Read.QueryRowContext(ctx, `SELECT count(*) FROM effects`).Scan(&effects); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("tool error: %v, effects: %d\n", res.IsError, effects)
	// Output:
	// outbox: unknown destination "mailr": this process's dispatcher delivers to "mailer"; nothing was enqueued
	// unknown destination: true
	// tool error: true, effects: 0
}
