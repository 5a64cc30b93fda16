package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/query"
)

const statusUsage = `Usage: mcp-outbox status [flags] KEY
       mcp-outbox status [flags] --tool NAME --args JSON

Shows what happened to a call: not_found (expired, or never seen within
retention: a retry runs it), in_flight, completed (with the recorded result),
failed, or unknown (it was forwarded to a tool server and its outcome was
lost: it may or may not have run, it never runs again by itself, and an
operator settles it with 'mcp-outbox outbox resolve-call'), and the delivery
state of each of its effects. Prints JSON.

A call made without an idempotency key is found by its tool and exact
arguments. Keys are per principal: calls over stdio and unauthenticated HTTP
belong to the principal "local", calls with a token to the token's principal
(--principal alice; stored as user:alice, which is accepted too).`

func runStatus(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "status", statusUsage)
	db := fs.String("db", env.envDefault("MCP_OUTBOX_DB", "./mcp-outbox.db"), "the database: an SQLite `file`, or a postgres:// URL [MCP_OUTBOX_DB]")
	principal := fs.String("principal", callkey.LocalPrincipal, "whose call to look up: local, or a token's principal (alice or user:alice)")
	tool := fs.String("tool", "", "for a call without a key: the tool's name")
	argsJSON := fs.String("args", "{}", "for a call without a key: its arguments as JSON")
	var keyFile string
	keyFileFlag(env, fs, &keyFile)
	// Flags after the key too: "status k-1 --db x.db" is how a stranger
	// wrote it.
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	keys, err := loadKeys(keyFile)
	if err != nil {
		return err
	}
	var key string
	switch {
	case len(pos) == 1 && *tool == "":
		key = pos[0]
	case len(pos) == 0 && *tool != "":
		if !json.Valid([]byte(*argsJSON)) {
			return usagef("--args is not valid JSON")
		}
	default:
		return usagef("give a KEY, or --tool with --args")
	}
	d, err := openExisting(ctx, *db)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := sealing.Of(keys).LoadHashKey(ctx, d.Write); err != nil {
		return err
	}
	if *principal == "" {
		return usagef("--principal: empty")
	}
	*principal = callkey.ParsePrincipal(*principal)
	var st *query.Status
	if key != "" {
		st, err = query.LookupSealed(ctx, d, keys, *principal, key, time.Now())
	} else {
		st, err = query.LookupArgsSealed(ctx, d, keys, *principal, *tool, json.RawMessage(*argsJSON), time.Now())
	}
	if err != nil {
		return err
	}
	return writeJSON(env.stdout, st)
}
