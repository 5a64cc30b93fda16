package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
)

const demoUsage = `Usage: mcp-outbox demo [flags]

Reproduces the four ways one logical MCP tool call became several actual
calls in a measurement with the reference SDKs (2, 2, 2 and 3 charges), with
this binary's example ledger as the server and the go-sdk as the client:

  1   stdio: the client times out on a slow charge, then retries
  2   stdio: the server is killed mid-charge; the client restarts it, retries
  3a  Streamable HTTP with a session (2025-11-25): timeout, then retry
  3b  Streamable HTTP, stateless (2026-07-28): timeout, then retry
  4   an agent framework's retry policy (3 attempts, like LangGraph's
      RetryPolicy) re-runs a node that failed after its charge returned

Each scenario runs three times, each run with its own server processes and
its own SQLite file in a temporary directory that is removed afterwards:
without the layer (serve --bare), with the layer and an idempotency key in
_meta (the same key on every retry of the call), and with the layer and no
key (the layer then recognises the retry by tool and arguments). Each run counts the rows of the ledger's charges table,
one row per actual charge. Progress goes to stderr, the table (or JSON with
--json) to stdout. It takes a few seconds.

Exits 0 when the layer charged exactly once in every scenario, with and
without a key. Exits 1 when it did not, when a run could not be carried out,
or when a scenario did not reproduce what it is about: a first attempt that
did not time out or lose its connection, or no duplicate without the layer,
makes the count of 1 beside it prove nothing.`

func runDemo(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "demo", demoUsage)
	delay := fs.Duration("delay", scenario.DefaultDelay, "how long charge takes in scenarios 1 to 3b, which need a call in progress (serve --demo-delay); must be longer than --timeout")
	timeout := fs.Duration("timeout", scenario.DefaultTimeout, "the client's timeout on the first attempt in scenarios 1, 3a and 3b")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *delay <= 0 || *timeout <= 0 {
		return usagef("--delay and --timeout must be positive")
	}
	if *timeout >= *delay {
		return usagef("--timeout (%v) must be shorter than --delay (%v), or no call times out", *timeout, *delay)
	}
	binary, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	dir, err := os.MkdirTemp("", "mcp-outbox-demo-")
	if err != nil {
		return fmt.Errorf("create temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)

	cfg := scenario.Config{Binary: binary, Dir: dir, Delay: *delay, Timeout: *timeout}
	rep, err := scenario.RunAll(ctx, cfg, env.stderr)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
	} else {
		rep.WriteTable(env.stdout)
	}
	if len(rep.Problems) > 0 {
		return errors.New(strings.Join(rep.Problems, "; "))
	}
	return nil
}
