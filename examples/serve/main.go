// Command serve is `mcp-outbox serve` from public packages: a recorded tool, dispatcher,
// reaper, hardened stdio, or HTTP with tokens, admin API, page, health, metrics.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/go-chi/chi/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

type invoiceIn struct{ Customer string }
type invoiceOut struct{ InvoiceID int64 }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	if stop(); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	dbPath := fs.String("db", "invoices.db", "SQLite database file")
	httpAddr := fs.String("http", "", "serve Streamable HTTP at ADDR instead of stdio")
	tokens := fs.String("tokens", "", "file of 'PRINCIPAL SHA256HEX' lines: require bearer tokens on /mcp")
	mailer := fs.String("mailer", "127.0.0.1:9090", "HOST:PORT of the mail API the effects go to")
	_ = fs.Parse(args) // ExitOnError: never returns an error
	db, err := schema.Open(ctx, *dbPath, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err = db.Write.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS invoices (id INTEGER PRIMARY KEY, customer TEXT)`); err != nil {
		return err
	}
	metrics, m := operator.NewMetrics(db)
	layer, err := outbox.New(db, &outbox.Options{Metrics: m})
	if err != nil {
		return err
	}
	server := layer.NewServer(&mcp.Implementation{Name: "invoices", Version: "v1"}, nil)
	outbox.AddTool(layer, server, &mcp.Tool{Name: "send_invoice", Description: "Bill a customer and mail the invoice."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in invoiceIn) (*mcp.CallToolResult, invoiceOut, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO invoices (customer) VALUES (?)`, in.Customer)
			if err != nil {
				return nil, invoiceOut{}, err
			}
			id, _ := res.LastInsertId()
			_, err = tx.Enqueue(ctx, outbox.Effect{Destination: "mailer", Method: "POST", Path: "/v1/send", Body: fmt.Appendf(nil, `{"invoice":%d}`, id)})
			return nil, invoiceOut{InvoiceID: id}, err
		}, nil)
	mailerURL := &url.URL{Scheme: "http", Host: *mailer}
	d, err := outbox.NewDispatcher(db, &outbox.DispatcherOptions{Destinations: []outbox.Destination{{Name: "mailer", URL: mailerURL}}, Metrics: m})
	if err != nil {
		return err
	}
	layer.OnEnqueue(d.Notify)
	var wg sync.WaitGroup // both stop with ctx, before the database closes
	defer wg.Wait()
	wg.Go(func() { d.Run(ctx) })
	wg.Go(func() { outbox.RunReaper(ctx, db, outbox.Retention{}, outbox.DefaultReapInterval, nil) })
	if *httpAddr == "" {
		return server.Run(ctx, outbox.WrapTransport(&mcp.StdioTransport{}))
	}
	var toks []bearer.Token // none: no authentication
	if *tokens != "" {
		if toks, err = bearer.LoadFile(*tokens); err != nil {
			return err
		}
	}
	r := chi.NewRouter()
	r.Handle("/mcp", bearer.NewVerifier(toks).Require(mcphttp.NewHandler(server, nil)))
	r.Mount("/", operator.NewHandler(db, &operator.Options{Dispatcher: d, Metrics: metrics}))
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "serving MCP at http://%s/mcp\n", ln.Addr()) // port 0 picks one
	return mcphttp.Serve(ctx, ln, r)
}
