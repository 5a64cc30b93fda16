package sqlcexample_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/examples/sqlc/sqlite/ticketsqlite"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
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
	// The pager API the effect goes to; here a stand-in that passes on
	// what it got.
	paged := make(chan string, 1)
	pager := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		paged <- r.URL.Path + " " + string(body)
	}))
	defer pager.Close()
	pagerURL, err := url.Parse(pager.URL)
	if err != nil {
		log.Fatal(err)
	}
	// Without Start nothing delivers the effects (the layer warns once),
	// and an Enqueue to a mistyped destination is not caught.
	running, err := layer.Start(ctx, &outbox.StartOptions{Dispatcher: &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "pager", URL: pagerURL}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer running.Stop(context.WithoutCancel(ctx)) // before db.Close: defers run last in, first out
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
	fmt.Println("pager got:", <-paged) // the commit woke the dispatcher
	// Output:
	// result: map[ticket_id:1] replay noted: false
	// result: map[ticket_id:1] replay noted: true
	// tickets: 1, effects: 1
	// pager got: /v1/alerts {"ticket":1}
}
