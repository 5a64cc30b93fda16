package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
)

func runOutboxCalls(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	limit := fs.Int("limit", operate.DefaultListLimit, fmt.Sprintf("at most `N` calls, the oldest (1 to %d)", operate.MaxListLimit))
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("calls: unexpected argument %q", pos[0])
	}
	if *limit < 1 || *limit > operate.MaxListLimit {
		return usagef("limit %d: want 1 to %d", *limit, operate.MaxListLimit)
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := opsquery.ListUnknownCalls(ctx, db, *limit)
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
	if err := operate.WriteUnknownCallTable(env.stdout, rows); err != nil {
		return err
	}
	_, err = fmt.Fprintln(env.stdout, "Settle each with: mcp-outbox outbox resolve-call --key KEY [--principal P] --outcome completed|failed|rerun --note TEXT")
	return err
}

func runOutboxResolveCall(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	key := fs.String("key", "", "the idempotency `key` of the call")
	principal := fs.String("principal", callkey.LocalPrincipal, "whose call it is: local, or a token's principal (alice or user:alice)")
	callID := fs.String("call-id", "", "instead of --key and --principal: the call's `id` (callId in the status tool, call_id in the logs)")
	outcome := fs.String("outcome", "", "what you found out: "+strings.Join(operate.CallOutcomeNames(), ", "))
	note := fs.String("note", "", "what you found, recorded in the call's result (at most 1000 bytes)")
	var keyFile string
	keyFileFlag(env, fs, &keyFile)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("resolve-call: unexpected argument %q (give the key with --key)", pos[0])
	}
	if *principal != "" { // an explicit empty principal is refused below
		*principal = callkey.ParsePrincipal(*principal)
	}
	ref := operate.CallRef{Principal: *principal, Key: *key, CallID: *callID}
	if *callID != "" {
		ref.Principal = ""
	}
	if err := operate.CheckResolveCall(ref, *outcome, *note); err != nil {
		return cliError(err)
	}
	// The note becomes the call's recorded result: on an encrypted
	// database it is sealed like every other, or refused without the key
	// file, rather than stored as the one plaintext result.
	keys, err := loadKeys(keyFile)
	if err != nil {
		return err
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := operate.ResolveUnknownCall(ctx, db, sealing.Of(keys), ref, *outcome, *note)
	if err != nil {
		return cliError(err)
	}
	what := "now " + string(res.State)
	if res.Outcome == string(admin.CallRerun) {
		what = "forgotten: the next retry with its key runs it"
	}
	_, err = fmt.Fprintf(env.stdout, "call %q of %s (%s, %s): was unknown, %s\n",
		operate.Shorten(res.Key, callkey.MaxKeyBytes), operate.Shorten(res.Principal, 60), operate.Shorten(res.Tool, 40), res.CallID, what)
	return err
}
