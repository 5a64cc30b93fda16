package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newAgedDB returns a database whose four calls completed eight days ago
// and whose keys have expired, with effect 1 delivered and effect 3
// cancelled eight days ago, effect 2 dead and effect 4 pending.
func newAgedDB(t *testing.T) string {
	t.Helper()
	path, db := newEffectsDB(t, 4)
	setEffect(t, db, 2, "dead", "payments")
	now := time.Now()
	aged := now.Add(-8 * 24 * time.Hour).UnixMilli()
	for _, stmt := range []struct {
		q    string
		args []any
	}{
		{`UPDATE calls SET completed_at = ?1, expires_at = ?2`, []any{aged, now.Add(-time.Hour).UnixMilli()}},
		{`UPDATE effects SET state = 'delivered', delivered_at = ?1, updated_at = ?1 WHERE id = 1`, []any{aged}},
		{`UPDATE effects SET state = 'cancelled', updated_at = ?1 WHERE id = 3`, []any{aged}},
	} {
		if _, err := db.Exec(stmt.q, stmt.args...); err != nil {
			t.Fatalf("%s: %v", stmt.q, err)
		}
	}
	return path
}

func TestPurgeCommand(t *testing.T) {
	t.Parallel()
	path := newAgedDB(t)
	vars := map[string]string{"MCP_OUTBOX_DB": path}

	r := runCLI(t, vars, "purge", "--dry-run")
	if want := "would purge (dry run): 2 calls, 1 delivered effects, 1 cancelled effects\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("purge --dry-run: exit %d, stdout %q, stderr %q; want exit 0, %q", r.code, r.stdout, r.stderr, want)
	}
	r = runCLI(t, vars, "purge", "--dry-run", "--json", "--delivered-ttl", "240h", "--calls-ttl", "240h")
	var got struct {
		Calls, DeliveredEffects, CancelledEffects int64
		DryRun                                    bool
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 0 {
		t.Fatalf("purge --dry-run --json: exit %d, stdout %q, stderr %q (%v)", r.code, r.stdout, r.stderr, err)
	}
	if got.Calls != 0 || got.DeliveredEffects != 0 || got.CancelledEffects != 1 || !got.DryRun {
		t.Errorf("dry run with 10-day TTLs for calls and delivered effects: %+v, want only the cancelled effect", got)
	}

	r = runCLI(t, vars, "purge")
	if want := "purged: 2 calls, 1 delivered effects, 1 cancelled effects\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("purge: exit %d, stdout %q, stderr %q; want exit 0, %q", r.code, r.stdout, r.stderr, want)
	}
	check := openLedgerDB(t, path)
	if n := countRows(t, check, `SELECT count(*) FROM effects WHERE id IN (2, 4)`); n != 2 {
		t.Errorf("the dead and the pending effect: %d of 2 left", n)
	}
	if n := countRows(t, check, `SELECT count(*) FROM effects`) + countRows(t, check, `SELECT count(*) FROM calls`); n != 4 {
		t.Errorf("%d rows left, want the dead and pending effects and their calls", n)
	}
	r = runCLI(t, vars, "purge", "--db", path)
	if want := "purged: 0 calls, 0 delivered effects, 0 cancelled effects\n"; r.code != 0 || r.stdout != want {
		t.Errorf("second purge: exit %d, stdout %q, stderr %q; want %q", r.code, r.stdout, r.stderr, want)
	}
}

func TestPurgeCommandErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.db")
	r := runCLI(t, nil, "purge", "--db", missing)
	if r.code != 1 || !strings.Contains(r.stderr, "does not exist") {
		t.Errorf("purge of a missing database: exit %d, stderr %q; want exit 1 saying it does not exist", r.code, r.stderr)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("purge created the missing database (stat: %v)", err)
	}
	for _, args := range [][]string{
		{"purge", "--calls-ttl", "0"},
		{"purge", "--delivered-ttl", "-1h"},
		{"purge", "--cancelled-ttl", "soon"},
		{"purge", "extra"},
	} {
		if r := runCLI(t, map[string]string{"MCP_OUTBOX_DB": missing}, args...); r.code != 2 {
			t.Errorf("mcp-outbox %v: exit %d, stderr %q; want a usage error, exit 2", args, r.code, r.stderr)
		}
	}
	r = runCLI(t, nil, "purge", "--help")
	for _, want := range []string{"-dry-run", "-calls-ttl", "-delivered-ttl", "-cancelled-ttl", "-json", "MCP_OUTBOX_DB", "never purged"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("purge --help does not mention %s", want)
		}
	}
}
