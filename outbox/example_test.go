package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// InvoiceIn is the tool's arguments; as with mcp.AddTool, the input schema
// is inferred from it.
type InvoiceIn struct {
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

// InvoiceOut is the tool's structured result, and its output schema.
type InvoiceOut struct {
	InvoiceID int64 `json:"invoice_id"`
}

// The invoices table on each store. The tool's SQL below is the same on
// both: $N placeholders, and RETURNING for the id the database assigns
// (PostgreSQL has no LastInsertId).
const (
	createInvoicesSQLite   = `CREATE TABLE IF NOT EXISTS invoices (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, cents BIGINT NOT NULL)`
	createInvoicesPostgres = `CREATE TABLE IF NOT EXISTS invoices (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL, cents BIGINT NOT NULL)`
)

// addSendInvoice registers a side-effecting tool: the invoice row, the mail
// it enqueues and the call's recorded result commit together, or not at all.
func addSendInvoice(layer *outbox.Layer, server *mcp.Server) {
	outbox.AddTool(layer, server, &mcp.Tool{Name: "send_invoice", Description: "Bill a customer and mail the invoice."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in InvoiceIn) (*mcp.CallToolResult, InvoiceOut, error) {
			if in.Customer == "" {
				// A plain error: nothing is recorded, and a retry runs the
				// handler again. With ShowErrors (below) the model reads it.
				return nil, InvoiceOut{}, fmt.Errorf("customer is required, got %q", in.Customer)
			}
			if in.Cents <= 0 {
				// A business rejection: recorded as the call's outcome and
				// replayed to a retry with the same key.
				return nil, InvoiceOut{}, outbox.Final(fmt.Errorf("amount must be positive, got %d cents", in.Cents))
			}
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO invoices (customer, cents) VALUES ($1, $2) RETURNING id`,
				in.Customer, in.Cents).Scan(&id)
			if err != nil {
				// A database error too, but the client gets a generic error
				// naming the call, never the driver's text.
				return nil, InvoiceOut{}, err
			}
			body, err := json.Marshal(map[string]int64{"invoice": id})
			if err != nil {
				return nil, InvoiceOut{}, err
			}
			// Delivered after the commit, with the same Idempotency-Key on
			// every attempt; gone if the call does not commit. A JSON body
			// goes as Content-Type: application/json unless Header names
			// another type.
			if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: "mailer", Path: "/v1/send", Body: body}); err != nil {
				return nil, InvoiceOut{}, err
			}
			return nil, InvoiceOut{InvoiceID: id}, nil
		}, &outbox.ToolOptions{ShowErrors: true})
}

// serve runs the billing server on transport t until ctx ends (a stdio
// server passes mcpstdio.NewTransport(&mcp.StdioTransport{}, nil)), with the
// dispatcher and the reaper beside it, and stops them in order.
func serve(ctx context.Context, db *schema.DB, mailer *url.URL, t mcp.Transport) (err error) {
	layer, err := outbox.New(db, nil)
	if err != nil {
		return err
	}
	server := layer.NewServer(&mcp.Implementation{Name: "billing", Version: "v1"}, nil)
	addSendInvoice(layer, server)

	// The dispatcher, woken by every commit that enqueued effects, and the
	// reaper, which purges what the default retention no longer keeps.
	running, err := layer.Start(ctx, &outbox.StartOptions{Dispatcher: &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "mailer", URL: mailer}},
	}})
	if err != nil {
		return err
	}
	// After serving ends (the calls in flight have finished), before the
	// caller closes the database. Bounded: a task still running after a
	// minute stops, rolls back, and runs again at the next start.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		err = errors.Join(err, running.Stop(sctx))
	}()

	if err := server.Run(ctx, t); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// A tool's own write, the effect it enqueues and its recorded result commit
// together; a retry with the same key replays the result, and the effect
// reaches the mail API once, with its Idempotency-Key.
func ExampleAddTool() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// A postgres:// URL works the same (TestExampleAddToolOnTestStore).
	if err := billTwice(context.Background(), filepath.Join(dir, "app.db"), os.Stdout); err != nil {
		log.Fatal(err)
	}
	// Output:
	// result map[invoice_id:1], replayed: false, noted: false
	// result map[invoice_id:1], replayed: true, noted: true
	// rejected: true, replayed: true
	// invalid: true, says: true
	// the mail API got {"invoice":1} once
	// invoices: 1
}

// billTwice opens target, serves the billing server to an in-memory client
// that calls send_invoice and retries it, then shuts it down.
func billTwice(ctx context.Context, target string, w io.Writer) error {
	db, err := schema.Open(ctx, target, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Write.ExecContext(ctx, db.Pick(createInvoicesSQLite, createInvoicesPostgres)); err != nil {
		return fmt.Errorf("create invoices: %w", err)
	}
	mails := make(chan string, 4)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			body = fmt.Appendf(body, " with Content-Type %q", ct) // not the mail the Output wants
		}
		mails <- string(body)
	}))
	defer api.Close()
	mailer, err := url.Parse(api.URL)
	if err != nil {
		return err
	}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	st, ct := mcp.NewInMemoryTransports()
	served := make(chan error, 1)
	go func() { served <- serve(ctx, db, mailer, mcpstdio.NewTransport(st, nil)) }()
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		stop()
		return errors.Join(err, <-served)
	}
	call := func(key string, cents int64) (*mcp.CallToolResult, bool, error) {
		res, err := client.CallTool(ctx, &mcp.CallToolParams{
			Name:      "send_invoice",
			Arguments: InvoiceIn{Customer: "acme", Cents: cents},
			Meta:      mcp.Meta{"idempotencyKey": key},
		})
		if err != nil {
			return nil, false, err
		}
		meta, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
		replayed, _ := meta["replayed"].(bool)
		return res, replayed, nil
	}
	for range 2 { // the second call is a retry, for example after a timeout
		res, replayed, err := call("invoice-acme-2026-12", 4200)
		if err != nil {
			return err
		}
		// A replay says so in its structured content too, which is all
		// that some clients show the model.
		out, _ := res.StructuredContent.(map[string]any)
		note, _ := out[outbox.ReplayNoteProperty].(string)
		delete(out, outbox.ReplayNoteProperty)
		fmt.Fprintf(w, "result %v, replayed: %v, noted: %v\n", out, replayed, strings.HasPrefix(note, "[mcp-outbox] Replayed"))
	}
	var res *mcp.CallToolResult
	var replayed bool
	for range 2 {
		if res, replayed, err = call("invoice-zero", 0); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "rejected: %v, replayed: %v\n", res.IsError, replayed)
	invalid, err := client.CallTool(ctx, &mcp.CallToolParams{Name: "send_invoice", Arguments: InvoiceIn{Cents: 100},
		Meta: mcp.Meta{"idempotencyKey": "invoice-nobody"}})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "invalid: %v, says: %v\n", invalid.IsError,
		strings.HasPrefix(invalid.Content[0].(*mcp.TextContent).Text, `customer is required, got ""`))
	select {
	case body := <-mails:
		fmt.Fprintf(w, "the mail API got %s once\n", body)
	case <-time.After(30 * time.Second):
		return errors.New("no mail within 30s")
	}

	stop() // as a signal would: serving ends, then the dispatcher and the reaper
	if err := <-served; err != nil {
		return err
	}
	client.Close()
	if len(mails) != 0 {
		return fmt.Errorf("the mail API got %d more mails", len(mails))
	}
	var invoices int
	if err := db.Read.QueryRowContext(context.Background(), `SELECT count(*) FROM invoices`).Scan(&invoices); err != nil {
		return err
	}
	fmt.Fprintf(w, "invoices: %d\n", invoices)
	return nil
}
