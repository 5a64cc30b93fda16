package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// This file holds the operator actions on effects and unknown calls twice over: as
// `mcp-outbox outbox` and as the shared pieces (validation, the action
// table, error kinds) that admin.go serves over HTTP, so that the command
// line and the API accept and refuse exactly the same things.

// effectStates are the states of an effect and what each means to an
// operator. Validation and help text both come from this list.
var effectStates = []struct{ name, meaning string }{
	{"pending", "waiting for its next attempt: new, or retrying after a failure"},
	{"in_flight", "a dispatcher holds it under a lease and an attempt is under way; no\noperator action applies. If that dispatcher died, the next serve or\ndrain takes it back (at once on this host, else when the lease passes)"},
	{"delivered", "the destination answered 2xx (or a probe or an operator said it has it)"},
	{"dead", "given up: the destination refused it (any answer but 2xx, 408, 409,\n425, 429 or 5xx), or max_attempts or max_age was reached"},
	{"unknown", "at an at_most_once destination, a request left and no answer came:\nit may or may not have been applied, so it is never sent again by\nitself; a probe or an operator settles it"},
	{"cancelled", "stopped by an operator; it will not be delivered"},
}

func effectStateNames() []string {
	names := make([]string, len(effectStates))
	for i, s := range effectStates {
		names[i] = s.name
	}
	return names
}

func statesHelp() string {
	var b strings.Builder
	for _, s := range effectStates {
		lines := strings.Split(s.meaning, "\n")
		fmt.Fprintf(&b, "  %-10s %s\n", s.name, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(&b, "  %-10s %s\n", "", l)
		}
	}
	return b.String()
}

// badInput is a request the operator got wrong: a usage error on the
// command line, 400 from the API.
type badInput struct{ error }

func badInputf(format string, args ...any) error { return badInput{fmt.Errorf(format, args...)} }

// Bounds of a listing. The upper bound keeps an API response (each row
// may carry a recorded response of a few KiB) to a sane size.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// effectFilter validates a listing's filters.
func effectFilter(state, dest string, limit int) (query.EffectFilter, error) {
	if state != "" && !slices.Contains(effectStateNames(), state) {
		return query.EffectFilter{}, badInputf("state %q: want one of %s", state, strings.Join(effectStateNames(), ", "))
	}
	if limit < 1 || limit > maxListLimit {
		return query.EffectFilter{}, badInputf("limit %d: want 1 to %d", limit, maxListLimit)
	}
	return query.EffectFilter{State: state, Destination: dest, Limit: limit}, nil
}

// parseEffectID reads an effect id from the command line or a URL.
func parseEffectID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, badInputf("effect id %q: want a positive integer", s)
	}
	return id, nil
}

// Outcomes an operator can resolve an effect to.
const (
	outcomeDelivered = "delivered"
	outcomeRetry     = "retry"
)

// effectAction is an operator action on one effect.
type effectAction struct {
	name string
	// from lists the states the action applies to. The library's
	// statements are the authority; TestEffectActionStates checks that this
	// list says the same, since help and errors quote it.
	from []string
	// outcome is set for resolve, which takes delivered or retry.
	outcome bool
	run     func(ctx context.Context, db *schema.DB, id int64, outcome string) error
}

var effectActions = []effectAction{
	{
		name: "retry",
		from: []string{"dead", "unknown", "pending", "cancelled"},
		run: func(ctx context.Context, db *schema.DB, id int64, _ string) error {
			return outbox.RetryEffect(ctx, db, id)
		},
	},
	{
		name: "cancel",
		from: []string{"pending", "dead", "unknown"},
		run: func(ctx context.Context, db *schema.DB, id int64, _ string) error {
			return outbox.CancelEffect(ctx, db, id)
		},
	},
	{
		name:    "resolve",
		from:    []string{"unknown", "dead"},
		outcome: true,
		run: func(ctx context.Context, db *schema.DB, id int64, outcome string) error {
			return outbox.ResolveEffect(ctx, db, id, outcome == outcomeDelivered)
		},
	},
}

// checkOutcome validates resolve's outcome; other actions take none.
func (a effectAction) checkOutcome(outcome string) error {
	switch {
	case !a.outcome && outcome != "":
		return badInputf("%s takes no outcome", a.name)
	case a.outcome && outcome != outcomeDelivered && outcome != outcomeRetry:
		return badInputf("outcome %q: want %s (the destination has it) or %s (it does not; send it again)",
			outcome, outcomeDelivered, outcomeRetry)
	}
	return nil
}

