package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/testclock"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/destconfig"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

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
