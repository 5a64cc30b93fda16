package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

type cliResult struct {
	code           int
	stdout, stderr string
}

// testEnv is an environment holding only vars, so that the developer's own
// MCP_OUTBOX_* variables cannot change a test.
func testEnv(vars map[string]string, stdin io.Reader, stdout, stderr io.Writer) *environment {
	return &environment{
		stdin:  stdin,
		stdout: stdout,
		stderr: stderr,
		getenv: func(k string) string { return vars[k] },
		environ: func() []string {
			var out []string
			for k, v := range vars {
				out = append(out, k+"="+v)
			}
			return out
		},
	}
}

// runCLI runs the command line in-process with an empty stdin.
func runCLI(t *testing.T, vars map[string]string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := runEnv(ctx, testEnv(vars, strings.NewReader(""), &stdout, &stderr), args)
	return cliResult{code, stdout.String(), stderr.String()}
}

func TestCLIHelp(t *testing.T) {
	t.Parallel()
	overview := [][]string{nil, {"--help"}, {"-h"}, {"help"}, {"help", "--help"}, {"help", "help"}}
	for _, args := range overview {
		r := runCLI(t, nil, args...)
		if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Commands:") {
			t.Errorf("mcp-outbox %v: exit %d, stdout %q, stderr %q; want the overview on stdout, exit 0", args, r.code, r.stdout, r.stderr)
			continue
		}
		for _, c := range commands() {
			if !strings.Contains(r.stdout, "  "+c.name+" ") {
				t.Errorf("mcp-outbox %v: overview does not list %s", args, c.name)
			}
		}
	}
	for _, c := range commands() {
		if c.run == nil {
			continue // help: covered above
		}
		for _, args := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}} {
			r := runCLI(t, nil, args...)
			if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Usage: mcp-outbox "+c.name) {
				t.Errorf("mcp-outbox %v: exit %d, stdout %q, stderr %q; want its usage on stdout, exit 0",
					args, r.code, r.stdout, r.stderr)
			}
		}
	}
	r := runCLI(t, nil, "serve", "--help")
	for _, want := range []string{"-lease", "MCP_OUTBOX_LEASE", "-durability", "-http"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("serve --help does not mention %s:\n%s", want, r.stdout)
		}
	}
}

// The commands that take --dest describe its settings, key_form included.
func TestCLIHelpDestSettings(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"serve", "proxy", "drain"} {
		r := runCLI(t, nil, cmd, "--help")
		for _, want := range []string{"--dest", "at_most_once", "key_form=quoted", "bare"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%s --help does not mention %s", cmd, want)
			}
		}
	}
}

