package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/gctune"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/profenv"
	"github.com/mcp-outbox/mcp-outbox/internal/testclock"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/destconfig"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
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

// appConfig is what serve, demo and proxy need to open the database and
// the layer (and serve and demo, the example ledger).
type appConfig struct {
	db           string
	durability   string
	dests        []string
	demoDelay    time.Duration
	tasks        []string // --task TOOL=MODE (serve_tasks.go)
	taskPoll     time.Duration
	retentions   []string // --retention TOOL=DURATION (retention.go)
	fingerprint  time.Duration
	inFlightWait time.Duration
	lease        time.Duration
	batchCalls   int
	batchWait    time.Duration
	retention    outbox.Retention
	bare         bool
	logLevel     string
	logFormat    string
	logSensitive bool
	keyFile      string // --encryption-key-file (encryption.go)
	logger       *slog.Logger
	// service names the process in its traces (tracing.go); "" traces
	// nothing (commands other than serve and proxy).
	service string
	// dbWaiting, if set, runs once when the database is found
	// unavailable at start and openStore begins to wait for it.
	dbWaiting func()
	// toolRetention is retentions parsed, by tool (parseLedgerRetention).
	toolRetention map[string]outbox.ToolRetention
	// shutdownTimeout is --shutdown-timeout: how long --http waits for
	// the calls in flight at SIGTERM (mcphttp.Options.ShutdownTimeout).
	shutdownTimeout time.Duration
	// httpLimits are --body-timeout, --conn-idle-timeout, --max-conns and
	// --max-conns-per-client (http_limits.go).
	httpLimits httpLimits
	// inflight is --max-in-flight and --max-in-flight-per-principal.
	inflight inflightLimits
}

// app is a running example server: database, layer and MCP server.
type app struct {
	db     *schema.DB
	layer  *outbox.Layer // nil when bare
	keys   seal.KeyRing  // the layer's, nil without --encryption-key-file
	server *mcp.Server
	dests  []dispatch.Destination
	logger *slog.Logger
	// runner is the dispatcher and the reaper, once start ran (the
	// readiness check reads it from other goroutines).
	runner atomic.Pointer[outbox.Runner]
	auth   *authConfig // nil authenticates nothing (stdio, tests)
	// logSensitive puts raw keys and arguments in the events (--log-sensitive).
	logSensitive bool

	retention outbox.Retention // what the reaper keeps
	metrics   *outbox.Metrics  // nil records nothing
	// metricsRegistry holds metrics' counters; the operator surface serves it.
	metricsRegistry *prometheus.Registry
	// mcpHTTP serves /mcp instead of server (the proxy's sessions).
	mcpHTTP http.Handler
	// tracerProvider makes the spans of the layer and the dispatcher; nil
	// when tracing is off. stopTracing flushes it (Close calls it).
	tracerProvider trace.TracerProvider
	stopTracing    func()
	// stopBound is how long the Runner's Stop waits for deliveries and
	// tasks in flight once serving ended (--shutdown-timeout; zero:
	// mcphttp.DefaultShutdownTimeout). Tasks still running then stop,
	// roll back and run again at the next start.
	stopBound time.Duration
	// inflight bounds /mcp's requests in flight (--max-in-flight).
	inflight inflightLimits
}

