package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/schemacheck"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// --calls-ttl reaches the layer: past it, a key names a new call.
func TestServeCallsTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := testEnv(nil, nil, io.Discard, io.Discard)
	cfg := &appConfig{db: filepath.Join(t.TempDir(), "ttl.db"), durability: "full", logLevel: "error"}
	// Long enough that the replay below comes within it on a loaded
	// machine (50 ms did not, once, with the interop matrix running).
	const ttl = time.Second
	cfg.retention.Calls = ttl
	a, err := openApp(ctx, env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := a.server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	charge := func() map[string]any {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 5},
			Meta: mcp.Meta{"idempotencyKey": "ttl-key"}})
		if err != nil || res.IsError {
			t.Fatalf("charge: %v %v", err, res)
		}
		m, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
		return m
	}
	first := charge()
	if again := charge(); again["replayed"] != true {
		t.Fatalf("within the TTL: %v, want a replay", again)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Since(completedAt(t, first)) < 2*ttl; {
		if time.Now().After(deadline) {
			t.Fatal("clock did not advance")
		}
		time.Sleep(50 * time.Millisecond) // waiting out the TTL itself, not a result
	}
	if later := charge(); later["replayed"] != false {
		t.Errorf("past the TTL: %v, want a new call", later)
	}
}

// TestServeToolSchemasStrict: every tool serve advertises (the ledger's and
// the status tool) passes the schema rules of the strictest clients, which
// refuse a whole tools/list answer for one boolean subschema.
func TestServeToolSchemasStrict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := testEnv(nil, nil, io.Discard, io.Discard)
	a, err := openApp(ctx, env, &appConfig{db: filepath.Join(t.TempDir(), "schemas.db"), durability: "full", logLevel: "error"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := a.server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) < 2 {
		t.Fatalf("serve lists %d tools", len(tools.Tools))
	}
	for _, tool := range tools.Tools {
		if tool.Description == "" {
			t.Errorf("tool %s has no description (the conformance suite's tools-list wants one)", tool.Name)
		}
		for name, s := range map[string]any{"inputSchema": tool.InputSchema, "outputSchema": tool.OutputSchema} {
			if s == nil {
				continue
			}
			if err := schemacheck.Strict(s); err != nil {
				t.Errorf("tool %s %s: %v", tool.Name, name, err)
			}
		}
	}
}

// Pending effects for a destination serve does not know are named in a
// warning at start-up, one line a destination; known ones, and unknown
// destinations with nothing pending, are not.
func TestWarnUnconfigured(t *testing.T) {
	path, check := newEffectsDB(t, 4) // effects 1 to 4, pending, to payments
	setEffect(t, check, 2, "pending", "mailer")
	setEffect(t, check, 3, "pending", "mailer")
	setEffect(t, check, 4, "dead", "ledger-export")
	ctx := context.Background()
	db, err := schema.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var logs bytes.Buffer
	a := &app{db: db, dests: []dispatch.Destination{{Name: "payments"}}, logger: slog.New(slog.NewTextHandler(&logs, nil))}
	warnUnconfigured(ctx, a)
	got := strings.TrimSpace(logs.String())
	if strings.Count(got, "\n") != 0 || !strings.Contains(got, "destination=mailer pending=2") ||
		!strings.Contains(got, `configure="--dest mailer=URL"`) {
		t.Errorf("logs:\n%s\nwant one warning, for mailer with 2 pending", got)
	}
}

// With --dest, serve refuses to start while effects are pending for a
// destination it was not given, naming it; without --dest it starts, and
// leaves them for a drain.
func TestServeStart_PendingForUnconfigured(t *testing.T) {
	t.Parallel()
	path, check := newEffectsDB(t, 2) // effects 1 and 2, pending, to payments
	setEffect(t, check, 2, "pending", "mailer")
	ctx := context.Background()
	for _, tc := range []struct {
		dests []string
		want  string // in the error; "" starts
	}{
		{[]string{"payments=http://127.0.0.1:1"}, `"mailer" (1)`},
		{nil, ""},
	} {
		env := testEnv(nil, nil, io.Discard, io.Discard)
		a, err := openApp(ctx, env, &appConfig{db: path, durability: "full", logLevel: "error", dests: tc.dests})
		if err != nil {
			t.Fatal(err)
		}
		stop, err := a.start(ctx)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("--dest %v: %v; want it started", tc.dests, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("--dest %v: %v; want an error naming %s", tc.dests, err, tc.want)
		}
		if err == nil {
			stop()
		}
		a.Close()
	}
}

// serve runs the collector at gctune's default unless GOGC says otherwise,
// as its /metrics tell (go_gc_gogc_percent reads the runtime's setting).
func TestServeGCPercent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, "go_gc_gogc_percent 400\n"},
		{[]string{"GOGC=150"}, "go_gc_gogc_percent 150\n"},
	} {
		env := slices.DeleteFunc(slices.Clone(os.Environ()), func(kv string) bool { return strings.HasPrefix(kv, "GOGC=") })
		cmd := exec.Command(bin, "serve", "--db", filepath.Join(t.TempDir(), "gc.db"), "--http", "127.0.0.1:0", "--log-level", "warn")
		cmd.Env = append(env, tc.env...)
		url := startHTTPCommand(t, cmd)
		resp, err := http.Get(strings.TrimSuffix(url, "/mcp") + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), tc.want) {
			t.Errorf("env %q: /metrics lacks %q", tc.env, tc.want)
		}
	}
}
