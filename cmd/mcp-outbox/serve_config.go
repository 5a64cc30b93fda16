package main

import (
	"flag"
	"log/slog"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/outbox"
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
