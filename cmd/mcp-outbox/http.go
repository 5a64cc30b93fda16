package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// statelessVersion is the first protocol version whose requests carry their
// own _meta and need no session. The go-sdk serves it over HTTP only from a
// handler with Stateless set, and a stateful handler makes such clients fall
// back to 2025-11-25; so /mcp routes each request by its
// Mcp-Protocol-Version header to one of two handlers on the same server.
const statelessVersion = "2026-07-28"

// mcpHandler serves /mcp: stateful sessions for clients up to 2025-11-25,
// stateless requests for 2026-07-28 and later.
func mcpHandler(s *mcp.Server, logger *slog.Logger) http.Handler {
	get := func(*http.Request) *mcp.Server { return s }
	stateful := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: logger})
	stateless := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: logger, Stateless: true})
	return outbox.LiftParamsKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Mcp-Protocol-Version"); v >= statelessVersion && r.Header.Get("Mcp-Session-Id") == "" {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	}))
}

func newRouter(a *app, logger *slog.Logger) http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	mcpH := a.mcpHTTP
	if mcpH == nil {
		mcpH = mcpHandler(a.server, logger)
	}
	r.Handle("/mcp", a.auth.protectMCP(mcpH))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	r.Get("/readyz", a.readyz)
	r.Mount("/admin", adminRouter(a.db, logger, a.auth))
	mountPage(r, a.db, logger, a.auth)
	if a.metricsHandler != nil {
		// Metrics name tools and destinations: the admin rule guards them
		// (the admin token when configured, else clients on this host).
		r.With(adminGuard(a.auth)).Method(http.MethodGet, "/metrics", a.metricsHandler)
	}
	return r
}

// serveHTTP listens on addr until ctx ends, then shuts down gracefully.
func serveHTTP(ctx context.Context, a *app, addr string, logger *slog.Logger, stderr io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: newRouter(a, logger), ReadHeaderTimeout: 10 * time.Second}
	// Tests and scripts read the bound address (useful with port 0).
	fmt.Fprintf(stderr, "mcp-outbox: serving MCP at http://%s/mcp\n", ln.Addr())
	mcpAuth, adminAuth := "no authentication", "loopback clients only"
	if a.auth.enabled() {
		mcpAuth = fmt.Sprintf("bearer tokens of %d principals", a.auth.principals())
	}
	if a.auth != nil && a.auth.adminHash != nil {
		adminAuth = "admin token required"
	}
	fmt.Fprintf(stderr, "mcp-outbox: MCP authentication: %s\n", mcpAuth)
	fmt.Fprintf(stderr, "mcp-outbox: operator API at http://%s/admin (%s)\n", ln.Addr(), adminAuth)
	fmt.Fprintf(stderr, "mcp-outbox: operator page at http://%s/ (%s)\n", ln.Addr(), adminAuth)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down http: %w", err)
	}
	return nil
}

// readyz answers 200 when the server can do its work: the database takes
// writes and has this binary's schema, and the dispatcher is delivering.
// Otherwise 503, with what failed, so a load balancer stops sending calls.
func (a *app) readyz(w http.ResponseWriter, r *http.Request) {
	checks := map[string]string{"database": "ok", "dispatcher": "ok"}
	ready := true
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := a.db.CheckReady(ctx); err != nil {
		checks["database"], ready = err.Error(), false
	}
	if a.layer != nil && (a.dispatcher == nil || !a.dispatcher.Running()) {
		checks["dispatcher"], ready = "not running", false
	}
	w.Header().Set("Content-Type", "application/json")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": ready, "checks": checks})
}