func (cfg *appConfig) flags(env *environment, fs *flag.FlagSet) error {
	fs.StringVar(&cfg.db, "db", env.envDefault("MCP_OUTBOX_DB", "./mcp-outbox.db"), "the database: an SQLite `file`, created if missing, or the postgres:// URL of a PostgreSQL database that replicas share [MCP_OUTBOX_DB]")
	keyFileFlag(env, fs, &cfg.keyFile)
	fs.StringVar(&cfg.durability, "durability", env.envDefault("MCP_OUTBOX_DURABILITY", "full"),
		"full: a commit survives power loss; normal: survives a process crash, not a power loss, ~10x faster commits [MCP_OUTBOX_DURABILITY]")
	fs.Var((*multiFlag)(&cfg.dests), "dest", "destination `NAME=URL[;SETTING=VALUE...]` for effects, repeatable; see Destinations above [MCP_OUTBOX_DEST_<NAME>=URL]")
	batchCalls, err := env.envInt("MCP_OUTBOX_BATCH_CALLS", defaults.MaxBatchCalls)
	if err != nil {
		return err
	}
	fs.IntVar(&cfg.batchCalls, "batch-calls", batchCalls,
		"group commit: at most this many calls share one commit; 1 gives each call its own, 0 means the default [MCP_OUTBOX_BATCH_CALLS]")
	// Durations: each a flag with its environment variable as default.
	for _, f := range []struct {
		d         *time.Duration
		flag, env string
		def       time.Duration
		usage     string
	}{
		{&cfg.fingerprint, "fingerprint-window", "MCP_OUTBOX_FINGERPRINT_WINDOW", defaults.FingerprintWindow,
			"how long a call without an idempotency key is recognised by its tool and arguments; 0 turns it off"},
		{&cfg.inFlightWait, "in-flight-wait", "MCP_OUTBOX_IN_FLIGHT_WAIT", defaults.InFlightWait,
			"how long a duplicate waits for the original call's outcome before an \"in progress\" error"},
		{&cfg.lease, "lease", "MCP_OUTBOX_LEASE", defaults.Lease,
			"how long a running call's claim keeps other processes on the same database from taking it over; 0 means the default"},
		{&cfg.batchWait, "batch-wait", "MCP_OUTBOX_BATCH_WAIT", defaults.MaxBatchWait,
			"group commit: a batch stops taking calls this long after it began (0 means the default); no call ever waits for others to arrive"},
		{&cfg.retention.Calls, "calls-ttl", "MCP_OUTBOX_CALLS_TTL", defaults.CallRetention,
			"how long a call's key is remembered (a retry within it replays) and its record kept"},
		{&cfg.retention.Delivered, "delivered-ttl", "MCP_OUTBOX_DELIVERED_TTL", defaults.DeliveredRetention,
			"how long delivered effects are kept before the reaper purges them"},
	} {
		v, err := env.envDuration(f.env, f.def)
		if err != nil {
			return err
		}
		fs.DurationVar(f.d, f.flag, v, f.usage+" ["+f.env+"]")
	}
	fs.StringVar(&cfg.logLevel, "log-level", env.envDefault("MCP_OUTBOX_LOG_LEVEL", "info"), "debug, info, warn or error [MCP_OUTBOX_LOG_LEVEL]")
	fs.StringVar(&cfg.logFormat, "log-format", env.envDefault("MCP_OUTBOX_LOG_FORMAT", "text"), "text or json [MCP_OUTBOX_LOG_FORMAT]")
	fs.BoolVar(&cfg.logSensitive, "log-sensitive", false,
		"DEBUGGING ONLY: put raw idempotency keys and tool arguments in the call and delivery events; anyone who can read the logs can then replay calls")
	return nil
}

// ledgerFlags are the flags of the example ledger, which the proxy has not.
func (cfg *appConfig) ledgerFlags(env *environment, fs *flag.FlagSet) error {
	delay, err := env.envDuration("MCP_OUTBOX_DEMO_DELAY", 0)
	if err != nil {
		return err
	}
	fs.DurationVar(&cfg.demoDelay, "demo-delay", delay, "simulated processing time inside charge, after its write and before its commit, to reproduce client timeouts; on SQLite other writes wait for it [MCP_OUTBOX_DEMO_DELAY]")
	fs.BoolVar(&cfg.bare, "bare", false, "run the ledger WITHOUT the outbox layer: every retry charges again (for demonstrations)")
	fs.Var((*multiFlag)(&cfg.tasks), "task", "make calls of a tool MCP tasks: `TOOL=always|required|after:DURATION`, repeatable; see Tasks above [MCP_OUTBOX_TASKS]")
	fs.DurationVar(&cfg.taskPoll, "task-poll", defaults.TaskPollInterval, "how often Tasks clients are told to poll a task (pollIntervalMs)")
	retentionFlag(fs, &cfg.retentions)
	return nil
}

