// Command serve is `mcp-outbox serve` from public packages: a recorded tool, dispatcher,
// reaper, hardened stdio, or HTTP with tokens, admin API, page, health, metrics.
package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
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

// run serves until ctx ends, then shuts down in order: the server stops
// taking calls and lets those in flight finish, the dispatcher and the
// reaper stop, and the database closes last.
func run(ctx context.Context, args []string, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	dbPath := fs.String("db", "invoices.db", "SQLite database file (PostgreSQL needs schema/postgres linked in, which this SQLite-only example leaves out)")
	httpAddr := fs.String("http", "", "serve Streamable HTTP at ADDR instead of stdio")
	tokens := fs.String("tokens", "", "file of 'PRINCIPAL SHA256HEX' lines: require bearer tokens on /mcp")
	mailer := fs.String("mailer", "127.0.0.1:9090", "HOST:PORT of the mail API the effects go to")
	_ = fs.Parse(args) // ExitOnError: never returns an error
	db, err := schema.Open(ctx, *dbPath, nil)
	if err != nil {
		return err
	}
	defer db.Close() // deferred first, so it runs last
	if err := migrate(ctx, db); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	m := outbox.NewMetrics(reg)
	layer, err := outbox.New(db, &outbox.Options{Metrics: m})
	if err != nil {
		return err
	}
	server := layer.NewServer(&mcp.Implementation{Name: "invoices", Version: "v1"}, nil)
	outbox.AddTool(layer, server, &mcp.Tool{Name: "send_invoice", Description: "Bill a customer and mail the invoice."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in invoiceIn) (*mcp.CallToolResult, invoiceOut, error) {
			var id int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO invoices (customer) VALUES ($1) RETURNING id`, in.Customer).Scan(&id); err != nil {
				return nil, invoiceOut{}, err
			}
			body, err := json.Marshal(map[string]int64{"invoice": id})
			if err != nil {
				return nil, invoiceOut{}, err
			}
			// Sent as Content-Type: application/json, the dispatcher's
			// default for a JSON body; Header would name another type.
			if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: "mailer", Path: "/v1/send", Body: body}); err != nil {
				return nil, invoiceOut{}, err
			}
			return nil, invoiceOut{InvoiceID: id}, nil
		}, nil)

	// The dispatcher (woken by every commit that enqueues) and the reaper
	// (default retention), until Stop. An Enqueue to a destination not
	// listed here is now an error.
	running, err := layer.Start(ctx, &outbox.StartOptions{Dispatcher: &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "mailer", URL: &url.URL{Scheme: "http", Host: *mailer}}},
	}})
	if err != nil {
		return err
	}
	// Runs once serving has returned, and so after the calls in flight.
	// Bounded: a task still running after a minute stops, rolls back,
	// and runs again at the next start.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		err = errors.Join(err, running.Stop(sctx))
	}()

	if *httpAddr == "" {
		err := server.Run(ctx, mcpstdio.NewTransport(&mcp.StdioTransport{}, nil))
		if ctx.Err() != nil {
			return nil // a signal, not a failure
		}
		return err
	}
	var toks []bearer.Token // none: no authentication
	if *tokens != "" {
		if toks, err = bearer.LoadFile(*tokens); err != nil {
			return err
		}
	}
	// One Options for NewHandler and ServeWith: each reads its own bounds
	// (README, Limits). The zero value is the documented defaults.
	hopts := &mcphttp.Options{}
	r := chi.NewRouter()
	r.Handle("/mcp", bearer.NewVerifier(toks).Require(mcphttp.NewHandler(server, hopts)))
	// Layer: readiness follows its Start (degraded were it never started)
	// and the page judges destinations by the running dispatcher's.
	ops, err := operator.NewHandler(ctx, db, &operator.Options{Layer: layer, Registry: reg})
	if err != nil {
		return err
	}
	r.Mount("/", ops)
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "serving MCP at http://%s/mcp\n", ln.Addr()) // port 0 picks one
	// Returns when ctx ends, once the requests in flight have finished.
	return mcphttp.ServeWith(ctx, ln, r, hopts)
}

// The application's own tables, one directory of migrations per store.
//
//go:embed migrations
var migrations embed.FS

// migrate creates or upgrades the invoices table, as migration set
// "invoices", beside the outbox's own (which schema.Open applied).
func migrate(ctx context.Context, db *schema.DB) error {
	sqlite, _ := fs.Sub(migrations, "migrations/sqlite")
	postgres, _ := fs.Sub(migrations, "migrations/postgres")
	m, err := db.MigrationsFor(sqlite, postgres)
	if err != nil {
		return err
	}
	return db.Migrate(ctx, "invoices", m)
}
