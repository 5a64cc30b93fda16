package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"path/filepath"

	"github.com/mcp-outbox/mcp-outbox/internal/gctune"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/destconfig"
	"github.com/mcp-outbox/mcp-outbox/outbox/sidecar"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

const proxyUsage = `Usage: mcp-outbox proxy [flags] -- COMMAND [ARGS...]
       mcp-outbox proxy [flags] --upstream URL

Runs in front of an existing MCP tool server (the upstream), in any language,
and gives its tool calls the outbox's guarantees: a retried call is replayed
instead of run again, a duplicate waits for the original, and the call_status
tool answers "what happened to my call?". Everything else (resources, prompts,
notifications, progress, cancellation) passes through unchanged.

The upstream is a command speaking MCP on stdio (restarted with backoff if it
dies, its stderr passed through prefixed with "[upstream] "), or a Streamable
HTTP endpoint (--upstream). The proxy serves stdio, or Streamable HTTP at /mcp
with --http (one upstream session, and for a command one process, per client
session). Sessions are bounded: one idle for --session-idle-timeout ends and
its upstream stops; beyond --max-sessions (503) or --max-sessions-per-principal
(429) a new one is refused with a JSON-RPC error naming the limit. A forwarded
call waits at most --call-timeout for its answer, then is settled as a lost
answer (below); on SIGTERM every open call is settled before the proxy exits.
initialize (and server/discover) advertise the layer to clients under
capabilities.experimental.idempotency.

Calls are recorded in the database --db (an SQLite file or a postgres:// URL),
which the upstream may share; a command upstream finds it in MCP_OUTBOX_DB:
  --cooperating  the upstream records each call's outcome, its own rows and its
                 outbox effects in one transaction of its own, following
                 schema/README.md; the proxy's dispatcher delivers the effects.
                 Exactly once, whichever process crashes when.
  (default)      the proxy records the upstream's answers. When an answer is
                 lost (either process died after forwarding), the call may have
                 run: it becomes "unknown", a retry gets an "outcome unknown"
                 error naming call_status, and an operator settles it
                 ('mcp-outbox outbox resolve-call').
Tools annotated readOnlyHint or idempotentHint pass through unrecorded.
Runs with GOGC=400 unless GOGC is set, as serve does.

` + proxyTasksHelp + `
` + retentionHelp + `

Every flag can also be set in the environment (shown in brackets); a flag wins.

` + destconfig.Help + "\n" + authHelp + "\n" + tracingHelp

