package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestRetentionFlag: proxy refuses a --retention that cannot mean anything
// before it opens the database, and both commands document the flag.
func TestRetentionFlag(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "never.db")
	for _, tc := range []struct {
		args []string
		vars map[string]string
		want string
	}{
		{[]string{"--retention", "call_status=1h"}, nil, "call_status is the proxy's own read-only tool"},
		{[]string{"--retention", "charge=key:0s"}, nil, `"0s" is not a positive duration`},
		{[]string{"--retention", "charge=outcome:2h", "--calls-ttl", "3h"}, nil, "shorter than its key's time 3h0m0s (--calls-ttl)"},
		{[]string{"--retention", "charge=key:1h,charge=outcome:30m"}, nil, "shorter than its key's time 1h0m0s (key:)"},
		{nil, map[string]string{"MCP_OUTBOX_RETENTION": "charge"}, `MCP_OUTBOX_RETENTION "charge": want TOOL=DURATION`},
	} {
		out := runCLI(t, tc.vars, append(append([]string{"proxy", "--db", db}, tc.args...), "--", "node", "x.mjs")...)
		if out.code != 2 || !strings.Contains(out.stderr, tc.want) {
			t.Errorf("proxy %v %v: exit %d, stderr %q; want exit 2 saying %q", tc.args, tc.vars, out.code, out.stderr, tc.want)
		}
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("a refused proxy created %s (%v)", db, err)
	}
	for _, cmd := range []string{"serve", "proxy"} {
		help := runCLI(t, nil, cmd, "--help")
		for _, want := range []string{"-retention TOOL=DURATION|key:DURATION|outcome:DURATION", "Retention per tool", "MCP_OUTBOX_RETENTION", "expiresAt"} {
			if !strings.Contains(help.stdout, want) {
				t.Errorf("%s --help does not say %q", cmd, want)
			}
		}
	}
}

// TestServeRetention: serve --retention gives charge its own key window,
// which mcp-outbox status reports as expiresAt, and its own outcome
// retention in the row the purge reads; refund keeps --calls-ttl.
func TestServeRetention(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	cs, _ := serveStdio(t, bin, dbPath, nil, "--calls-ttl", "12h", "--retention", "charge=key:1h,charge=outcome:48h")
	charged := mustSucceed(t, cs, chargeCall("ret-charge", 100))
	mustSucceed(t, cs, &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"charge_id": structuredChargeID(t, charged)},
		Meta: mcp.Meta{"idempotencyKey": "ret-refund"}})
	cs.Close()

	for key, window := range map[string]time.Duration{"ret-charge": time.Hour, "ret-refund": 12 * time.Hour} {
		r := runCLI(t, nil, "status", "--db", dbPath, key)
		var st struct {
			State                  string
			CompletedAt, ExpiresAt time.Time
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil {
			t.Fatalf("status %s: exit %d, %v, %s", key, r.code, err, r.stderr)
		}
		if st.State != "completed" || st.ExpiresAt.Sub(st.CompletedAt) != window {
			t.Errorf("status %s: %s, expiresAt %s after completion; want completed, %s", key, st.State, st.ExpiresAt.Sub(st.CompletedAt), window)
		}
	}
	db, err := schema.Open(context.Background(), dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for key, want := range map[string]sql.NullInt64{
		"ret-charge": {Int64: (48 * time.Hour).Milliseconds(), Valid: true}, "ret-refund": {},
	} {
		var got sql.NullInt64
		if err := db.Read.QueryRow(`SELECT retain_ms FROM calls WHERE key = $1`, key).Scan(&got); err != nil || got != want {
			t.Errorf("%s: retain_ms %v (%v), want %v", key, got, err, want)
		}
	}
}
