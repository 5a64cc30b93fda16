package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeBareRefusesLayerFlags: every flag that configures the outbox
// layer, which --bare does not run, is refused with --bare (exit 2, the
// flag named, no database created) instead of being ignored without a
// word; the environment variables of such flags get a warning each.
func TestServeBareRefusesLayerFlags(t *testing.T) {
	t.Parallel()
	values := map[string]string{
		"dest":                "payments=http://127.0.0.1:9",
		"task":                "charge=always",
		"task-poll":           "1s",
		"retention":           "charge=1h",
		"fingerprint-window":  "1m",
		"in-flight-wait":      "1s",
		"lease":               "1m",
		"batch-calls":         "1",
		"batch-wait":          "1ms",
		"calls-ttl":           "1h",
		"delivered-ttl":       "1h",
		"log-sensitive":       "true",
		"encryption-key-file": "/nonexistent/keys",
	}
	for name := range bareIgnored {
		v, ok := values[name]
		if !ok {
			t.Fatalf("no test value for --%s", name)
		}
		db := filepath.Join(t.TempDir(), "ledger.db")
		r := runCLI(t, nil, "serve", "--bare", "--db", db, "--"+name+"="+v)
		if r.code != 2 || !strings.Contains(r.stderr, "--"+name) || !strings.Contains(r.stderr, "--bare") {
			t.Errorf("serve --bare --%s=%s: exit %d, stderr %q; want exit 2 naming --%s and --bare", name, v, r.code, r.stderr, name)
		}
		if _, err := os.Stat(db); !os.IsNotExist(err) {
			t.Errorf("serve --bare --%s: the database was created (%v)", name, err)
		}
	}

	// The flags --bare uses are accepted.
	r := runCLI(t, nil, "serve", "--bare", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--demo-delay", "1ms", "--durability", "normal")
	if r.code != 0 {
		t.Errorf("serve --bare --demo-delay --durability: exit %d, stderr %q; want 0", r.code, r.stderr)
	}

	r = runCLI(t, map[string]string{"MCP_OUTBOX_TASKS": "charge=always", "MCP_OUTBOX_DEST_PAYMENTS": "http://127.0.0.1:9"},
		"serve", "--bare", "--db", filepath.Join(t.TempDir(), "ledger.db"))
	if r.code != 0 {
		t.Fatalf("serve --bare with MCP_OUTBOX_TASKS set: exit %d, stderr %q; want 0 and a warning", r.code, r.stderr)
	}
	for _, v := range []string{"MCP_OUTBOX_TASKS", "MCP_OUTBOX_DEST_PAYMENTS"} {
		if !strings.Contains(r.stderr, "WARNING: "+v+" is ignored with --bare") {
			t.Errorf("serve --bare with %s set: stderr %q, want a warning that names it", v, r.stderr)
		}
	}
}
