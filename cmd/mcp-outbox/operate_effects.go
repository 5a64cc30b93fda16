package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/outbox/destconfig"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func runOutboxList(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	state := fs.String("state", "", "only effects in this `state`: "+strings.Join(operate.EffectStateNames(), ", "))
	dest := fs.String("dest", "", "only effects for this destination `name`")
	limit := fs.Int("limit", operate.DefaultListLimit, fmt.Sprintf("at most `N` effects, the newest (1 to %d)", operate.MaxListLimit))
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("list: unexpected argument %q", pos[0])
	}
	f, err := operate.ParseEffectFilter(*state, *dest, *limit)
	if err != nil {
		return cliError(err)
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := opsquery.ListEffects(ctx, db, f)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, rows)
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintln(env.stdout, "no effects")
		return err
	}
	return operate.WriteEffectTable(env.stdout, rows)
}

func runOutboxSummary(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	asJSON := fs.Bool("json", false, "print the counts as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("summary: unexpected argument %q", pos[0])
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	sum, err := operate.SummarizeEffects(ctx, db)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, sum)
	}
	c := sum.Counts
	width := len(strconv.Itoa(sum.Total))
	for _, l := range []struct {
		state string
		n     int
	}{{"pending", c.Pending}, {"in_flight", c.InFlight}, {"delivered", c.Delivered}, {"dead", c.Dead},
		{"unknown", c.Unknown}, {"cancelled", c.Cancelled}, {"total", sum.Total}} {
		fmt.Fprintf(env.stdout, "%-10s %*d\n", l.state, width, l.n)
	}
	if c.Dead+c.Unknown > 0 {
		fmt.Fprintf(env.stdout, "%d dead and %d unknown effects need an operator: mcp-outbox outbox list --state dead|unknown\n", c.Dead, c.Unknown)
	}
	fmt.Fprintf(env.stdout, "unknown calls: %d\n", sum.UnknownCalls)
	if sum.UnknownCalls > 0 {
		fmt.Fprintf(env.stdout, "%d unknown calls need an operator: mcp-outbox outbox calls\n", sum.UnknownCalls)
	}
	return nil
}

func runOutboxRetry(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	dead := fs.Bool("dead", false, "retry every dead effect")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *dead && len(pos) == 0:
		db, err := openExisting(ctx, *dbPath)
		if err != nil {
			return err
		}
		defer db.Close()
		n, err := admin.RetryDead(ctx, db)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(env.stdout, "retried %d dead effects\n", n)
		return err
	case *dead:
		return usagef("retry: give an effect ID or --dead, not both")
	case len(pos) != 1:
		return usagef("retry: give one effect ID, or --dead")
	}
	return runEffectAction(ctx, env, *dbPath, "retry", pos[0], "")
}

func runOutboxCancel(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	dest := fs.String("dest", "", "cancel every pending effect of the destination `NAME`")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	destGiven := false
	fs.Visit(func(f *flag.Flag) { destGiven = destGiven || f.Name == "dest" })
	switch {
	case destGiven && len(pos) > 0:
		return usagef("cancel: give an effect ID or --dest, not both")
	case destGiven:
		return runDestinationAction(ctx, env, *dbPath, func(db *schema.DB) (*operate.DestinationResult, error) {
			return operate.CancelPendingOf(ctx, db, *dest)
		}, func() error { return operate.CheckDestName(*dest) })
	case len(pos) != 1:
		return usagef("cancel: give one effect ID, or --dest NAME")
	}
	return runEffectAction(ctx, env, *dbPath, "cancel", pos[0], "")
}

func runOutboxRetarget(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	from := fs.String("from", "", "the destination `NAME` the pending effects have now")
	to := fs.String("to", "", "the destination `NAME` to move them to: configured (MCP_OUTBOX_DEST_<NAME>) or delivered to before")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("retarget: unexpected argument %q (give the names with --from and --to)", pos[0])
	}
	// The configuration serve reads, for the names alone: a destination
	// configured there may not have delivered anything yet.
	dests, err := destconfig.Parse(env.environ(), nil)
	if err != nil {
		return usageError{err}
	}
	var configured []string
	for _, d := range dests {
		configured = append(configured, d.Name)
	}
	return runDestinationAction(ctx, env, *dbPath, func(db *schema.DB) (*operate.DestinationResult, error) {
		known, err := operate.KnownDestinations(ctx, db, configured)
		if err != nil {
			return nil, err
		}
		res, err := operate.RetargetPending(ctx, db, *from, *to, known)
		if err != nil && !slices.Contains(known, *to) {
			// The one way to name a destination that has not delivered yet.
			err = fmt.Errorf("%w (if %q is configured but has delivered nothing yet, give its URL as serve reads it: %s%s=URL)",
				err, *to, destconfig.EnvPrefix, strings.ToUpper(*to))
		}
		return res, err
	}, func() error { return operate.CheckRetarget(*from, *to) })
}

// runDestinationAction checks the names before it opens the database, so
// that a mistyped command changes nothing, then runs act, reports what it
// did and logs it on stderr as an operator action.
func runDestinationAction(ctx context.Context, env *environment, dbPath string,
	act func(*schema.DB) (*operate.DestinationResult, error), check func() error) error {
	if err := check(); err != nil {
		return cliError(err)
	}
	db, err := openExisting(ctx, dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := act(db)
	if err != nil {
		return cliError(err)
	}
	logger, err := newLogger(env.stderr, "info", "text")
	if err != nil {
		return err
	}
	if res.Action == "retarget" {
		logger.Info("operator action", "action", "retarget", "from", res.Destination, "to", res.To,
			"effects", res.Effects, "db", schema.Redact(dbPath))
		_, err = fmt.Fprintf(env.stdout, "moved %d pending effects from %q to %q\n", res.Effects, res.Destination, res.To)
		return err
	}
	logger.Info("operator action", "action", "cancel-destination", "destination", res.Destination,
		"effects", res.Effects, "db", schema.Redact(dbPath))
	_, err = fmt.Fprintf(env.stdout, "cancelled %d pending effects of %q\n", res.Effects, res.Destination)
	return err
}

func runOutboxResolve(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("resolve: give an effect ID and delivered or retry")
	}
	return runEffectAction(ctx, env, *dbPath, "resolve", pos[0], pos[1])
}

// runEffectAction validates everything it can before it opens the
// database, so that a mistyped command changes nothing.
func runEffectAction(ctx context.Context, env *environment, dbPath, name, idArg, outcome string) error {
	a, _ := operate.FindEffectAction(name)
	id, err := operate.ParseEffectID(idArg)
	if err != nil {
		return cliError(err)
	}
	if err := a.CheckOutcome(outcome); err != nil {
		return cliError(err)
	}
	db, err := openExisting(ctx, dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := operate.ApplyEffectAction(ctx, db, a, id, outcome)
	if err != nil {
		return cliError(err)
	}
	e := res.Effect
	fmt.Fprintf(env.stdout, "effect %d (%s %s to %s): was %s, now %s\n",
		e.ID, e.Method, operate.Shorten(e.Path, 60), operate.Shorten(e.Destination, 40), res.PreviousState, e.State)
	if res.Warning != "" {
		fmt.Fprintf(env.stderr, "warning: %s\n", res.Warning)
	}
	return nil
}
