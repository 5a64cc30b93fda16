package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

const purgeUsage = `Usage: mcp-outbox purge [flags]

Deletes the records the outbox no longer needs, so that the database does
not grow without bound, and prints how many:

  calls              completed or failed calls whose key has expired (a
                     retry would run them again anyway) and that completed
                     longer than --calls-ttl ago (or their tool's own outcome
                     time, serve --retention TOOL=outcome:DURATION, when the
                     call was made with one), unless one of their effects
                     is still pending, in flight, dead or unknown
  delivered effects  delivered longer than --delivered-ttl ago
  cancelled effects  cancelled longer than --cancelled-ttl ago

Dead and unknown effects are never purged: resolve, retry or cancel them
first (see 'mcp-outbox outbox --help'). Calls in state unknown are never
purged either: settle them with 'mcp-outbox outbox resolve-call'. A claim
abandoned long ago (lease past by more than --calls-ttl) is deleted, so a
retry runs the call; if the call had been forwarded to a tool server that
keeps its work outside the call's transaction, it becomes unknown instead.
The status of a purged call is "not_found: expired or never seen".

It is safe to run while serve runs: rows go in transactions of at most a
thousand, between which tool calls proceed.`

func runPurge(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "purge", purgeUsage)
	db := fs.String("db", env.envDefault("MCP_OUTBOX_DB", "./mcp-outbox.db"), "the database: an SQLite `file`, or a postgres:// URL [MCP_OUTBOX_DB]")
	dryRun := fs.Bool("dry-run", false, "count what would be purged, delete nothing")
	var r outbox.Retention
	fs.DurationVar(&r.Calls, "calls-ttl", defaults.CallRetention, "keep calls at least this long after they completed")
	fs.DurationVar(&r.Delivered, "delivered-ttl", defaults.DeliveredRetention, "keep delivered effects this long")
	fs.DurationVar(&r.Cancelled, "cancelled-ttl", defaults.CancelledRetention, "keep cancelled effects this long")
	asJSON := fs.Bool("json", false, "print the counts as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	// Zero would silently mean the library's default, not "purge at once".
	for name, d := range map[string]time.Duration{"calls-ttl": r.Calls, "delivered-ttl": r.Delivered, "cancelled-ttl": r.Cancelled} {
		if d <= 0 {
			return usagef("--%s must be positive", name)
		}
	}
	d, err := openExisting(ctx, *db)
	if err != nil {
		return err
	}
	defer d.Close()
	c, err := admin.Purge(ctx, d, &admin.PurgeOptions{Retention: r, DryRun: *dryRun})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(env.stdout).Encode(struct {
			admin.PurgeCounts
			DryRun bool `json:"dryRun"`
		}{c, *dryRun})
	}
	verb := "purged"
	if *dryRun {
		verb = "would purge (dry run)"
	}
	_, err = fmt.Fprintf(env.stdout, "%s: %d calls, %d delivered effects, %d cancelled effects\n",
		verb, c.Calls, c.DeliveredEffects, c.CancelledEffects)
	if err == nil && c.UnknownCalls > 0 {
		verb = "became"
		if *dryRun {
			verb = "would become"
		}
		_, err = fmt.Fprintf(env.stdout, "%d abandoned forwarded calls %s unknown: settle them with 'mcp-outbox outbox resolve-call' (see 'mcp-outbox outbox calls')\n",
			c.UnknownCalls, verb)
	}
	return err
}
