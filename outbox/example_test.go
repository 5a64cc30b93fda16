package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

type InvoiceIn struct {
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

type InvoiceOut struct {
	InvoiceID int64 `json:"invoice_id"`
}

// A tool's own write, the effect it enqueues and its recorded result commit
// together; a retry with the same key replays the result.
func ExampleAddTool() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Write.Exec(`CREATE TABLE invoices (id INTEGER PRIMARY KEY, customer TEXT, cents INTEGER)`); err != nil {
		log.Fatal(err)
	}

	layer, err := outbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	server := layer.NewServer(&mcp.Implementation{Name: "billing", Version: "v1"}, nil)
	outbox.AddTool(layer, server, &mcp.Tool{Name: "send_invoice", Description: "Bill a customer."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in InvoiceIn) (*mcp.CallToolResult, InvoiceOut, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO invoices (customer, cents) VALUES ($1, $2)`, in.Customer, in.Cents)
			if err != nil {
				return nil, InvoiceOut{}, err
			}
			id, _ := res.LastInsertId()
			// Delivered by the dispatcher after the commit, with a stable
			// Idempotency-Key; gone if the call does not commit.
			_, err = tx.Enqueue(ctx, outbox.Effect{
				Destination: "mailer", Method: "POST", Path: "/v1/send",
				Body: fmt.Appendf(nil, `{"invoice":%d}`, id),
			})
			return nil, InvoiceOut{InvoiceID: id}, err
		}, nil)

	// A client; stdio servers use mcpstdio.NewTransport(&mcp.StdioTransport{}, nil).
	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, mcpstdio.NewTransport(st, nil), nil); err != nil {
		log.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	for range 2 { // the second call is a retry, for example after a timeout
		res, err := client.CallTool(ctx, &mcp.CallToolParams{
			Name:      "send_invoice",
			Arguments: InvoiceIn{Customer: "acme", Cents: 4200},
			Meta:      mcp.Meta{"idempotencyKey": "invoice-acme-2026-12"},
		})
		if err != nil {
			log.Fatal(err)
		}
		call := res.Meta[outbox.MetaKeyCall].(map[string]any)
		fmt.Printf("result %v, replayed: %v\n", res.StructuredContent, call["replayed"])
	}
	var invoices, effects int
	db.Read.QueryRow(`SELECT count(*) FROM invoices`).Scan(&invoices)
	db.Read.QueryRow(`SELECT count(*) FROM effects`).Scan(&effects)
	fmt.Printf("invoices: %d, effects: %d\n", invoices, effects)
	// Output:
	// result map[invoice_id:1], replayed: false
	// result map[invoice_id:1], replayed: true
	// invoices: 1, effects: 1
}
