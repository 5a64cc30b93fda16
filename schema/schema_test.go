package schema_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

func open(t *testing.T, path string, opts *schema.Options) *schema.DB {
	t.Helper()
	db, err := schema.Open(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func pragma(t *testing.T, db *schema.DB, name string) string {
	t.Helper()
	var v string
	if err := db.Write.QueryRow("PRAGMA " + name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestOpen_Settings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		durability schema.Durability
		want       string // PRAGMA synchronous: 1 NORMAL, 2 FULL
	}{{"", "2"}, {schema.DurabilityFull, "2"}, {schema.DurabilityNormal, "1"}} {
		db := open(t, filepath.Join(t.TempDir(), "x.db"), &schema.Options{Durability: tc.durability})
		if got := pragma(t, db, "synchronous"); got != tc.want {
			t.Errorf("durability %q: synchronous = %s, want %s", tc.durability, got, tc.want)
		}
		if got := pragma(t, db, "journal_mode"); got != "wal" {
			t.Errorf("journal_mode = %s, want wal", got)
		}
		if got := pragma(t, db, "foreign_keys"); got != "1" {
			t.Errorf("foreign_keys = %s, want 1", got)
		}
		if got := pragma(t, db, "busy_timeout"); got != "5000" {
			t.Errorf("busy_timeout = %s, want 5000", got)
		}
	}
}

func TestOpen_Errors(t *testing.T) {
	t.Parallel()
	if _, err := schema.Open(context.Background(), "/nonexistent/dir/x.db", nil); err == nil || !strings.Contains(err.Error(), "/nonexistent/dir") {
		t.Errorf("missing directory: err = %v, want one naming the path", err)
	}
	if _, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "x.db"), &schema.Options{Durability: "sometimes"}); err == nil {
		t.Error("bad durability: want an error")
	}
	if _, err := schema.ParseDurability("NORMAL"); err != nil {
		t.Errorf("ParseDurability(NORMAL): %v", err)
	}
}

// Two processes opening a new file at once: every open succeeds and each
// migration is applied once. Separate Open calls have separate connections,
// which is what SQLite's locking sees of two processes.
func TestOpen_Concurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.db")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			db, err := schema.Open(context.Background(), path, nil)
			if err != nil {
				errs <- err
				return
			}
			db.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	db := open(t, path, nil)
	var n int
	if err := db.Read.QueryRow(`SELECT count(*) FROM schema_migrations WHERE set_name = 'outbox'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// Each migration recorded once: exactly the set's versions, no repeats.
	var distinct int
	if err := db.Read.QueryRow(`SELECT count(DISTINCT version) FROM schema_migrations WHERE set_name = 'outbox'`).Scan(&distinct); err != nil {
		t.Fatal(err)
	}
	if n != distinct || n < 2 {
		t.Errorf("outbox migrations recorded %d rows for %d versions", n, distinct)
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := open(t, filepath.Join(t.TempDir(), "m.db"), nil)
	ctx := context.Background()
	v1 := fstest.MapFS{"001_a.up.sql": {Data: []byte(`CREATE TABLE a (x)`)}}
	v2 := fstest.MapFS{
		"001_a.up.sql": {Data: []byte(`CREATE TABLE a (x)`)},
		"002_b.up.sql": {Data: []byte(`CREATE TABLE b (y)`)},
	}
	if err := db.Migrate(ctx, "app", v1); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, "app", v2); err != nil { // applies only 002
		t.Fatal(err)
	}
	if v, _ := db.Version(ctx, "app"); v != 2 {
		t.Errorf("version = %d, want 2", v)
	}
	if err := db.Migrate(ctx, "app", v1); err == nil || !strings.Contains(err.Error(), "upgrade the binary") {
		t.Errorf("older binary on a newer schema: err = %v", err)
	}

	for name, fsys := range map[string]fstest.MapFS{
		"gap":       {"001_a.up.sql": {}, "003_c.up.sql": {}},
		"duplicate": {"001_a.up.sql": {}, "001_b.up.sql": {}},
		"badname":   {"one.sql": {}},
	} {
		if _, err := schema.ReadMigrations(fsys); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}

	// A failing migration applies nothing of its batch.
	bad := fstest.MapFS{"001_ok.up.sql": {Data: []byte(`CREATE TABLE ok (x)`)}, "002_bad.up.sql": {Data: []byte(`CREATE TABLE`)}}
	if err := db.Migrate(ctx, "other", bad); err == nil {
		t.Fatal("bad SQL: want an error")
	}
	var n int
	db.Read.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'ok'`).Scan(&n)
	if n != 0 {
		t.Error("a failed migration batch left a table behind")
	}
}

func TestRelaxed(t *testing.T) {
	t.Parallel()
	db := open(t, filepath.Join(t.TempDir(), "r.db"), nil)
	var inside string
	err := db.Relaxed(context.Background(), func(c *sql.Conn) error {
		return c.QueryRowContext(context.Background(), "PRAGMA synchronous").Scan(&inside)
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside != "1" {
		t.Errorf("synchronous inside Relaxed = %s, want 1 (NORMAL)", inside)
	}
	// The single writer connection is back at FULL for everything else.
	if got := pragma(t, db, "synchronous"); got != "2" {
		t.Errorf("synchronous after Relaxed = %s, want 2 (FULL)", got)
	}
}

func TestCheckReady(t *testing.T) {
	t.Parallel()
	db := open(t, filepath.Join(t.TempDir(), "ready.db"), nil)
	ctx := context.Background()
	if err := db.CheckReady(ctx); err != nil {
		t.Fatalf("fresh database: %v", err)
	}
	// A database that refuses writes is not ready.
	if _, err := db.Write.Exec(`PRAGMA query_only = 1`); err != nil {
		t.Fatal(err)
	}
	if err := db.CheckReady(ctx); err == nil || !strings.Contains(err.Error(), "write") {
		t.Errorf("read-only database: err = %v, want a write error", err)
	}
	if _, err := db.Write.Exec(`PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	// A schema behind this binary is not ready.
	if _, err := db.Write.Exec(`DELETE FROM schema_migrations WHERE set_name = 'outbox' AND version = 2`); err != nil {
		t.Fatal(err)
	}
	if err := db.CheckReady(ctx); err == nil || !strings.Contains(err.Error(), "version 1") {
		t.Errorf("old schema: err = %v", err)
	}
}
