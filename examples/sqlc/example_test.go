package sqlcexample_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/examples/sqlc/sqlite/ticketsqlite"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

type CreateTicketIn struct {
	Title    string `json:"title"`
	Customer string `json:"customer"`
}

type CreateTicketOut struct {
	TicketID int64 `json:"ticket_id"`
}

// A tool handler passes its outbox.Tx to sqlc's generated New: the
// generated queries run in the call's transaction, so the ticket, the
// effect and the recorded result commit together, and a retry replays the
// result without creating a second ticket. (On PostgreSQL, use the package
// sqlc generates for the postgresql engine the same way.)
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ddl, err := os.ReadFile("sqlite/schema.sql") // a migration, in a real server
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.Write.ExecContext(ctx, string(ddl)); err != nil {
		log.Fatal(err)
	}

	layer, err := outbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	server := layer.NewServer(&mcp.Implementation{Name: "helpdesk", Version: "v1"}, nil)
	outbox.AddTool(layer, server, &mcp.Tool{Name: "create_ticket", Description: "Open a support ticket."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in CreateTicketIn) (*mcp.CallToolResult, CreateTicketOut, error) {
			t, err := ticketsqlite.New(tx).CreateTicket(ctx, ticketsqlite.CreateTicketParams{Title: in.Title, Customer: in.Customer})
			if err != nil {
				return nil, CreateTicketOut{}, err
			}
			if _, err := tx.Enqueue(ctx, outbox.Effect{
				Destination: "pager", Path: "/v1/alerts", Body: fmt.Appendf(nil, `{"ticket":%d}`, t.ID),
			}); err != nil {
				return nil, CreateTicketOut{}, err
			}
			return nil, CreateTicketOut{TicketID: t.ID}, nil
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
	for range 2 { // the second call is a retry
		res, err := client.CallTool(ctx, &mcp.CallToolParams{
			Name:      "create_ticket",
			Arguments: CreateTicketIn{Title: "printer on fire", Customer: "acme"},
			Meta:      mcp.Meta{"idempotencyKey": "ticket-acme-1"},
		})
		if err != nil {
			log.Fatal(err)
		}
		out, _ := res.StructuredContent.(map[string]any)
		_, noted := out[outbox.ReplayNoteProperty] // a replay says so, for the model
		delete(out, outbox.ReplayNoteProperty)
		fmt.Println("result:", out, "replay noted:", noted)
	}
	list, err := ticketsqlite.New(db.Read).ListTickets(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	var effects int
	if err := db.Read.QueryRowContext(ctx, `SELECT count(*) FROM effects`).Scan(&effects); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("tickets: %d, effects: %d\n", len(list), effects)
	// Output:
	// result: map[ticket_id:1] replay noted: false
	// result: map[ticket_id:1] replay noted: true
	// tickets: 1, effects: 1
}