func findAction(name string) (effectAction, bool) {
	for _, a := range effectActions {
		if a.name == name {
			return a, true
		}
	}
	return effectAction{}, false
}

// actionResult is what an action did, for the command line and the API.
type actionResult struct {
	Effect        query.EffectRow `json:"effect"`
	PreviousState string          `json:"previousState"`
	Warning       string          `json:"warning,omitempty"`
}

// applyEffectAction validates and runs an action on effect id.
func applyEffectAction(ctx context.Context, db *schema.DB, a effectAction, id int64, outcome string) (*actionResult, error) {
	if err := a.checkOutcome(outcome); err != nil {
		return nil, err
	}
	before, err := readEffect(ctx, db, id)
	if err != nil {
		return nil, err
	}
	// ResolveEffect with retry is RetryEffect, which also takes pending and
	// cancelled effects; resolving either would be a mistake (un-cancelling
	// one, for instance), so resolve keeps to its own states here. The check
	// reads before it writes, but RetryEffect's own statement still never
	// touches an effect in flight.
	if a.outcome && !slices.Contains(a.from, before.State) {
		return nil, newStateError(a, id, before.State, outbox.ErrNotResolvable)
	}
	if err := a.run(ctx, db, id, outcome); err != nil {
		if errors.Is(err, outbox.ErrEffectState) || errors.Is(err, outbox.ErrNotResolvable) {
			now, rerr := readEffect(ctx, db, id)
			if rerr != nil {
				return nil, rerr
			}
			return nil, newStateError(a, id, now.State, outbox.ErrEffectState)
		}
		return nil, err
	}
	after, err := readEffect(ctx, db, id)
	if err != nil {
		return nil, err
	}
	res := &actionResult{Effect: *after, PreviousState: before.State}
	if before.State == "unknown" && after.State == "pending" {
		// Only at_most_once destinations make effects unknown.
		res.Warning = fmt.Sprintf("effect %d was unknown and will be sent again; its destination cannot dedup, "+
			"so if it applied the first request it applies this one too", id)
	}
	return res, nil
}

// stateError says what the effect's state is and what the action needs;
// it matches the library's sentinel without repeating its text.
type stateError struct {
	msg      string
	sentinel error
}

func (e *stateError) Error() string { return e.msg }
func (e *stateError) Unwrap() error { return e.sentinel }

func newStateError(a effectAction, id int64, state string, sentinel error) error {
	return &stateError{fmt.Sprintf("effect %d is %s; %s applies only to %s effects", id, state, a.name, orList(a.from)), sentinel}
}

