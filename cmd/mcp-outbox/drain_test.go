package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

// ledgerWithCharges is a database with n committed charges, so that n
// effects to "payments" wait in the outbox.
func ledgerWithCharges(t *testing.T, n int) string {
	t.Helper()
	path, _ := newEffectsDB(t, n)
	return path
}

func TestDrain(t *testing.T) {
	t.Parallel()
	t.Run("AllDelivered", func(t *testing.T) {
		t.Parallel()
		db := ledgerWithCharges(t, 3)
		fake := downstream.Start(t, nil)
		r := runCLI(t, nil, "drain", "--db", db, "--dest", "payments="+fake.URL())
		if r.code != 0 || !strings.Contains(r.stdout, "delivered 3, pending 0") {
			t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if got := len(fake.Applied()); got != 3 {
			t.Errorf("applied = %d, want 3", got)
		}
		// Nothing left: a second drain sends nothing.
		if r := runCLI(t, nil, "drain", "--db", db, "--dest", "payments="+fake.URL(), "--json"); r.code != 0 ||
			!strings.Contains(r.stdout, `"delivered":3`) || len(fake.Requests()) != 3 {
			t.Errorf("second drain: exit %d, %q, %d requests", r.code, r.stdout, len(fake.Requests()))
		}
	})
	t.Run("DeadLeftExits3", func(t *testing.T) {
		t.Parallel()
		db := ledgerWithCharges(t, 2)
		fake := downstream.Start(t, nil)
		fake.FailNext(1, downstream.Status(400))
		r := runCLI(t, map[string]string{"MCP_OUTBOX_DEST_PAYMENTS": fake.URL()}, "drain", "--db", db)
		if r.code != 3 || !strings.Contains(r.stdout, "dead 1") || !strings.Contains(r.stdout, "outbox list") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want 3 and a dead effect", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("UnknownLeftExits3", func(t *testing.T) {
		t.Parallel()
		db := ledgerWithCharges(t, 1)
		fake := downstream.Start(t, &downstream.Options{NoDedup: true})
		fake.FailNext(1, downstream.AcceptThenClose())
		r := runCLI(t, nil, "drain", "--db", db, "--dest", "payments="+fake.URL()+";at_most_once")
		if r.code != 3 || !strings.Contains(r.stdout, "unknown 1") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want 3 and an unknown effect", r.code, r.stdout, r.stderr)
		}
		if got := len(fake.Requests()); got != 1 {
			t.Errorf("requests = %d, want exactly 1 for an at_most_once destination", got)
		}
	})
	t.Run("TimeoutWithPendingExits4", func(t *testing.T) {
		t.Parallel()
		db := ledgerWithCharges(t, 1)
		fake := downstream.Start(t, nil)
		fake.FailNext(100, downstream.Status(503))
		r := runCLI(t, nil, "drain", "--db", db, "--dest", "payments="+fake.URL(), "--timeout", "300ms")
		if r.code != 4 || !strings.Contains(r.stdout, "pending 1") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want 4 with the effect pending", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("Usage", func(t *testing.T) {
		t.Parallel()
		db := ledgerWithCharges(t, 0)
		if r := runCLI(t, nil, "drain", "--db", db); r.code != 2 || !strings.Contains(r.stderr, "no destinations") {
			t.Errorf("no destinations: exit %d, %q", r.code, r.stderr)
		}
		if r := runCLI(t, nil, "drain", "--db", filepath.Join(t.TempDir(), "missing.db"), "--dest", "payments=http://127.0.0.1:1"); r.code != 1 ||
			!strings.Contains(r.stderr, "does not exist") {
			t.Errorf("missing database: exit %d, %q", r.code, r.stderr)
		}
	})
}
