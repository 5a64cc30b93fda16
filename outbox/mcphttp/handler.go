package mcphttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// StatelessVersion is the first protocol version whose requests carry their
// own _meta and need no session. The go-sdk serves it over HTTP only from a
// handler with Stateless set, and a stateful handler makes such clients fall
// back to 2025-11-25; so the handler routes each request by its
// Mcp-Protocol-Version header to one of two handlers on the same server.
const StatelessVersion = "2026-07-28"

// Options configure [NewHandler]; the zero value is usable.
type Options struct {
	// Logger gets the go-sdk's transport logs; nil discards them.
	Logger *slog.Logger
}

// NewHandler returns the Streamable HTTP endpoint of s (serve mounts it at
// /mcp): stateful sessions for clients up to 2025-11-25, stateless
// requests for 2026-07-28 and later (a request of a later version that
// carries an Mcp-Session-Id stays with its session). A top-level
// params.idempotencyKey of tools/call is lifted into _meta first
// ([LiftParamsKey]). The reason of a client's notifications/cancelled in
// a session reaches the layer, which decides by it whether the call stops
// (outbox.CancelPolicy). Put authentication in front of it, such as
// bearer.Verifier.Require.
func NewHandler(s *mcp.Server, opts *Options) http.Handler {
	var logger *slog.Logger
	if opts != nil {
		logger = opts.Logger
	}
	get := func(*http.Request) *mcp.Server { return s }
	stateful := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: logger})
	stateless := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: logger, Stateless: true})
	return LiftParamsKey(newCancels().wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Mcp-Protocol-Version"); v >= StatelessVersion && r.Header.Get("Mcp-Session-Id") == "" {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})))
}

// ShutdownTimeout bounds how long Serve waits for requests in flight once
// its context ends.
const ShutdownTimeout = 10 * time.Second

// Serve serves h on ln until ctx ends, then shuts down gracefully: it stops
// accepting, and waits up to ShutdownTimeout for requests in flight.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down http: %w", err)
	}
	return nil
}
