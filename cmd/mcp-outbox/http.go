package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/mcp-outbox/mcp-outbox/internal/origin"
	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
)

// newRouter is serve's and proxy's --http listener: /mcp (behind the
// bearer tokens, when there are any) and the operator surface, at
// --operator-path.
func newRouter(ctx context.Context, a *app, logger *slog.Logger) (http.Handler, error) {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	mo := &mcphttp.Options{Logger: logger, AllowedOrigins: a.auth.origins()}
	a.inflight.options(mo)
	var mcpH http.Handler
	if a.mcpHTTP != nil {
		mcpH = a.inflight.wrap(a.mcpHTTP, mo)
	} else {
		mcpH = mcphttp.NewHandler(a.server, mo)
	}
	// The library handlers (NewHandler, and the proxy's a.mcpHTTP through
	// sidecar.Options.AllowedOrigins) check the Origin themselves, behind
	// authentication. The transport wants a foreign Origin answered 403, not
	// 401, so it is checked here once more, ahead of the token: a string
	// comparison, and a refused page learns nothing about the tokens.
	ahead := func(h http.Handler) http.Handler { return origin.Check(a.auth.origins(), h) }
	if rs := a.auth.resourceServer(logger); rs != nil {
		r.Handle("/mcp", ahead(rs.Require(mcpH)))
		for _, p := range rs.MetadataPaths() {
			r.Handle(p, rs.MetadataHandler())
		}
	} else if v := a.auth.verifier(); v.Enabled() {
		// Verifier.Require, with the refused tokens' count in our log.
		r.Handle("/mcp", ahead(bearer.Require(v.Verify, &bearer.RequireOptions{Realm: "mcp-outbox", Logger: logger})(mcpH)))
	} else {
		r.Handle("/mcp", mcpH)
	}
	opts := &operator.Options{Logger: logger, Registry: a.metricsRegistry, BasePath: a.auth.operatorBase()}
	if a.auth != nil {
		opts.AdminTokenSHA256, opts.SessionKey = a.auth.adminHash, a.auth.sessionKey
		opts.OAuth = a.auth.operatorOAuth(logger)
	}
	if a.layer != nil {
		opts.Dispatcher = appDispatcher{a}
		opts.Keys = a.keys
	}
	ops, err := operator.NewHandler(ctx, a.db, opts)
	if err != nil {
		return nil, err
	}
	// chi mounts "/ops" as "/ops" and "/ops/*"; NewHandler serves both.
	if opts.BasePath == "/" {
		r.Mount("/", ops)
	} else {
		r.Mount(strings.TrimSuffix(opts.BasePath, "/"), ops)
	}
	return r, nil
}

// origins is --allowed-origin.
func (c *authConfig) origins() []string {
	if c == nil {
		return nil
	}
	return c.allowedOrigins
}

// operatorBase is --operator-path, "/" when not set.
func (c *authConfig) operatorBase() string {
	if c == nil || c.operatorPath == "" {
		return "/"
	}
	return c.operatorPath
}

// appDispatcher is the operator's view of serve's dispatcher, read when
// asked: the router is built before the dispatcher starts. Its set of
// destinations is --dest's, as warnUnconfigured's is.
type appDispatcher struct{ a *app }

func (d appDispatcher) Running() bool { r := d.a.runner.Load(); return r != nil && r.Running() }

func (d appDispatcher) Destinations() []string {
	names := make([]string, 0, len(d.a.dests))
	for _, dst := range d.a.dests {
		names = append(names, dst.Name)
	}
	return names
}

// issuerTimeout bounds serve's first request to the OAuth issuer at start,
// as the resource server's own client bounds each request.
const issuerTimeout = 10 * time.Second

// serveHTTP serves the app on early's listener until the ctx early was
// started with ends, then shuts down gracefully.
func serveHTTP(ctx context.Context, a *app, early *earlyHTTP, logger *slog.Logger, stderr io.Writer) error {
	h, err := newRouter(ctx, a, logger)
	if err != nil {
		return err
	}
	// Before the address is printed: whoever reads it connects at once.
	// With SQLite this is where it begins to listen.
	if err := early.use(h); err != nil {
		return err
	}
	ln := early.ln
	// Tests and scripts read the bound address (useful with port 0).
	fmt.Fprintf(stderr, "mcp-outbox: serving MCP at http://%s/mcp\n", ln.Addr())
	mcpAuth, adminAuth := "no authentication", "loopback clients only"
	if v := a.auth.verifier(); v.Enabled() {
		mcpAuth = fmt.Sprintf("bearer tokens of %d principals", v.Principals())
	}
	if rs := a.auth.resourceServer(logger); rs != nil {
		mcpAuth = fmt.Sprintf("OAuth access tokens of %s for %s (metadata at %s)", rs.Issuer(), rs.Resource(), rs.MetadataURL())
		// Not fatal: the issuer may start after us (a sidecar), and
		// tokens are refused with 503 until it answers.
		cctx, cancel := context.WithTimeout(ctx, issuerTimeout)
		if err := rs.Check(cctx); err != nil {
			fmt.Fprintf(stderr, "mcp-outbox: WARNING: cannot read the OAuth issuer's keys yet: %v\n", err)
		}
		cancel()
	}
	if a.auth != nil && a.auth.adminHash != nil {
		adminAuth = "admin token required"
	}
	if o := a.auth.operatorOAuth(logger); o != nil {
		oauthAuth := fmt.Sprintf("OAuth access tokens with scope %s to read, %s to act", o.ReadScope, o.ActScope)
		if a.auth.adminHash != nil {
			adminAuth += ", or " + oauthAuth
		} else {
			adminAuth = oauthAuth + " (loopback clients too)"
		}
	}
	fmt.Fprintf(stderr, "mcp-outbox: MCP authentication: %s\n", mcpAuth)
	base := a.auth.operatorBase()
	fmt.Fprintf(stderr, "mcp-outbox: operator API at http://%s%sadmin (%s)\n", ln.Addr(), base, adminAuth)
	fmt.Fprintf(stderr, "mcp-outbox: operator page at http://%s%s (%s)\n", ln.Addr(), base, adminAuth)
	return early.wait()
}

// shutdownFlag adds --shutdown-timeout, serve's and proxy's bound on the
// wait for the calls in flight at SIGTERM (mcphttp.Options.ShutdownTimeout).
func shutdownFlag(env *environment, fs *flag.FlagSet, p *time.Duration) error {
	v, err := env.envDuration("MCP_OUTBOX_SHUTDOWN_TIMEOUT", 0)
	if err != nil {
		return err
	}
	fs.DurationVar(p, "shutdown-timeout", v, fmt.Sprintf("with --http, how long SIGTERM waits for the calls in flight "+
		"before it hands them over (they commit or roll back, and a retry runs a rolled-back one once); 0 means %v [MCP_OUTBOX_SHUTDOWN_TIMEOUT]",
		mcphttp.DefaultShutdownTimeout))
	return nil
}