// keyRetention is the layer's Options.KeyRetention: --calls-ttl, or its
// default for 0.
func (cfg *appConfig) keyRetention() time.Duration {
	if cfg.retention.Calls > 0 {
		return cfg.retention.Calls
	}
	return defaults.KeyRetention
}

// openStore opens what every server command needs: the database, the
// destinations, the logger, the metrics and (unless bare) the layer.
func openStore(ctx context.Context, env *environment, cfg *appConfig) (*app, error) {
	dur, err := schema.ParseDurability(cfg.durability)
	if err != nil {
		return nil, usageError{err}
	}
	dests, err := destconfig.Parse(env.environ(), cfg.dests)
	if err != nil {
		return nil, usageError{err}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"fingerprint-window", cfg.fingerprint}, {"in-flight-wait", cfg.inFlightWait}, {"demo-delay", cfg.demoDelay}, {"lease", cfg.lease},
		{"calls-ttl", cfg.retention.Calls}, {"delivered-ttl", cfg.retention.Delivered}, {"batch-wait", cfg.batchWait}} {
		if d.v < 0 {
			return nil, usagef("--%s %v: must not be negative", d.flag, d.v)
		}
	}
	if cfg.batchCalls < 0 {
		return nil, usagef("--batch-calls %d: must not be negative", cfg.batchCalls)
	}
	keys, err := loadKeys(cfg.keyFile)
	if err != nil {
		return nil, err
	}
	logger := cfg.logger
	if logger == nil {
		if logger, err = newLogger(env.stderr, cfg.logLevel, cfg.logFormat); err != nil {
			return nil, err
		}
	}
	db, err := openWaiting(ctx, cfg.db, &schema.Options{Durability: dur}, logger, cfg.dbWaiting)
	if err != nil {
		return nil, err
	}
	a := &app{db: db, dests: dests, logger: logger, keys: keys, logSensitive: cfg.logSensitive, retention: cfg.retention,
		stopBound: cfg.shutdownTimeout, inflight: cfg.inflight}
	a.metricsRegistry = prometheus.NewRegistry()
	a.metrics = outbox.NewMetrics(a.metricsRegistry)
	if cfg.bare {
		return a, nil
	}
	window := cfg.fingerprint
	if window == 0 {
		window = outbox.FingerprintOff
	}
	if cfg.service != "" {
		if a.tracerProvider, a.stopTracing, err = setupTracing(ctx, env, cfg.service, env.stderr, logger); err != nil {
			db.Close()
			return nil, err
		}
	}
	a.layer, err = outbox.New(db, &outbox.Options{Logger: logger, FingerprintWindow: window, InFlightWait: cfg.inFlightWait, Lease: cfg.lease, KeyRetention: cfg.retention.Calls, Metrics: a.metrics, LogSensitive: cfg.logSensitive,
		MaxBatchCalls: cfg.batchCalls, MaxBatchWait: cfg.batchWait, TracerProvider: a.tracerProvider, Keys: keys,
		// nil, the layer's clock, except in a failpoints build told to skew it.
		Now: testclock.Now()})
	if err != nil {
		a.Close()
		if errors.Is(err, outbox.ErrKeyRequired) {
			// A flag missing for this database: the operator's to fix.
			return nil, usageError{err}
		}
		return nil, err
	}
	return a, nil
}

// parseLedgerRetention parses --retention for the ledger's tools into
// cfg.toolRetention; it runs before the database is opened, so that a
// typo creates no file.
func (cfg *appConfig) parseLedgerRetention(env *environment) error {
	r, err := parseRetention(env, cfg.retentions, cfg.keyRetention(), func(item, tool string) error {
		switch tool {
		case "charge", "refund":
			return nil
		case "balance":
			return usagef("--retention %q: balance is read-only, so its calls are never recorded", item)
		}
		return usagef("--retention %q: no tool %q (charge or refund)", item, tool)
	})
	cfg.toolRetention = r
	return err
}