func readEffect(ctx context.Context, db *schema.DB, id int64) (*query.EffectRow, error) {
	rows, err := query.ListEffects(ctx, db.Read, query.EffectFilter{ID: id, Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("read effect %d: %w", id, err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("effect %d: %w", id, outbox.ErrNoEffect)
	}
	return &rows[0], nil
}

// effectSummary is the count of effects by state, with the total, and
// the number of calls in state unknown: the other thing that waits for an
// operator.
type effectSummary struct {
	query.Counts
	Total        int `json:"total"`
	UnknownCalls int `json:"unknownCalls"`
}

func summarizeEffects(ctx context.Context, db *schema.DB) (effectSummary, error) {
	c, err := query.CountEffects(ctx, db.Read)
	if err != nil {
		return effectSummary{}, err
	}
	n, err := query.CountUnknownCalls(ctx, db.Read)
	if err != nil {
		return effectSummary{}, err
	}
	return effectSummary{Counts: c, Total: c.Total(), UnknownCalls: n}, nil
}

// Unknown calls: a call forwarded to a tool server whose work is outside
// the call's transaction (mcp-outbox proxy), whose outcome was lost. It may
// or may not have run; an operator finds out and settles it.

// callOutcomes are the outcomes an operator can resolve an unknown call to,
// and what each means. Validation and help text both come from this list.
var callOutcomes = []struct{ name, meaning string }{
	{outbox.ResolveCompleted, "it ran and its work is done: record it as completed; a retry\nreplays the note as its result"},
	{outbox.ResolveFailed, "it ran and failed, or must not run: record it as failed; a retry\nreplays the note as a tool error"},
	{outbox.ResolveRerun, "it did not run: forget it, so that the next retry with its key\nruns it"},
}

func callOutcomeNames() []string {
	names := make([]string, len(callOutcomes))
	for i, o := range callOutcomes {
		names[i] = o.name
	}
	return names
}

func callOutcomesHelp() string {
	var b strings.Builder
	for _, o := range callOutcomes {
		lines := strings.Split(o.meaning, "\n")
		fmt.Fprintf(&b, "  %-10s %s\n", o.name, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(&b, "  %-10s %s\n", "", l)
		}
	}
	return b.String()
}

// maxNoteBytes bounds an operator's note: it becomes the text of the
// call's recorded result, which every retry replays to the client.
const maxNoteBytes = 1000

// callResolution is what resolving an unknown call did, for the command
// line and the API.
type callResolution struct {
	Principal     string      `json:"principal"`
	Key           string      `json:"key"`
	Tool          string      `json:"tool"`
	CallID        string      `json:"callId"`
	Outcome       string      `json:"outcome"`
	PreviousState query.State `json:"previousState"`
	// State is the call's state now: completed, failed, or not_found for
	// rerun (the call is forgotten; the next retry runs it).
	State query.State `json:"state"`
}

// callRef names the call a resolution is for: by principal and key, or by
// its call id (calls.uid, which the status tool, the logs and the page show
// and which is never reused).
type callRef struct {
	Principal, Key string
	CallID         string
}

// checkResolveCall validates a resolution before anything is opened.
func checkResolveCall(ref callRef, outcome, note string) error {
	switch {
	case ref.CallID != "" && ref.Key != "":
		return badInputf("give the call's key or its call id, not both")
	case ref.CallID != "":
		if len(ref.CallID) > 64 || strings.ContainsFunc(ref.CallID, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return badInputf("call id %q: want the callId the status tool shows, such as call_0123abcd", shorten(ref.CallID, 40))
		}
	default:
		if ref.Principal == "" {
			return badInputf("principal: empty")
		}
		if err := callkey.Validate(ref.Key); err != nil {
			return badInputf("key: %v", err)
		}
	}
	if !slices.Contains(callOutcomeNames(), outcome) {
		return badInputf("outcome %q: want %s", outcome, orList(callOutcomeNames()))
	}
	if len(note) > maxNoteBytes {
		return badInputf("note: %d bytes, the limit is %d", len(note), maxNoteBytes)
	}
	return nil
}

// resolveUnknownCall validates and settles the unknown call ref names.
func resolveUnknownCall(ctx context.Context, db *schema.DB, ref callRef, outcome, note string) (*callResolution, error) {
	if err := checkResolveCall(ref, outcome, note); err != nil {
		return nil, err
	}
	res := &callResolution{Principal: ref.Principal, Key: ref.Key, CallID: ref.CallID, Outcome: outcome, PreviousState: query.OutcomeUnknown}
	// For the report only: ResolveCall's own statement applies only to an
	// unknown call, and says what the call is if it is not one.
	var err error
	if ref.CallID != "" {
		err = db.Read.QueryRowContext(ctx, `SELECT tool, principal, key FROM calls WHERE uid = $1`, ref.CallID).
			Scan(&res.Tool, &res.Principal, &res.Key)
	} else {
		err = db.Read.QueryRowContext(ctx, `SELECT tool, uid FROM calls WHERE principal = $1 AND key = $2`, ref.Principal, ref.Key).
			Scan(&res.Tool, &res.CallID)
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("read the call: %w", err)
	}
	if ref.CallID != "" {
		err = outbox.ResolveCallUID(ctx, db, ref.CallID, outcome, note)
	} else {
		err = outbox.ResolveCall(ctx, db, ref.Principal, ref.Key, outcome, note)
	}
	if err != nil {
		if errors.Is(err, outbox.ErrCallOutcome) {
			return nil, badInput{err}
		}
		return nil, err
	}
	res.State = query.State(outcome)
	if outcome == outbox.ResolveRerun {
		res.State = query.NotFound
	}
	return res, nil
}

// keyRedacted is an error whose message names a call by its key's hash
// where the error it wraps quoted the raw key (outbox's and
// resolveUnknownCall's messages say `call "KEY" of PRINCIPAL`).
type keyRedacted struct {
	msg string
	err error
}

func (e *keyRedacted) Error() string { return e.msg }
func (e *keyRedacted) Unwrap() error { return e.err }

func redactKey(err error, principal, key string) error {
	if err == nil || key == "" {
		return err
	}
	return &keyRedacted{strings.ReplaceAll(err.Error(), strconv.Quote(key), "with key "+pageKeyHash(principal, key)), err}
}

func orList(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// The command line.

var outboxUsage = `Usage: mcp-outbox outbox <subcommand> [flags] [arguments]

Inspects and repairs the delivery of outbox effects: the downstream HTTP
requests that committed calls enqueued and the dispatcher in 'serve' delivers.
Works on the database file while serve runs; a running dispatcher picks up
what an action made pending within its poll interval (1s). Also settles calls
in state unknown (see below).

Subcommands:
  list [--state S] [--dest NAME] [--limit N] [--json]
                           effects, newest first
  summary [--json]         how many effects are in each state, and how many
                           calls are unknown
  retry ID                 send an effect again: dead, unknown, pending or
                           cancelled becomes pending, due now, with a fresh
                           attempt budget and the same Idempotency-Key
  retry --dead             retry every dead effect
  cancel ID                stop delivering a pending, dead or unknown effect
  resolve ID delivered     settle an unknown or dead effect that you found the
                           destination has: it becomes delivered, not sent again
  resolve ID retry         settle an unknown or dead effect that you found the
                           destination does not have: it is sent again
  calls [--limit N] [--json]
                           calls in state unknown, the oldest first
  resolve-call --key K [--principal P] --outcome completed|failed|rerun [--note TEXT]
                           settle an unknown call by what you found out

Effect states:
` + statesHelp() + `
Retrying an unknown effect sends its request again. Effects become unknown only
at at_most_once destinations, which do not dedup on Idempotency-Key: if the
first request was applied, the destination applies it a second time. Check the
destination first, then use 'resolve ID delivered' or 'resolve ID retry'.

The effects of one call are delivered in order: an effect waits while an
earlier one of its call is not delivered or cancelled. Cancelling a stuck
effect lets the ones after it go.

A call is unknown when mcp-outbox proxy forwarded it to a tool server that
keeps its work outside the outbox's transaction, and the outcome was lost (a
process died after forwarding). It may or may not have run. It never runs
again by itself: a retry with its key gets an "outcome unknown" error until
you check the tool server's own records and settle it with resolve-call:
` + callOutcomesHelp() + `
Unknown calls are never purged.

Every subcommand takes --db FILE (default $MCP_OUTBOX_DB, else ./mcp-outbox.db)
and refuses a file that does not exist. Exit status: 0 done, 1 failed (no
such effect or call, or not in a state the action applies to), 2 bad
arguments.
Run 'mcp-outbox outbox <subcommand> --help' for its flags.`

type outboxSub struct {
	name  string
	usage string
	run   func(ctx context.Context, env *environment, sub outboxSub, args []string) error
}

func outboxSubs() []outboxSub {
	return []outboxSub{
		{"list", `Usage: mcp-outbox outbox list [--state S] [--dest NAME] [--limit N] [--json] [--db FILE]

Lists effects, newest first: id, state, destination, request, attempts, last
HTTP status, when (next attempt for pending, delivery time for delivered,
last change otherwise; in UTC), the call's key and the last error, the long
ones shortened. --json prints every field of each row, unshortened.

States (--state):
` + statesHelp(), runOutboxList},
		{"summary", `Usage: mcp-outbox outbox summary [--json] [--db FILE]

Counts effects in each state, and the calls in state unknown. pending and
in_flight effects still need delivery work; dead and unknown effects, and
unknown calls, need an operator (see 'mcp-outbox outbox --help').`, runOutboxSummary},
		{"retry", `Usage: mcp-outbox outbox retry [--db FILE] ID
       mcp-outbox outbox retry [--db FILE] --dead

Makes a dead, unknown, pending or cancelled effect pending again, due now, with
a fresh attempt budget. It keeps its Idempotency-Key, so a destination that
dedups on it applies the request at most once however often it is retried.
--dead does this for every dead effect.

An unknown effect belongs to an at_most_once destination, which does not dedup:
retrying it SENDS IT AGAIN, and if the first request was applied, it is applied
twice. Prefer 'resolve ID delivered' or 'resolve ID retry' after checking the
destination.

An effect in flight cannot be retried; delivered effects are final.`, runOutboxRetry},
		{"cancel", `Usage: mcp-outbox outbox cancel [--db FILE] ID

Stops delivering a pending, dead or unknown effect: it becomes cancelled and is
never sent (again). A request that already left is not recalled. The effects
after it in the same call are no longer held back by it. 'retry ID' undoes a
cancel.`, runOutboxCancel},
		{"resolve", `Usage: mcp-outbox outbox resolve [--db FILE] ID delivered|retry

Settles an unknown or dead effect by what you found out at its destination:
  delivered  the destination has applied it: mark it delivered, never send it
  retry      the destination does not have it: make it pending and send it
             again (with the same Idempotency-Key)`, runOutboxResolve},
		{"calls", `Usage: mcp-outbox outbox calls [--limit N] [--json] [--db FILE]

Lists the calls in state unknown, the oldest first: principal, key, tool,
claims made, when the call was first made (UTC) and its call id. Each was
forwarded to a tool server that keeps its work outside the outbox's
transaction, and its outcome was lost: it may or may not have run, and it
never runs again by itself. Settle each with resolve-call. --json prints
every field of each row.`, runOutboxCalls},
		{"resolve-call", `Usage: mcp-outbox outbox resolve-call (--key K [--principal P] | --call-id ID) --outcome OUTCOME [--note TEXT] [--db FILE]

Settles a call in state unknown by what you found out in the tool server's
own records. OUTCOME is one of:
` + callOutcomesHelp() + `
The note (at most 1000 bytes) is recorded after "[resolved by an operator]"
as the text of the call's result, which retries replay to the client: say
what you found. The principal is "local" unless given: calls over stdio and
unauthenticated HTTP belong to it. --call-id names the call by its call id
instead (callId in the status tool and 'outbox calls', call_id in the logs),
which no other call ever has. Only an unknown call can be resolved.`, runOutboxResolveCall},
	}
}

func runOutbox(ctx context.Context, env *environment, args []string) error {
	if len(args) == 0 {
		return usagef("give a subcommand: list, summary, retry, cancel, resolve, calls or resolve-call")
	}
	name := args[0]
	if isHelpFlag(name) || (name == "help" && len(args) == 1) {
		fmt.Fprintln(env.stdout, outboxUsage)
		return flag.ErrHelp
	}
	if name == "help" {
		name, args = args[1], []string{args[1], "--help"}
	}
	for _, s := range outboxSubs() {
		if s.name == name {
			return s.run(ctx, env, s, args[1:])
		}
	}
	return usagef("unknown subcommand %q (want list, summary, retry, cancel, resolve, calls or resolve-call)", name)
}

// subFlags is the flag set of a subcommand, with the --db every one takes.
func subFlags(env *environment, s outboxSub) (*flag.FlagSet, *string) {
	fs := newFlagSet(env, "outbox "+s.name, s.usage)
	db := fs.String("db", env.envDefault("MCP_OUTBOX_DB", "./mcp-outbox.db"), "SQLite database `file` serve uses; must exist [MCP_OUTBOX_DB]")
	return fs, db
}

// parseInterspersed parses flags wherever they are among the arguments
// ("retry 42 --db x.db" as well as "retry --db x.db 42") and returns the
// arguments; everything after "--" is an argument.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// cliError turns an input mistake found by the shared validation into a
// usage error (exit 2).
func cliError(err error) error {
	if errors.As(err, new(badInput)) {
		return usageError{err}
	}
	return err
}

func runOutboxList(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	state := fs.String("state", "", "only effects in this `state`: "+strings.Join(effectStateNames(), ", "))
	dest := fs.String("dest", "", "only effects for this destination `name`")
	limit := fs.Int("limit", defaultListLimit, fmt.Sprintf("at most `N` effects, the newest (1 to %d)", maxListLimit))
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("list: unexpected argument %q", pos[0])
	}
	f, err := effectFilter(*state, *dest, *limit)
	if err != nil {
		return cliError(err)
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := query.ListEffects(ctx, db.Read, f)
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
	return writeEffectTable(env.stdout, rows)
}

// writeEffectTable prints rows for a terminal. Text that came from a
// destination (errors, paths) is stripped of control characters, so that
// it cannot move the cursor or recolour the operator's terminal.
func writeEffectTable(w io.Writer, rows []query.EffectRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tDEST\tREQUEST\tATTEMPTS\tSTATUS\tWHEN (UTC)\tCALL KEY\tLAST ERROR")
	for _, r := range rows {
		status := "-"
		if r.LastStatus != 0 {
			status = strconv.Itoa(r.LastStatus)
		}
		var when string
		switch {
		// An unknown effect's next_attempt_at is only when a probe may ask
		// about it; without a probe nothing happens then, so it shows
		// since when it is unknown instead.
		case r.State == "pending" && r.NextAttemptAt != nil:
			when = "next " + tableTime(*r.NextAttemptAt)
		case r.DeliveredAt != nil:
			when = "delivered " + tableTime(*r.DeliveredAt)
		default:
			when = "since " + tableTime(r.UpdatedAt)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n",
			r.ID, r.State, shorten(r.Destination, 20), shorten(r.Method+" "+r.Path, 40), r.Attempts, status,
			when, orDash(shorten(r.CallKey, 20)), orDash(shorten(r.LastError, 60)))
	}
	return tw.Flush()
}

func tableTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shorten makes s printable on one line and at most n characters long.
func shorten(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
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
	sum, err := summarizeEffects(ctx, db)
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
		n, err := outbox.RetryDead(ctx, db)
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
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("cancel: give one effect ID")
	}
	return runEffectAction(ctx, env, *dbPath, "cancel", pos[0], "")
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
	a, _ := findAction(name)
	id, err := parseEffectID(idArg)
	if err != nil {
		return cliError(err)
	}
	if err := a.checkOutcome(outcome); err != nil {
		return cliError(err)
	}
	db, err := openExisting(ctx, dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := applyEffectAction(ctx, db, a, id, outcome)
	if err != nil {
		return cliError(err)
	}
	e := res.Effect
	fmt.Fprintf(env.stdout, "effect %d (%s %s to %s): was %s, now %s\n",
		e.ID, e.Method, shorten(e.Path, 60), shorten(e.Destination, 40), res.PreviousState, e.State)
	if res.Warning != "" {
		fmt.Fprintf(env.stderr, "warning: %s\n", res.Warning)
	}
	return nil
}

func runOutboxCalls(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	limit := fs.Int("limit", defaultListLimit, fmt.Sprintf("at most `N` calls, the oldest (1 to %d)", maxListLimit))
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("calls: unexpected argument %q", pos[0])
	}
	if *limit < 1 || *limit > maxListLimit {
		return usagef("limit %d: want 1 to %d", *limit, maxListLimit)
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := query.ListUnknownCalls(ctx, db.Read, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, rows)
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintln(env.stdout, "no unknown calls")
		return err
	}
	// Keys are shown whole (at most 255 bytes), for resolve-call to take;
	// shorten only blanks control characters, which a valid key has none of.
	tw := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tKEY\tTOOL\tATTEMPTS\tCREATED (UTC)\tCALL ID")
	for _, c := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", shorten(c.Principal, 60), shorten(c.Key, callkey.MaxKeyBytes),
			shorten(c.Tool, 40), c.Attempts, tableTime(c.CreatedAt), c.CallID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintln(env.stdout, "Settle each with: mcp-outbox outbox resolve-call --key KEY [--principal P] --outcome completed|failed|rerun --note TEXT")
	return err
}

func runOutboxResolveCall(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	key := fs.String("key", "", "the idempotency `key` of the call")
	principal := fs.String("principal", outbox.LocalPrincipal, "whose call it is: local, or a token's principal (alice or user:alice)")
	callID := fs.String("call-id", "", "instead of --key and --principal: the call's `id` (callId in the status tool, call_id in the logs)")
	outcome := fs.String("outcome", "", "what you found out: "+strings.Join(callOutcomeNames(), ", "))
	note := fs.String("note", "", "what you found, recorded in the call's result (at most 1000 bytes)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("resolve-call: unexpected argument %q (give the key with --key)", pos[0])
	}
	if *principal != "" { // an explicit empty principal is refused below
		*principal = outbox.ParsePrincipal(*principal)
	}
	ref := callRef{Principal: *principal, Key: *key, CallID: *callID}
	if *callID != "" {
		ref.Principal = ""
	}
	if err := checkResolveCall(ref, *outcome, *note); err != nil {
		return cliError(err)
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := resolveUnknownCall(ctx, db, ref, *outcome, *note)
	if err != nil {
		return cliError(err)
	}
	what := "now " + string(res.State)
	if res.Outcome == outbox.ResolveRerun {
		what = "forgotten: the next retry with its key runs it"
	}
	_, err = fmt.Fprintf(env.stdout, "call %q of %s (%s, %s): was unknown, %s\n",
		shorten(res.Key, callkey.MaxKeyBytes), shorten(res.Principal, 60), shorten(res.Tool, 40), res.CallID, what)
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
