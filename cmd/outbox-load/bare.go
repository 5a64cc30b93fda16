package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// serveBareCommand re-runs this binary as the baseline server.
const serveBareCommand = "serve-bare"

// serveBare serves the ledger's charge tool without the layer, one
// transaction per call, over Streamable HTTP routed as serve routes it, and
// prints its address like serve does.
func serveBare(args []string) int {
	fs := flag.NewFlagSet(serveBareCommand, flag.ContinueOnError)
	db := fs.String("db", "", "database (path or postgres:// URL)")
	addr := fs.String("http", "127.0.0.1:0", "listen address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := schema.Open(ctx, *db, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve-bare:", err)
		return 1
	}
	defer d.Close()
	if err := ledger.Migrate(ctx, d); err != nil {
		fmt.Fprintln(os.Stderr, "serve-bare:", err)
		return 1
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
	ledger.RegisterBareTransactional(d, s, nil)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve-bare:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "serve-bare: serving MCP at http://%s/mcp\n", ln.Addr())
	if err := mcphttp.Serve(ctx, ln, mcphttp.NewHandler(s, nil)); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "serve-bare:", err)
		return 1
	}
	return 0
}
