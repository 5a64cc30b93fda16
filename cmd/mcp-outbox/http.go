package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
)

// newRouter is serve's and proxy's --http listener: /mcp (behind the
// bearer tokens, when there are any) and the operator surface.
func newRouter(a *app, logger *slog.Logger) http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	mcpH := a.mcpHTTP
	if mcpH == nil {
		mcpH = mcphttp.NewHandler(a.server, &mcphttp.Options{Logger: logger})
	}
	r.Handle("/mcp", a.auth.verifier().Require(mcpH))
	opts := &operator.Options{Logger: logger, Metrics: a.metricsHandler}
	if a.auth != nil {
		opts.AdminTokenSHA256 = a.auth.adminHash
	}
	if a.layer != nil {
		// Read when asked: the router may be built before the dispatcher
		// starts.
		opts.Dispatcher = runningFunc(func() bool { r := a.runner.Load(); return r != nil && r.Running() })
	}
	r.Mount("/", operator.NewHandler(a.db, opts))
	return r
}

type runningFunc func() bool

func (f runningFunc) Running() bool { return f() }

// serveHTTP listens on addr until ctx ends, then shuts down gracefully.
func serveHTTP(ctx context.Context, a *app, addr string, logger *slog.Logger, stderr io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	h := newRouter(a, logger)
	// Tests and scripts read the bound address (useful with port 0).
	fmt.Fprintf(stderr, "mcp-outbox: serving MCP at http://%s/mcp\n", ln.Addr())
	mcpAuth, adminAuth := "no authentication", "loopback clients only"
	if v := a.auth.verifier(); v.Enabled() {
		mcpAuth = fmt.Sprintf("bearer tokens of %d principals", v.Principals())
	}
	if a.auth != nil && a.auth.adminHash != nil {
		adminAuth = "admin token required"
	}
	fmt.Fprintf(stderr, "mcp-outbox: MCP authentication: %s\n", mcpAuth)
	fmt.Fprintf(stderr, "mcp-outbox: operator API at http://%s/admin (%s)\n", ln.Addr(), adminAuth)
	fmt.Fprintf(stderr, "mcp-outbox: operator page at http://%s/ (%s)\n", ln.Addr(), adminAuth)
	return mcphttp.Serve(ctx, ln, h)
}
