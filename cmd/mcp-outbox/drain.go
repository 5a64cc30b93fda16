package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/destconfig"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

const drainUsage = `Usage: mcp-outbox drain [flags]

Delivers every effect that is due to the configured destinations, waiting
for retries that come due, then exits with a summary by state. For deploy
hooks and Kubernetes preStop: run it after the server stopped taking calls.

A database error that passes (PostgreSQL restarting or not up yet, SQLite
locked by another process) is retried with backoff within --timeout.

Exit status:
  0  nothing is left to deliver (every effect delivered or cancelled)
  1  an error (database, configuration)
  2  a usage error
  3  effects are left dead or unknown: see 'mcp-outbox outbox list --state dead'
  4  the timeout passed with effects still pending or in flight

Effects for destinations not configured here are not touched, and do not
count as left to deliver.

Tracing: as for serve ('mcp-outbox serve --help'), set by the OTEL_*
variables and off without them; each delivery attempt is a client span in
the trace of the call that enqueued the effect. The service name defaults
to mcp-outbox-drain.

` + destconfig.Help

// Exit codes of drain beyond the common ones.
const (
	exitLeftDeadOrUnknown exitCode = 3
	exitTimedOut          exitCode = 4
)

func runDrain(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "drain", drainUsage)
	db := fs.String("db", env.envDefault("MCP_OUTBOX_DB", "./mcp-outbox.db"), "the database: an SQLite `file`, or a postgres:// URL [MCP_OUTBOX_DB]")
	var dests multiFlag
	fs.Var(&dests, "dest", "destination `NAME=URL[;SETTING=VALUE...]`, repeatable [MCP_OUTBOX_DEST_<NAME>=URL]")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up waiting for pending effects after this long")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	logLevel := fs.String("log-level", env.envDefault("MCP_OUTBOX_LOG_LEVEL", "warn"), "debug, info, warn or error [MCP_OUTBOX_LOG_LEVEL]")
	var keyFile string
	keyFileFlag(env, fs, &keyFile)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	keys, err := loadKeys(keyFile)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	destinations, err := destconfig.Parse(env.environ(), dests)
	if err != nil {
		return usageError{err}
	}
	if len(destinations) == 0 {
		return usagef("no destinations: give --dest NAME=URL or MCP_OUTBOX_DEST_<NAME>=URL")
	}
	logger, err := newLogger(env.stderr, *logLevel, "text")
	if err != nil {
		return err
	}
	tp, stopTracing, err := setupTracing(ctx, env, drainService, env.stderr, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var d *schema.DB
	if schema.IsPostgresURL(*db) {
		// A deploy hook runs while databases restart too: wait for it
		// within --timeout, as Drain waits out its errors.
		d, err = openWaiting(dctx, *db, nil, logger, nil)
	} else {
		d, err = openExisting(ctx, *db)
	}
	if err != nil {
		return err
	}
	defer d.Close()
	// Without the key file every sealed effect would be claimed, fail to
	// open, and be put back an attempt poorer and a minute later, until
	// --timeout; refuse before touching one.
	if err := sealing.RequireKeyFile(dctx, d.Read, sealing.Of(keys)); err != nil {
		if errors.Is(err, sealing.ErrKeyRequired) {
			return usageError{err}
		}
		return err
	}
	disp, err := dispatch.New(d, &dispatch.Options{Destinations: destinations, Logger: logger, TracerProvider: tp, Keys: keys})
	if err != nil {
		return usageError{err}
	}

	progress := newProgress(env.stderr)
	var show func(opsquery.Counts) // only a terminal gets progress: counting costs
	if progress.tty {
		show = progress.show
	}
	counts, err := disp.Drain(dctx, show)
	progress.done()
	timedOut := errors.Is(err, context.DeadlineExceeded)
	if err != nil && !timedOut {
		if ctx.Err() != nil {
			return fmt.Errorf("drain interrupted: %w", ctx.Err())
		}
		return err
	}
	if err := printDrainSummary(env.stdout, counts, time.Since(start), *asJSON); err != nil {
		return err
	}
	switch {
	case counts.Dead > 0 || counts.Unknown > 0:
		return exitLeftDeadOrUnknown
	case timedOut && counts.Open() > 0:
		return exitTimedOut
	}
	return nil
}

func printDrainSummary(w io.Writer, c opsquery.Counts, took time.Duration, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(struct {
			opsquery.Counts
			Seconds float64 `json:"seconds"`
		}{c, took.Seconds()})
	}
	_, err := fmt.Fprintf(w, "drained in %s: delivered %d, pending %d, in_flight %d, dead %d, unknown %d, cancelled %d\n",
		took.Round(time.Millisecond), c.Delivered, c.Pending, c.InFlight, c.Dead, c.Unknown, c.Cancelled)
	if err == nil && c.Dead+c.Unknown > 0 {
		_, err = fmt.Fprintf(w, "%d dead and %d unknown effects need an operator: mcp-outbox outbox list --state dead|unknown\n", c.Dead, c.Unknown)
	}
	return err
}

// progress rewrites one status line on a terminal; elsewhere (a log file,
// a CI job) it stays silent and the summary says it all.
type progress struct {
	w    io.Writer
	tty  bool
	last time.Time
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// show rewrites the line; Drain calls it at most every 100 ms.
func (p *progress) show(c opsquery.Counts) {
	p.last = time.Now()
	fmt.Fprintf(p.w, "\rdelivered %d, pending %d, in flight %d, dead %d, unknown %d   ", c.Delivered, c.Pending, c.InFlight, c.Dead, c.Unknown)
}

func (p *progress) done() {
	if p.tty && !p.last.IsZero() {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