func runProxy(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "proxy", proxyUsage)
	cfg := appConfig{service: proxyService}
	if err := cfg.flags(env, fs); err != nil {
		return err
	}
	upstreamURL := fs.String("upstream", env.envDefault("MCP_OUTBOX_UPSTREAM", ""),
		"the upstream's Streamable HTTP endpoint `URL`, instead of a command after -- [MCP_OUTBOX_UPSTREAM]")
	cooperating := fs.Bool("cooperating", env.envDefault("MCP_OUTBOX_COOPERATING", "") == "1",
		"the upstream records its calls' outcomes itself (schema/README.md) [MCP_OUTBOX_COOPERATING=1]")
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
	var taskValues []string
	fs.Var((*multiFlag)(&taskValues), "task", "make calls of an upstream tool MCP tasks: `TOOL=always|required|after:DURATION`, repeatable; see Tasks above [MCP_OUTBOX_TASKS]")
	var bounds proxyBounds
	if err := bounds.flags(env, fs); err != nil {
		return err
	}
	var retentionValues []string
	retentionFlag(fs, &retentionValues)
	var ac authConfig
	ac.flags(env, fs)
	if err := originFlag(env, fs, &ac.allowedOrigins); err != nil {
		return err
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := bounds.validate(); err != nil {
		return err
	}
	if len(taskValues) == 0 { // a flag wins over the environment
		taskValues = taskFlagDefault(env)
	}
	tasks, err := parseTaskFlags(taskValues, func(item, tool string) error {
		if tool == outbox.StatusToolName {
			return usagef("--task %q: %s is the proxy's own read-only tool", item, tool)
		}
		return nil
	})
	if err != nil {
		return err
	}
	retention, err := parseRetention(env, retentionValues, cfg.keyRetention(), func(item, tool string) error {
		if tool == outbox.StatusToolName {
			return usagef("--retention %q: %s is the proxy's own read-only tool", item, tool)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var upstream sidecar.Dialer
	switch {
	case *upstreamURL != "" && fs.NArg() > 0:
		return usagef("give the upstream either as --upstream URL or as a command after --, not both")
	case *upstreamURL != "":
		u, err := url.Parse(*upstreamURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usagef("--upstream %q: want an http:// or https:// URL", *upstreamURL)
		}
		upstream = &sidecar.HTTP{URL: *upstreamURL}
	case fs.NArg() > 0:
		upstream = &sidecar.Command{Path: fs.Arg(0), Args: fs.Args()[1:], Env: upstreamEnv(env, cfg.db),
			Stderr: env.stderr, Prefix: "[upstream] "}
	default:
		return usagef("no upstream: give a command after -- (mcp-outbox proxy -- python server.py) or --upstream URL")
	}
	if err := ac.prepareHTTP(env, *httpAddr); err != nil {
		return err
	}

	early, err := listenEarly(ctx, env, &cfg, &ac, *httpAddr)
	if err != nil {
		return err
	}
	defer early.abort() // after the layer stopped and the database closed, on every path
	a, err := openStore(ctx, env, &cfg)
	if err != nil {
		return err
	}
	defer a.Close()
	a.auth = &ac
	if h, ok := upstream.(*sidecar.HTTP); ok {
		h.Logger = a.logger // its standalone SSE stream's warnings
	}
	popts := sidecar.Options{Layer: a.layer, Upstream: upstream, Cooperating: *cooperating, Logger: a.logger, Tasks: tasks,
		Retention: retention, AllowedOrigins: ac.allowedOrigins}
	bounds.apply(&popts)
	p, err := sidecar.New(popts)
	if err != nil {
		return err
	}
	// Deferred before the layer's stop, so it runs after it: the tasks
	// still running when the layer stops are forwarded over this session.
	// And after the database's close, so it runs before it: Close returns
	// once every client session's calls are settled in the database.
	defer p.Close()
	stop, err := a.start(ctx)
	if err != nil {
		return err
	}
	defer stop()

	gctune.Apply()
	a.logger.Info("proxying MCP", "upstream", upstream.String(), "cooperating", *cooperating, "db", schema.Redact(cfg.db))
	if *httpAddr != "" {
		a.mcpHTTP = p.HTTPHandler(ctx)
		return serveHTTP(ctx, a, early, a.logger, env.stderr)
	}
	conn, err := env.stdio(a.logger).Connect(ctx)
	if err != nil {
		return err
	}
	if err := p.Serve(ctx, conn); err != nil && err != io.EOF && ctx.Err() == nil {
		return fmt.Errorf("proxy stdio: %w", err)
	}
	return nil
}

// upstreamEnv is a command upstream's environment: the proxy's, with
// MCP_OUTBOX_DB naming the database the proxy opened, so that the upstream
// shares it whether --db or the variable named it: an SQLite file as an
// absolute path (the upstream may change directory), a PostgreSQL URL as
// given, password included (the settings the proxy adds for its own pool,
// such as synchronous_commit off, are not the upstream's).
func upstreamEnv(env *environment, db string) []string {
	if !schema.IsPostgresURL(db) {
		if abs, err := filepath.Abs(db); err == nil {
			db = abs
		}
	}
	return append(env.environ(), "MCP_OUTBOX_DB="+db)
}

// proxyTasksHelp is the Tasks paragraph of proxy's --help.
const proxyTasksHelp = `Tasks (MCP 2026-07-28, extension io.modelcontextprotocol/tasks; and the
experimental Tasks of 2025-11-25, on a session made with initialize), for an
upstream that knows nothing of tasks:
  --task TOOL=MODE makes calls of the upstream's TOOL tasks, repeatable; MODE is
    always          a task whenever the request asks for one
    required        only as a task: a request that does not ask gets error
                    -32021 (2026-07-28) or -32601 (2025-11-25)
    after:DURATION  a plain answer if the call finishes within DURATION,
                    else a task (e.g. --task charge=after:500ms); at
                    2025-11-25 the client decides, and gets a task at once
  [MCP_OUTBOX_TASKS=charge=after:500ms,refund=always]; a flag replaces the
  variable. A request asks for a task by declaring the extension in its _meta
  (2026-07-28: server/discover then lists the extension), or by sending
  params.task to a tool that tools/list shows with execution.taskSupport
  optional or required (2025-11-25: initialize then lists capabilities.tasks);
  one that does not ask never gets a task. The task is committed (with an
  fsync) before its handle is sent, then forwarded over an upstream session
  of the proxy's own (for a command, one more process), detached from the
  client's request. tasks/get, tasks/update and tasks/cancel (2026-07-28), and
  tasks/get, tasks/result, tasks/list and tasks/cancel (2025-11-25), are
  answered from the database by any proxy on it, never forwarded. A retry of
  the same call (same key, or same tool and arguments without one) gets the
  same task. If the proxy dies:
  --cooperating  the next proxy on the database forwards the task again, and
                 the upstream's fence lets only one attempt commit: it
                 completes, once. So does the proxy itself when the upstream
                 dies under a task before its commit.
  (default)      the task's outcome is unknown, as for any lost answer:
                 tasks/get reports it failed, with an error that says the call
                 may or may not have run; it is never forwarded twice.
  tasks/cancel before the call was forwarded ends the task cancelled; after,
  it passes a cancel on to the upstream. With --cooperating the upstream's
  commit is fenced, so the task ends cancelled with nothing kept (or
  completed, if it committed first). Otherwise the work may happen all the
  same: the task ends failed with "outcome unknown", never "cancelled".
`
