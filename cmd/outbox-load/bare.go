package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcp-outbox/mcp-outbox/internal/gctune"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/profenv"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/schema"
	_ "github.com/mcp-outbox/mcp-outbox/schema/postgres" // --db takes a postgres:// URL too
)

// serveBareCommand re-runs this binary as a baseline server.
const serveBareCommand = "serve-bare"

// serveBare serves the ledger's charge tool without the layer, over
// Streamable HTTP routed exactly as serve routes it (or over stdio), and
// prints its address like serve does. With a database every call is one
// transaction of its own (what a careful user writes without the layer);
// without one nothing is kept (the limit). Like serve, it answers GET
// /metrics with the Go runtime's counters, from which the load reads
// allocations per call.
func serveBare(args []string) int {
	fs := flag.NewFlagSet(serveBareCommand, flag.ContinueOnError)
	dbArg := fs.String("db", "", "database (path or postgres:// URL); empty keeps nothing")
	addr := fs.String("http", "", "listen address; empty serves stdio")
	mode := fs.String("mode", "tx", "with --db: tx (database/sql, one transaction per call), group (SQLite: one writer committing every waiting call at once) or pgx (PostgreSQL: pgxpool)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	gctune.Apply() // the runtime serve runs with
	defer profenv.Start()()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "serve-bare:", err)
		return 1
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
	switch {
	case *dbArg == "":
		ledger.RegisterNothingKept(s, nil)
	case *mode == "pgx":
		pc, err := pgxpool.ParseConfig(*dbArg)
		if err != nil {
			return fail(err)
		}
		// pgxpool's default is 4 connections (or the CPUs, if more), which
		// would queue 32 callers behind 4 transactions: as many as the
		// layer's pool holds.
		pc.MaxConns = schema.DefaultPostgresConns
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return fail(err)
		}
		defer pool.Close()
		d, err := schema.Open(ctx, *dbArg, nil) // the same tables as the layer's
		if err != nil {
			return fail(err)
		}
		err = ledger.Migrate(ctx, d)
		d.Close()
		if err != nil {
			return fail(err)
		}
		registerPgx(pool, s)
	case *mode == "group":
		d, err := schema.Open(ctx, *dbArg, nil)
		if err != nil {
			return fail(err)
		}
		defer d.Close()
		if err := ledger.Migrate(ctx, d); err != nil {
			return fail(err)
		}
		if err := registerGroupCommit(ctx, d.Write, s); err != nil {
			return fail(err)
		}
	case *mode == "tx":
		d, err := schema.Open(ctx, *dbArg, nil)
		if err != nil {
			return fail(err)
		}
		defer d.Close()
		if err := ledger.Migrate(ctx, d); err != nil {
			return fail(err)
		}
		ledger.RegisterBareTransactional(d, s, nil)
	default:
		return fail(fmt.Errorf("--mode %q: want tx, group or pgx", *mode))
	}
	if *addr == "" {
		if err := s.Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil {
			return fail(err)
		}
		return 0
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fail(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcphttp.NewHandler(s, nil))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	fmt.Fprintf(os.Stderr, "serve-bare: serving MCP at http://%s/mcp\n", ln.Addr())
	// All load clients are 127.0.0.1: no per-client bound (see withGOGC).
	if err := mcphttp.ServeWith(ctx, ln, mux, &mcphttp.Options{MaxConnsPerClient: -1}); err != nil && ctx.Err() == nil {
		return fail(err)
	}
	return 0
}
