package main

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/mcp-outbox/mcp-outbox/internal/gctune"
	"github.com/mcp-outbox/mcp-outbox/internal/profenv"
	"github.com/mcp-outbox/mcp-outbox/outbox/destconfig"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

const serveUsage = `Usage: mcp-outbox serve [flags]

Runs the example payments ledger as an MCP server: tools charge {amount,
currency?}, refund {charge_id}, balance {} and call_status, with every
side-effecting call recorded so that a retry replays instead of charging again.

Serves stdio by default (for desktop MCP clients that start the server), or
Streamable HTTP at /mcp with --http, which also serves the operator API
(/admin: loopback clients only, or anyone with the admin token; see
'mcp-outbox outbox --help'), /healthz and /readyz (database writable and
current, dispatcher running). See Authentication below.
A PostgreSQL database that cannot be reached at start is waited for, with
backoff up to 10s and a warning per attempt, until it answers or a signal
comes; with --http, /healthz answers 200 and /readyz 503 meanwhile. An
SQLite file is opened before --http listens.
Logs go to stderr only. Runs with GOGC=400 unless GOGC is set (the go-sdk's
per-call garbage makes Go's default of 100 cost a third of the CPU).

Delivers the outbox's effects to the destinations configured with --dest,
starting at once with what a previous run left; a tool call that enqueues to
another destination then fails, enqueueing nothing, and serve refuses to
start while effects are pending for a destination not given. Without --dest
nothing is delivered here: effects stay queued for 'mcp-outbox drain' or a
serve that knows their destinations. On SIGTERM or SIGINT it stops taking
new work, lets calls in flight finish (with --http up to --shutdown-timeout;
calls still running then are handed over: each commits or rolls back, and a
retry runs a rolled-back one once), then deliveries in flight (up to 10s),
and exits 0.
Every 10 minutes it purges expired calls and old delivered effects (see
'mcp-outbox purge --help'); dead and unknown effects are kept.

Every flag can also be set in the environment (shown in brackets); a flag wins.

` + destconfig.Help + "\n" + tasksHelp + "\n" + retentionHelp + "\n" + authHelp + "\n" + tracingHelp

// Service names in traces, unless OTEL_SERVICE_NAME says otherwise.
const (
	serveService = "mcp-outbox"
	proxyService = "mcp-outbox-proxy"
	drainService = "mcp-outbox-drain"
)

func runServe(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "serve", serveUsage)
	cfg := appConfig{service: serveService}
	if err := cfg.flags(env, fs); err != nil {
		return err
	}
	if err := cfg.ledgerFlags(env, fs); err != nil {
		return err
	}
	httpAddr := fs.String("http", env.envDefault("MCP_OUTBOX_HTTP", ""),
		"serve Streamable HTTP at `ADDR` (e.g. 127.0.0.1:8080) instead of stdio; a non-loopback ADDR needs --tokens or --oauth-issuer [MCP_OUTBOX_HTTP]")
	if err := shutdownFlag(env, fs, &cfg.shutdownTimeout); err != nil {
		return err
	}
	if err := cfg.httpLimits.flags(env, fs); err != nil {
		return err
	}
	if err := inflightFlags(env, fs, &cfg.inflight); err != nil {
		return err
	}
	var ac authConfig
	ac.flags(env, fs)
	if err := originFlag(env, fs, &ac.allowedOrigins); err != nil {
		return err
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if cfg.bare {
		if err := checkBare(env, fs); err != nil {
			return err
		}
	}
	if err := cfg.parseLedgerRetention(env); err != nil {
		return err
	}
	if err := ac.prepareHTTP(env, *httpAddr); err != nil {
		return err
	}
	gctune.Apply()
	defer profenv.Start()()
	early, err := listenEarly(ctx, env, &cfg, &ac, *httpAddr)
	if err != nil {
		return err
	}
	defer early.abort() // after the layer stopped and the database closed, on every path
	a, err := openApp(ctx, env, &cfg)
	if err != nil {
		return err
	}
	defer a.Close()
	a.auth = &ac
	logger := a.logger
	// serve's tools are all registered by now (proxy's come from its
	// upstream, later, so it cannot check): a misspelt --oauth-tool-scope
	// would leave its tool unprotected without a word.
	if rs := ac.resourceServer(logger); rs != nil && *httpAddr != "" {
		if err := rs.CheckTools(ctx, a.server); err != nil {
			return usagef("--oauth-tool-scope: %v", err)
		}
	}
	// Started before serving and stopped after it: the deferred stop runs
	// once the server has let its calls in flight finish, and before the
	// database closes.
	stop, err := a.start(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if early != nil {
		return serveHTTP(ctx, a, early, logger, env.stderr)
	}
	logger.Info("serving MCP on stdio", "db", schema.Redact(cfg.db), "outbox", !cfg.bare)
	err = a.server.Run(ctx, env.stdio(logger))
	if ctx.Err() != nil || err == io.EOF {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve stdio: %w", err)
	}
	return nil
}

// prepareHTTP checks --http and loads the authentication it needs; a
// no-op without --http. It runs before the database is opened, so that a
// typo creates no file.
func (ac *authConfig) prepareHTTP(env *environment, addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("--http %q: want HOST:PORT (%v)", addr, err)
	}
	if err := ac.load(env, addr); err != nil {
		return err
	}
	if ac.insecureNoAuth {
		warnInsecure(env.stderr, addr)
	}
	return nil
}