func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"serve", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"status"}, "give a KEY, or --tool with --args"},
		{[]string{"status", "--tool", "charge", "--args", "{not json"}, "--args is not valid JSON"},
	} {
		r := runCLI(t, nil, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("mcp-outbox %v: exit %d, stderr %q; want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
		if r.stdout != "" {
			t.Errorf("mcp-outbox %v wrote to stdout: %q", tc.args, r.stdout)
		}
	}
}

// TestCLIBadServeConfig: every bad setting is a usage error (exit 2) that
// names the setting, found before the database file is created.
func TestCLIBadServeConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"durability", []string{"--durability", "bogus"}, nil, `durability "bogus": want full or normal`},
		{"durability env", nil, map[string]string{"MCP_OUTBOX_DURABILITY": "eventually"}, `durability "eventually"`},
		{"dest without name", []string{"--dest", "nonsense"}, nil, `--dest "nonsense": want NAME=URL`},
		{"dest bad setting", []string{"--dest", "payments=http://127.0.0.1:1;timeout=soon"}, nil, `destination payments: timeout="soon"`},
		{"dest unknown setting", []string{"--dest", "payments=http://127.0.0.1:1;colour=blue"}, nil, `unknown setting`},
		{"dest secret on command line", []string{"--dest", "payments=http://127.0.0.1:1;auth=sk_live"}, nil, `MCP_OUTBOX_DEST_PAYMENTS_AUTH`},
		{"dest probe without at_most_once", []string{"--dest", "payments=http://127.0.0.1:1;probe=GET /x/{key}"}, nil, `only for at_most_once`},
		{"dest key form", []string{"--dest", "payments=http://127.0.0.1:1;key_form=unquoted"}, nil, `destination payments: key_form="unquoted": want quoted or bare`},
		{"dest key form env", nil, map[string]string{"MCP_OUTBOX_DEST_PAYMENTS": "http://127.0.0.1:1", "MCP_OUTBOX_DEST_PAYMENTS_KEY_FORM": "sf"},
			`destination payments: key_form="sf": want quoted or bare`},
		{"dest settings without URL", nil, map[string]string{"MCP_OUTBOX_DEST_PAYMENTS_TIMEOUT": "5s"}, `has settings but no URL`},
		{"dest not http", []string{"--dest", "payments=ftp://example.com"}, nil, `destination payments: "ftp://example.com" is not an http(s) URL`},
		{"dest env", nil, map[string]string{"MCP_OUTBOX_DEST_PAYMENTS": "nope"}, `destination payments: "nope" is not an http(s) URL`},
		{"negative window", []string{"--fingerprint-window", "-1s"}, nil, "--fingerprint-window -1s: must not be negative"},
		{"negative wait", []string{"--in-flight-wait", "-5s"}, nil, "--in-flight-wait -5s: must not be negative"},
		{"negative delay", []string{"--demo-delay", "-1ms"}, nil, "--demo-delay -1ms: must not be negative"},
		{"negative calls ttl", []string{"--calls-ttl", "-1h"}, nil, "--calls-ttl -1h0m0s: must not be negative"},
		{"bad delivered ttl env", nil, map[string]string{"MCP_OUTBOX_DELIVERED_TTL": "weekly"}, "MCP_OUTBOX_DELIVERED_TTL"},
		{"negative lease", []string{"--lease", "-2s"}, nil, "--lease -2s: must not be negative"},
		{"lease not a duration", []string{"--lease", "soon"}, nil, `invalid value "soon" for flag -lease`},
		{"lease env", nil, map[string]string{"MCP_OUTBOX_LEASE": "soon"}, `MCP_OUTBOX_LEASE="soon"`},
		{"window env", nil, map[string]string{"MCP_OUTBOX_FINGERPRINT_WINDOW": "5 minutes"}, `MCP_OUTBOX_FINGERPRINT_WINDOW="5 minutes"`},
		{"log level", []string{"--log-level", "loud"}, nil, `log level "loud"`},
		{"log format", []string{"--log-format", "bogus"}, nil, `log format "bogus": want text or json`},
		{"log format env", nil, map[string]string{"MCP_OUTBOX_LOG_FORMAT": "xml"}, `log format "xml"`},
		{"http address", []string{"--http", "nonsense"}, nil, `--http "nonsense": want HOST:PORT`},
		{"argument", []string{"extra"}, nil, `unexpected argument "extra"`},
		{"retention without tool", []string{"--retention", "24h"}, nil, `--retention "24h": want TOOL=DURATION`},
		{"retention not a duration", []string{"--retention", "charge=daily"}, nil, `--retention "charge=daily": "daily" is not a positive duration`},
		{"retention negative", []string{"--retention", "charge=key:-1h"}, nil, `"-1h" is not a positive duration`},
		{"retention bad part", []string{"--retention", "charge=keys:1h"}, nil, `"keys:" is not key: or outcome:`},
		{"retention unknown tool", []string{"--retention", "chrage=1h"}, nil, `no tool "chrage" (charge or refund)`},
		{"retention read-only tool", []string{"--retention", "balance=1h"}, nil, `balance is read-only`},
		{"retention twice", []string{"--retention", "charge=1h", "--retention", "charge=outcome:2h"}, nil, `the outcome time of charge given twice`},
		{"retention outcome shorter than key", []string{"--retention", "charge=outcome:1h"}, nil,
			`charge's outcome:1h0m0s is shorter than its key's time 24h0m0s (--calls-ttl)`},
		{"retention outcome shorter than calls-ttl", []string{"--calls-ttl", "48h", "--retention", "charge=outcome:30h"}, nil,
			`shorter than its key's time 48h0m0s (--calls-ttl)`},
		{"retention env", nil, map[string]string{"MCP_OUTBOX_RETENTION": "charge=1h,refund=soon"}, `MCP_OUTBOX_RETENTION "refund=soon"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			vars := map[string]string{"MCP_OUTBOX_DB": filepath.Join(dir, "ledger.db")}
			for k, v := range tc.vars {
				vars[k] = v
			}
			r := runCLI(t, vars, append([]string{"serve"}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "mcp-outbox serve --help") {
				t.Errorf("serve %v %v: exit %d, stderr %q; want exit 2, %q and a pointer to --help", tc.args, tc.vars, r.code, r.stderr, tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a rejected configuration left files: %v", entries)
			}
		})
	}
}

func TestCLIServeMissingDirectory(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "serve", "--db", "/nonexistent/dir/x.db")
	if r.code != 1 {
		t.Errorf("exit %d, want 1", r.code)
	}
	if !strings.Contains(r.stderr, "/nonexistent/dir") || !strings.Contains(r.stderr, "no such file or directory") {
		t.Errorf("stderr %q does not say which directory is missing", r.stderr)
	}
	if _, err := os.Stat("/nonexistent"); err == nil {
		t.Error("serve created /nonexistent")
	}
}

func TestCLIStatus(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "ledger.db")

	t.Run("missing database", func(t *testing.T) {
		missing := filepath.Join(dir, "typo.db")
		r := runCLI(t, nil, "status", "--db", missing, "some-key")
		if r.code != 1 || !strings.Contains(r.stderr, missing+" does not exist") {
			t.Errorf("exit %d, stderr %q; want exit 1 saying the file does not exist", r.code, r.stderr)
		}
		if _, err := os.Stat(missing); err == nil {
			t.Error("status created the database file")
		}
	})

	cs, _ := serveStdio(t, bin, dbPath, nil)
	keyed := mustSucceed(t, cs, chargeCall("status-1", 4100))
	keyless := mustSucceed(t, cs, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 77, "currency": "usd"}})
	cs.Close()

	lookup := func(t *testing.T, vars map[string]string, args ...string) map[string]any {
		t.Helper()
		r := runCLI(t, vars, append([]string{"status"}, args...)...)
		if r.code != 0 {
			t.Fatalf("status %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		var st map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("status %v printed no JSON: %v\n%s", args, err, r.stdout)
		}
		return st
	}

	t.Run("flags after the key", func(t *testing.T) {
		if st := lookup(t, nil, "status-1", "--db", dbPath); st["state"] != "completed" {
			t.Errorf("status KEY --db FILE: %v, want the completed call", st)
		}
	})

	t.Run("key never used", func(t *testing.T) {
		st := lookup(t, nil, "--db", dbPath, "never-used")
		if st["state"] != "not_found" || st["key"] != "never-used" || !strings.Contains(st["message"].(string), "never seen") {
			t.Errorf("status of a key never used: %v", st)
		}
	})

	t.Run("completed with effect", func(t *testing.T) {
		// The database from the environment, as a user would configure it.
		st := lookup(t, map[string]string{"MCP_OUTBOX_DB": dbPath}, "status-1")
		m := callMetaOf(keyed)
		if st["state"] != "completed" || st["tool"] != "charge" || st["keySource"] != "meta" || st["callId"] != m["callId"] {
			t.Fatalf("status: %v, want the completed charge %v", st, m["callId"])
		}
		result, _ := json.Marshal(st["result"])
		var rec mcp.CallToolResult
		if err := json.Unmarshal(result, &rec); err != nil || rec.IsError {
			t.Fatalf("recorded result %s: %v", result, err)
		}
		if got, want := structuredChargeID(t, &rec), structuredChargeID(t, keyed); got != want {
			t.Errorf("recorded charge_id %d, the call answered %d", got, want)
		}
		effects, _ := st["effects"].([]any)
		if len(effects) != 1 {
			t.Fatalf("effects = %v, want 1", st["effects"])
		}
		e, _ := effects[0].(map[string]any)
		if e["destination"] != "payments" || e["path"] != "/v1/charges" || e["state"] != "pending" ||
			e["idempotencyKey"] != callkey.EffectKey(m["callId"].(string), 1) {
			t.Errorf("effect %v, want a pending POST /v1/charges to payments keyed by the call", e)
		}
	})

	t.Run("by tool and arguments", func(t *testing.T) {
		// Another key order and spacing: the lookup canonicalizes.
		st := lookup(t, nil, "--db", dbPath, "--tool", "charge", "--args", `{ "currency": "usd", "amount": 77 }`)
		if st["state"] != "completed" || st["keySource"] != "fingerprint" || st["callId"] != callMetaOf(keyless)["callId"] {
			t.Errorf("status by arguments: %v, want the keyless call %v", st, callMetaOf(keyless))
		}
		other := lookup(t, nil, "--db", dbPath, "--tool", "charge", "--args", `{"amount": 78, "currency": "usd"}`)
		if other["state"] != "not_found" {
			t.Errorf("status with other arguments: %v, want not_found", other)
		}
	})

	t.Run("another principal", func(t *testing.T) {
		for _, p := range []string{"user:mallory", "mallory"} {
			st := lookup(t, nil, "--db", dbPath, "--principal", p, "status-1")
			if st["state"] != "not_found" {
				t.Errorf("another principal (%s) sees the call: %v", p, st)
			}
		}
	})
}

// TestStdioMalformedLines runs serve in-process on pipes: each bad line
// gets a JSON-RPC error response and the next good request is served.
func TestStdioMalformedLines(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr syncBuffer
	exit := make(chan int, 1)
	go func() {
		code := runEnv(context.Background(), testEnv(nil, inR, outW, &stderr),
			[]string{"serve", "--db", dbPath, "--log-level", "error"})
		outW.Close()
		exit <- code
	}()
	t.Cleanup(func() { inW.Close(); outR.Close() })

	lines := make(chan []byte, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	send := func(line string) {
		t.Helper()
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatalf("write %q: %v (server stderr %q)", line, err, stderr.String())
		}
	}
	nextLine := func(what string) []byte {
		t.Helper()
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("%s: server closed stdout (stderr %q)", what, stderr.String())
			}
			return line
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no response within 10s (stderr %q)", what, stderr.String())
			return nil
		}
	}
	next := func(what string) map[string]any {
		t.Helper()
		line := nextLine(what)
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%s: server wrote a line that is not a JSON object: %q", what, line)
		}
		return m
	}
	wantError := func(line string, code float64, id any) {
		t.Helper()
		send(line)
		m := next(line)
		e, _ := m["error"].(map[string]any)
		if e == nil || e["code"] != code || m["id"] != id || m["jsonrpc"] != "2.0" {
			t.Errorf("response to %q: %v, want error %v with id %v", line, m, code, id)
		}
	}

	wantError(`this is not json`, -32700, nil)
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"v0"}}}`)
	if m := next("initialize"); m["id"] != 1.0 || m["result"] == nil {
		t.Fatalf("initialize after a bad line: %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	wantError(`{"jsonrpc":"2.0","id":2,"method":"tools/list"`, -32700, nil) // truncated
	wantError(`[]`, -32600, nil)
	wantError(`{"jsonrpc":"1.0","id":3,"method":"ping"}`, -32600, 3.0)
	wantError(`{"id":"four","method":"ping"}`, -32600, "four")
	wantError(`{"jsonrpc":"2.0","id":{"not":"an id"},"method":"ping"}`, -32600, nil)
	wantError(`42`, -32600, nil)
	wantError(`[{"jsonrpc":"2.0","id":6,"method":"ping"},{"method":"ping"}]`, -32600, nil)
	// A well-formed batch passes to the SDK intact.
	send(`[{"jsonrpc":"2.0","id":7,"method":"ping"},{"jsonrpc":"2.0","id":8,"method":"ping"}]`)
	var batch []map[string]any
	if line := nextLine("batch"); json.Unmarshal(line, &batch) != nil || len(batch) != 2 || batch[0]["id"] != 7.0 || batch[1]["id"] != 8.0 {
		t.Fatalf("response to a batch of two pings: %q", line)
	}
	send("   ") // blank lines are not messages and get no answer

	send(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"charge","arguments":{"amount":250},"idempotencyKey":"stdio-after-garbage"}}`)
	m := next("tools/call")
	res, _ := m["result"].(map[string]any)
	if m["id"] != 5.0 || res == nil || res["isError"] == true {
		t.Fatalf("tools/call after bad lines: %v", m)
	}
	meta, _ := res["_meta"].(map[string]any)
	if cm, _ := meta[outbox.MetaKeyCall].(map[string]any); cm["keySource"] != "params" || cm["key"] != "stdio-after-garbage" {
		t.Errorf("call meta %v, want the params key", cm)
	}

	inW.Close()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("serve exited %d at the end of stdin, want 0 (stderr %q)", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit at the end of stdin")
	}
	if n := countRows(t, openLedgerDB(t, dbPath), `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges has %d rows, want 1", n)
	}
}

