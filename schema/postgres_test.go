package schema_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestPostgresOpenMigratesOnceAndIsReady(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	// Replicas starting at once: every Open succeeds and the outbox set is
	// applied once.
	var wg sync.WaitGroup
	dbs := make([]*schema.DB, 4)
	errs := make([]error, 4)
	for i := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dbs[i], errs[i] = schema.Open(ctx, url, nil)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		defer dbs[i].Close()
	}
	db := dbs[0]
	if db.Dialect != schema.Postgres {
		t.Fatalf("dialect %q", db.Dialect)
	}
	var n int
	if err := db.Read.QueryRow(`SELECT count(*) FROM schema_migrations WHERE set_name = $1`, schema.OutboxSet).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// Each version once: the table's key would refuse a second row of a
	// version, but a replica that applied the set again would fail.
	ms, err := schema.ReadMigrations(os.DirFS("migrations_postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if n != len(ms) {
		t.Fatalf("outbox migrations recorded %d rows, want one per version (%d)", n, len(ms))
	}
	if err := db.CheckReady(ctx); err != nil {
		t.Fatalf("CheckReady: %v", err)
	}
}

func TestPostgresUnreachableFailsWithItsName(t *testing.T) {
	// A port nothing listens on: Open fails at once, naming the database
	// without its password.
	_, err := schema.Open(context.Background(), "postgres://u:secret@127.0.0.1:1/outbox?sslmode=disable", nil)
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
	if strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "127.0.0.1:1/outbox") {
		t.Fatalf("error %q: want the URL without its password", err)
	}
}

// 010 leaves room on calls' pages for outcomes (fillfactor 90): on a
// database that has calls already, it applies without touching them.
func TestPostgresCallsFillfactorMigratesExistingDatabase(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	db, err := schema.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Back to 009, as a database of the previous release, with a call.
	for _, q := range []string{
		`ALTER TABLE calls RESET (fillfactor)`,
		`DELETE FROM schema_migrations WHERE set_name = 'outbox' AND version = 10`,
		`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, result, created_at, completed_at, expires_at)
		 VALUES ('call_old', 'p', 'k', 'meta', 'charge', 'h', 'completed', '{}', 1, 1, 9e15)`,
	} {
		if _, err := db.Write.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	if db, err = schema.Open(ctx, url, nil); err != nil {
		t.Fatalf("migrate a database at 009: %v", err)
	}
	defer db.Close()
	var opts string
	if err := db.Read.QueryRow(`SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE relname = 'calls'`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if opts != "fillfactor=90" {
		t.Errorf("calls' options after 010: %q, want fillfactor=90", opts)
	}
	var n int
	if err := db.Read.QueryRow(`SELECT count(*) FROM calls WHERE uid = 'call_old' AND state = 'completed'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the call of before: %d rows, %v", n, err)
	}
}