// openApp opens the example ledger server.
func openApp(ctx context.Context, env *environment, cfg *appConfig) (*app, error) {
	a, err := openStore(ctx, env, cfg)
	if err != nil {
		return nil, err
	}
	if err := ledger.Migrate(ctx, a.db); err != nil {
		a.db.Close()
		return nil, err
	}
	impl := &mcp.Implementation{Name: "mcp-outbox-ledger", Title: "mcp-outbox example payments ledger", Version: serverVersion()}
	sopts := &mcp.ServerOptions{Logger: a.logger.With("subsystem", "mcp")}
	taskValues := cfg.tasks
	if len(taskValues) == 0 { // a flag wins over the environment
		taskValues = taskFlagDefault(env)
	}
	tasks, err := parseTasks(taskValues)
	if err != nil {
		a.Close()
		return nil, err
	}
	if cfg.taskPoll < 0 {
		a.Close()
		return nil, usagef("--task-poll %v: want a positive duration", cfg.taskPoll)
	}
	for tool, o := range tasks {
		o.PollInterval = cfg.taskPoll // 0: the library's default
		tasks[tool] = o
	}
	lopts := &ledger.Options{Delay: cfg.demoDelay, Tasks: tasks, Retention: cfg.toolRetention}
	if a.layer == nil {
		a.server = mcp.NewServer(impl, sopts)
		ledger.RegisterBare(a.db, a.server, lopts)
		return a, nil
	}
	a.server = a.layer.NewServer(impl, &outbox.ServerOptions{MCP: sopts})
	ledger.Register(a.layer, a.server, lopts)
	return a, nil
}

func (a *app) Close() error {
	if a.stopTracing != nil {
		a.stopTracing() // the last spans, the dispatcher's included, go out
	}
	return a.db.Close()
}

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

// start delivers effects and purges expired records in the background
// from now on (Layer.Start): at once for what a previous run left, then as
// calls commit. With no --dest no dispatcher runs here: effects stay queued
// for 'drain' or a serve that knows their destinations, and the ones
// waiting are named in a warning. The returned function stops both
// (finishing deliveries in flight, up to the dispatcher's shutdown
// timeout) and waits; it must run after serving ended and before the
// database closes.
func (a *app) start(ctx context.Context) (stop func(), err error) {
	if a.layer == nil {
		return func() {}, nil
	}
	opts := &outbox.StartOptions{Retention: a.retention}
	if len(a.dests) == 0 {
		opts.NoDispatcher = true
		warnUnconfigured(ctx, a)
		// What a process without --dest enqueues waits for another one
		// that has the destination: right for a split deployment, but a
		// stranger's proxy without --dest kept its effects pending and
		// said nothing. The first commit that enqueues says so.
		var once sync.Once
		a.layer.OnEnqueue(func() {
			once.Do(func() {
				a.logger.Warn("effects were enqueued, and this process delivers none (no --dest): they stay queued " +
					"until a process with --dest for their destination runs (serve, proxy or drain)")
			})
		})
	} else {
		opts.Dispatcher = &dispatch.Options{Destinations: a.dests, LogSensitive: a.logSensitive}
	}
	r, err := a.layer.Start(ctx, opts)
	if err != nil {
		return nil, usageError{err}
	}
	a.runner.Store(r)
	return func() {
		bound := a.stopBound
		if bound <= 0 {
			bound = mcphttp.DefaultShutdownTimeout
		}
		// Bounded: a task that ignores its context would otherwise hold
		// the process up for as long as it runs.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			a.logger.Error("stop the dispatcher and the reaper", "error", err)
		}
	}, nil
}

// warnUnconfigured says which destinations have effects waiting but no URL
// here: they stay queued until a process that knows them delivers them.
func warnUnconfigured(ctx context.Context, a *app) {
	known := map[string]bool{}
	for _, d := range a.dests {
		known[d.Name] = true
	}
	counts, err := opsquery.CountEffectsByDestination(ctx, a.db)
	if err != nil {
		return
	}
	for _, c := range counts {
		if c.Pending > 0 && !known[c.Destination] {
			a.logger.Warn("effects are waiting for a destination that is not configured; they stay queued",
				"destination", c.Destination, "pending", c.Pending, "configure", "--dest "+c.Destination+"=URL")
		}
	}
}
