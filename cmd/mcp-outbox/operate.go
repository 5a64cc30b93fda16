package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/visible"
)

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
  cancel --dest NAME       cancel every pending effect of destination NAME
  retarget --from NAME --to NAME
                           move every pending effect of destination NAME to
                           another (a typo'd or renamed destination)
  resolve ID delivered     settle an unknown or dead effect that you found the
                           destination has: it becomes delivered, not sent again
  resolve ID retry         settle an unknown or dead effect that you found the
                           destination does not have: it is sent again
  calls [--limit N] [--json]
                           calls in state unknown, the oldest first
  resolve-call --key K [--principal P] --outcome completed|failed|rerun [--note TEXT]
                           settle an unknown call by what you found out
                           (and --encryption-key-file FILE if encrypted)
  forget-principal P       erase P's recorded arguments, results and effect
                           bodies; its keys stay used (a retry runs nothing)
  reencrypt --encryption-key-file FILE
                           rewrap data keys under the file's first key and
                           encrypt plaintext rows; then older keys can go
  decrypt --encryption-key-file FILE
                           turn encryption off: write every value back in
                           plaintext (stop serve first)

Effect states:
` + operate.EffectStatesHelp() + `
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
` + operate.CallOutcomesHelp() + `
Unknown calls are never purged.

Every subcommand takes --db FILE or URL (default $MCP_OUTBOX_DB, else ./mcp-outbox.db)
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
` + operate.EffectStatesHelp(), runOutboxList},
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
       mcp-outbox outbox cancel [--db FILE] --dest NAME

Stops delivering a pending, dead or unknown effect: it becomes cancelled and is
never sent (again). A request that already left is not recalled. The effects
after it in the same call are no longer held back by it. 'retry ID' undoes a
cancel.

--dest cancels every pending effect of destination NAME at once (those of a
destination that no configuration names, which would wait forever); effects
in flight and in other states are left alone. A NAME with no pending effects
exits 1, changing nothing, and names the destinations that have some. The
cancel is logged on stderr as an operator action.`, runOutboxCancel},
		{"retarget", `Usage: mcp-outbox outbox retarget --from NAME --to NAME [--db FILE]

Moves every pending effect of destination --from to destination --to: due
now, with a fresh attempt budget, the same Idempotency-Key, body and headers,
and its place among its call's effects. This is the way out when effects
were enqueued for a name that no dispatcher delivers to (a typo, a renamed
destination): they wait forever, and serve and Layer.Start refuse to start
while they do. Effects in flight and in other states are left alone.

--to must be a destination this command knows: one configured in the
environment as serve reads it (MCP_OUTBOX_DEST_<NAME>=URL), or one the
database has delivered an effect to. Anything else exits 2, changing
nothing, and names the known ones: moving effects to another typo would only
move the problem. Give the variable for a destination that is configured
but has not delivered yet. The same --from and --to, or a missing flag,
exits 2; a --from with no pending effects exits 1 and names the destinations
that have some. The move is logged on stderr as an operator action.

Run it while serve runs or not: a running dispatcher that knows --to picks
the effects up within its poll interval (1s).`, runOutboxRetarget},
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
		{"resolve-call", `Usage: mcp-outbox outbox resolve-call (--key K [--principal P] | --call-id ID) --outcome OUTCOME [--note TEXT] [--encryption-key-file FILE] [--db FILE]

Settles a call in state unknown by what you found out in the tool server's
own records. OUTCOME is one of:
` + operate.CallOutcomesHelp() + `
The note (at most 1000 bytes) is recorded after "[resolved by an operator]"
as the text of the call's result, which retries replay to the client: say
what you found. The principal is "local" unless given: calls over stdio and
unauthenticated HTTP belong to it. --call-id names the call by its call id
instead (callId in the status tool and 'outbox calls', call_id in the logs),
which no other call ever has. Only an unknown call can be resolved. On an
encrypted database give its key file: the note is stored encrypted, as every
recorded result is; without it nothing is changed.`, runOutboxResolveCall},
		{"forget-principal", `Usage: mcp-outbox outbox forget-principal [--db FILE] PRINCIPAL

Erases every recorded argument, result and effect body of PRINCIPAL (local,
or a token's principal: alice or user:alice; within a tenant, as the operator
page shows it: tenant:NAME/user:alice, once per tenant), for a request to be
forgotten (GDPR Art. 17). With encryption on it is crypto-erasure: the principal's data
keys are deleted, so nothing sealed under them can be read again from the
database or any backup taken from now on; the values themselves are deleted
too, and undelivered effects are cancelled for good (retry refuses them: their
body is gone). On SQLite the erased rows are overwritten with zeros and the
WAL is checkpointed; if a reader holds the checkpoint off, it says so: run it
again later. On PostgreSQL dead tuples and WAL segments keep the wrapped data
key until vacuumed and recycled (see 'Data protection' in the README). Every
key of the principal stays recorded: a retry runs nothing and the status tool
answers "erased". It holds at once for a running serve and after a restart.
Needs no key file. Calls in flight are left alone and counted: run it again
once they ended. A principal the database never saw exits 1, erasing nothing,
and names similar ones; one forgotten before exits 0. Revoke the principal's
tokens at the identity provider too: a new call is served and recorded again.
The erase is logged on stderr as an operator action and kept in data_keys.`, runOutboxForget},
		{"reencrypt", `Usage: mcp-outbox outbox reencrypt --encryption-key-file FILE [--batch N] [--db FILE]

Rotation: rewraps every data key under the first key of FILE, and encrypts
the plaintext values of a database used before encryption was on (and the
effects a cooperating upstream wrote itself), dropping recorded destination
responses. Runs in batches while serve runs, with progress on stderr;
interrupted, run it again.

To rotate: put the new key as the FIRST line of the key file (the old one
stays, after it); restart every process on the database (serve, proxy,
drain), since each reads the file once at start and would go on creating
data keys under the old key; run reencrypt; then remove the old key and
restart them again.

A FILE of several keys while every data key is already under its first is
refused (exit 2, nothing changed): the new key was most likely added last,
and removing the old (first) one next would leave every value unreadable. If
the rotation is in fact done, the other keys can leave the file.`, runOutboxReencrypt},
		{"decrypt", `Usage: mcp-outbox outbox decrypt --encryption-key-file FILE [--batch N] [--db FILE]

Turns encryption off: writes every encrypted value back in plaintext and
deletes the data keys. Stop every serve that has the key file first; then
serve runs without one. Values that cannot be decrypted are left and counted,
and the data keys kept.`, runOutboxDecrypt},
	}
}

func runOutbox(ctx context.Context, env *environment, args []string) error {
	if len(args) == 0 {
		return usagef("give a subcommand: list, summary, retry, cancel, retarget, resolve, calls, resolve-call, forget-principal, reencrypt or decrypt")
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
	return usagef("unknown subcommand %q (want list, summary, retry, cancel, retarget, resolve, calls, resolve-call, forget-principal, reencrypt or decrypt)", name)
}

// subFlags is the flag set of a subcommand, with the --db every one takes.
func subFlags(env *environment, s outboxSub) (*flag.FlagSet, *string) {
	fs := newFlagSet(env, "outbox "+s.name, s.usage)
	db := fs.String("db", env.envDefault("MCP_OUTBOX_DB", "./mcp-outbox.db"), "the database serve uses: an SQLite `file` that must exist, or a postgres:// URL [MCP_OUTBOX_DB]")
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
	if errors.As(err, new(operate.BadInput)) {
		return usageError{err}
	}
	return err
}

// writeJSON writes v indented, with format characters a client sent (a
// bidirectional override in a tool-call id, say) as \u escapes: the same
// JSON, which cannot reorder what the terminal shows (internal/visible).
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(visible.JSON(b.Bytes()))
	return err
}