// TestStdioRejectsBadCalls: invalid keys, an unknown tool and arguments
// that fail the schema each get a clear error and leave nothing behind.
func TestStdioRejectsBadCalls(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	cs, _ := serveStdio(t, bin, dbPath, nil)
	charge := func(key string, amount any) *mcp.CallToolParams {
		p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": amount}}
		if key != "" {
			p.Meta = mcp.Meta{outbox.MetaKeyIdempotency: key}
		}
		return p
	}
	for _, tc := range []struct {
		name string
		call *mcp.CallToolParams
		want []string
	}{
		{"key of 256 bytes", charge(strings.Repeat("k", 256), 100), []string{"invalid idempotency key", "256 bytes", "255"}},
		{"key with a newline", charge("two\nlines", 100), []string{"invalid idempotency key", "control character"}},
		{"key with NUL", charge("nul\x00byte", 100), []string{"invalid idempotency key", "control character"}},
		{"key not a string", &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 1},
			Meta: mcp.Meta{outbox.MetaKeyIdempotency: 12345}}, []string{"invalid idempotency key", "must be a string"}},
		{"unknown tool", &mcp.CallToolParams{Name: "charge_twice", Arguments: map[string]any{"amount": 1}}, []string{`unknown tool "charge_twice"`}},
		{"amount not a number, keyed", charge("schema-1", "abc"), []string{"amount"}},
		{"amount not a number, no key", charge("", "abc"), []string{"amount"}},
		{"amount missing", &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"currency": "usd"}}, []string{"amount"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := cs.CallTool(ctx, tc.call)
		cancel()
		var msg string
		switch {
		case err != nil:
			msg = err.Error() // a protocol error is as clear as a tool error
		case res.IsError:
			msg = resultText(res)
			if m := callMetaOf(res); m != nil {
				t.Errorf("%s: rejected call reported as recorded: %v", tc.name, m)
			}
		default:
			t.Errorf("%s: succeeded: %s", tc.name, resultText(res))
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: error %q does not mention %q", tc.name, msg, w)
			}
		}
	}
	db := openLedgerDB(t, dbPath)
	for _, table := range []string{"charges", "calls", "effects"} {
		if n := countRows(t, db, `SELECT count(*) FROM `+table); n != 0 {
			t.Errorf("%s has %d rows after rejected calls, want 0", table, n)
		}
	}
	// The limit is inclusive: 255 bytes is a key.
	ok := mustSucceed(t, cs, charge(strings.Repeat("k", 255), 100))
	wantReplay(t, ok, false, "meta")
}
