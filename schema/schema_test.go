package schema_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
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

	// A set that holds no migration at its top is refused, not applied as
	// nothing: most often an embed.FS given whole, its files a directory
	// down. The error says to take the directory with fs.Sub.
	embedWhole := fstest.MapFS{"migrations/001_a.up.sql": {Data: []byte(`CREATE TABLE w (x)`)}}
	if err := db.Migrate(ctx, "whole", embedWhole); err == nil || !strings.Contains(err.Error(), `fs.Sub(fsys, "migrations")`) {
		t.Errorf("migrations a directory down: err = %v, want one naming fs.Sub", err)
	}
	perStore := fstest.MapFS{"m/sqlite/001_a.up.sql": {}, "m/postgres/001_a.up.sql": {}}
	sub, _ := fs.Sub(perStore, "m")
	if err := db.Migrate(ctx, "stores", sub); err == nil || !strings.Contains(err.Error(), "MigrationsFor") || strings.Contains(err.Error(), `fs.Sub(fsys, "postgres")`) {
		t.Errorf("a directory per store: err = %v, want one naming MigrationsFor, not one directory", err)
	}
	if err := db.Migrate(ctx, "empty", fstest.MapFS{}); err == nil {
		t.Error("no migrations: want an error")
	}
	if err := db.Migrate(ctx, "nil", nil); err == nil {
		t.Error("nil fs.FS: want an error, not a panic")
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
	ms, err := schema.ReadMigrations(os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write.Exec(`DELETE FROM schema_migrations WHERE set_name = 'outbox' AND version = $1`, len(ms)); err != nil {
		t.Fatal(err)
	}
	if err := db.CheckReady(ctx); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("version %d", len(ms)-1)) {
		t.Errorf("old schema: err = %v", err)
	}
}

// openAtVersion2 makes a database file with the outbox schema as version 2
// left it, the way a binary from before migration 3 did, and returns a
// handle on it that applies no migrations.
func openAtVersion2(t *testing.T, path string) *schema.DB {
	t.Helper()
	v2 := fstest.MapFS{}
	for _, name := range []string{"001_outbox.up.sql", "002_readiness.up.sql"} {
		b, err := os.ReadFile(filepath.Join("migrations", name))
		if err != nil {
			t.Fatal(err)
		}
		v2[name] = &fstest.MapFile{Data: b}
	}
	dsn := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_txlock=immediate"
	w, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	w.SetMaxOpenConns(1)
	r, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := &schema.DB{Write: w, Read: r, Path: path}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(context.Background(), schema.OutboxSet, v2); err != nil {
		t.Fatal(err)
	}
	if v, _ := db.Version(context.Background(), schema.OutboxSet); v != 2 {
		t.Fatalf("version %d, want 2", v)
	}
	return db
}

// dump renders the rows a query returns, one line each, for comparing a
// table before and after a migration.
func dump(t *testing.T, db *sql.DB, q string) string {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var b strings.Builder
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(&b, vals...)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

const (
	callColumns   = `id, uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, attempts, result, created_at, completed_at, expires_at`
	effectColumns = `id, call_id, seq, destination, method, path, headers, body, idempotency_key, state, attempts, next_attempt_at, lease_owner, lease_until, send_started_at, last_error, last_status, response, created_at, updated_at, delivered_at`
)

// Migration 3 rebuilds calls. Every call keeps its id and every effect its
// call_id (dropping the old table with foreign keys enforced would have
// set them all to NULL), the id sequence continues past purged calls,
// the constraints and the index are there, and foreign keys are enforced
// again afterwards. Several processes upgrading at once apply it once.
func TestMigrate3_RebuildsCallsKeepingRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v2.db")
	old := openAtVersion2(t, path)
	for i, st := range []string{"completed", "failed", "in_flight", "completed", "completed"} {
		var result, completed any
		if st != "in_flight" {
			result, completed = fmt.Sprintf(`{"content":[{"type":"text","text":"call %d"}]}`, i+1), 2000+i
		}
		if _, err := old.Write.Exec(`
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, attempts, result, created_at, completed_at, expires_at)
VALUES ($1, 'local', $2, 'meta', 'charge', 'hash', $3, $4, $5, $6, $7, $8, $9, $10)`,
			fmt.Sprintf("call_%d", i+1), fmt.Sprintf("key-%d", i+1), st, map[bool]string{true: "owner/1"}[st == "in_flight"],
			3000+i, 1+i%2, result, 1000+i, completed, 90000+i); err != nil {
			t.Fatal(err)
		}
	}
	// Effects of calls 1, 2 and 4, and one whose call was purged.
	for i, callID := range []any{1, 1, 2, 4, nil} {
		if _, err := old.Write.Exec(`
INSERT INTO effects (call_id, seq, destination, method, path, body, idempotency_key, state, next_attempt_at, created_at, updated_at)
VALUES ($1, $2, 'payments', 'POST', '/v1/charges', x'7b7d', $3, 'pending', 5000, 4000, 4000)`,
			callID, i+1, fmt.Sprintf("idem-%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	// The newest call is purged: its id must not be handed out again.
	if _, err := old.Write.Exec(`DELETE FROM calls WHERE id = 5`); err != nil {
		t.Fatal(err)
	}
	callsBefore := dump(t, old.Read, `SELECT `+callColumns+` FROM calls ORDER BY id`)
	effectsBefore := dump(t, old.Read, `SELECT `+effectColumns+` FROM effects ORDER BY id`)
	old.Close()

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			db, err := schema.Open(ctx, path, nil)
			if err == nil {
				err = db.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	db := open(t, path, nil)
	if v, latest := dbVersion(t, db), latestMigration(t); v != latest {
		t.Errorf("version %d, want the latest, %d", v, latest)
	}
	if n := countOf(t, db, `SELECT count(*) FROM schema_migrations WHERE set_name = 'outbox' AND version = 3`); n != 1 {
		t.Errorf("migration 3 recorded %d times", n)
	}
	if got := dump(t, db.Read, `SELECT `+callColumns+` FROM calls ORDER BY id`); got != callsBefore {
		t.Errorf("calls changed:\n%s\nwant\n%s", got, callsBefore)
	}
	if got := dump(t, db.Read, `SELECT `+effectColumns+` FROM effects ORDER BY id`); got != effectsBefore {
		t.Errorf("effects changed:\n%s\nwant\n%s", got, effectsBefore)
	}
	if n := countOf(t, db, `SELECT count(*) FROM effects WHERE call_id IS NOT NULL`); n != 4 {
		t.Errorf("%d effects have a call, want 4", n)
	}
	if got := dump(t, db.Read, `SELECT DISTINCT on_lost FROM calls`); got != "rerun\n" {
		t.Errorf("on_lost of the existing calls: %q, want rerun", got)
	}
	// Migration 7: calls made before it have no tool-call id.
	if got := dump(t, db.Read, `SELECT DISTINCT tool_call_id FROM calls`); got != "\n" {
		t.Errorf("tool_call_id of the existing calls: %q, want ''", got)
	}
	// Migration 8: calls made before it are no tasks.
	if got := dump(t, db.Read, `SELECT DISTINCT coalesce(task_id, 'none') || task_end || task_cancel FROM calls`); got != "none0\n" {
		t.Errorf("task columns of the existing calls: %q, want no task", got)
	}
	if got := pragma(t, db, "foreign_keys"); got != "1" {
		t.Errorf("foreign_keys = %s after migrating, want 1", got)
	}
	// 003's rebuild kept calls_expiry and calls_unknown; 008 and 009 added the task indexes.
	if got := dump(t, db.Read, `SELECT name FROM sqlite_master WHERE tbl_name = 'calls' AND type = 'index' AND sql IS NOT NULL ORDER BY name`); got != "calls_expiry\ncalls_task\ncalls_task_in_flight\ncalls_task_principal\ncalls_unknown\n" {
		t.Errorf("indexes on calls: %q, want calls_expiry, calls_task, calls_task_in_flight, calls_task_principal and calls_unknown", got)
	}
	// tasks/list's page query (outbox/task_2025_methods.go) reads that index, not
	// the whole table.
	if plan := dump(t, db.Read, `EXPLAIN QUERY PLAN SELECT id, task_id FROM calls WHERE principal = 'p' AND task_id IS NOT NULL AND id > 0 ORDER BY id LIMIT 50`); !strings.Contains(plan, "calls_task_principal") {
		t.Errorf("tasks/list's query plan:\n%s\nwant it to use calls_task_principal", plan)
	}
	if got := dump(t, db.Read, `SELECT name FROM sqlite_master WHERE name LIKE 'calls_new%'`); got != "" {
		t.Errorf("left behind: %q", got)
	}

	insert := func(uid, key, state, onLost string) (int64, error) {
		res, err := db.Write.Exec(`
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, created_at, expires_at, on_lost)
VALUES ($1, 'local', $2, 'meta', 'charge', 'hash', $3, 1, 2, $4)`, uid, key, state, onLost)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	id, err := insert("call_new", "key-new", "unknown", "unknown")
	if err != nil {
		t.Fatalf("a call in state unknown: %v", err)
	}
	if id != 6 {
		t.Errorf("new call id %d, want 6: the sequence must continue past the purged call 5", id)
	}
	for _, tc := range []struct{ what, uid, key, state, onLost, want string }{
		{"bad on_lost", "call_x", "key-x", "in_flight", "retry", "CHECK constraint failed"},
		{"bad state", "call_y", "key-y", "lost", "rerun", "CHECK constraint failed"},
		{"same principal and key", "call_z", "key-1", "in_flight", "rerun", "UNIQUE constraint failed"},
		{"same uid", "call_1", "key-z", "in_flight", "rerun", "UNIQUE constraint failed"},
	} {
		if _, err := insert(tc.uid, tc.key, tc.state, tc.onLost); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %s", tc.what, err, tc.want)
		}
	}

	// The foreign key refers to the new table and is enforced.
	if _, err := db.Write.Exec(`
INSERT INTO effects (call_id, seq, destination, method, path, idempotency_key, next_attempt_at, created_at, updated_at)
VALUES (999, 1, 'payments', 'POST', '/', 'idem-orphan', 1, 1, 1)`); err == nil || !strings.Contains(err.Error(), "FOREIGN KEY") {
		t.Errorf("an effect of a missing call: err = %v, want a foreign key error", err)
	}
	if _, err := db.Write.Exec(`DELETE FROM calls WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if n := countOf(t, db, `SELECT count(*) FROM effects WHERE call_id IS NULL`); n != 3 {
		t.Errorf("%d effects without a call after deleting call 1, want 3 (ON DELETE SET NULL)", n)
	}
}

func countOf(t *testing.T, db *schema.DB, q string) int {
	t.Helper()
	var n int
	if err := db.Read.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A batch that leaves a row referring to a missing one is refused whole,
// and foreign keys are enforced again afterwards.
func TestMigrate_ForeignKeyCheck(t *testing.T) {
	t.Parallel()
	db := open(t, filepath.Join(t.TempDir(), "fk.db"), nil)
	ctx := context.Background()
	bad := fstest.MapFS{
		"001_parent.up.sql": {Data: []byte(`CREATE TABLE parent (id INTEGER PRIMARY KEY)`)},
		"002_child.up.sql": {Data: []byte(`CREATE TABLE child (parent_id INTEGER REFERENCES parent (id));
INSERT INTO child VALUES (7)`)},
	}
	err := db.Migrate(ctx, "fk", bad)
	if err == nil || !strings.Contains(err.Error(), "child row 1 refers to a missing row of parent") {
		t.Fatalf("err = %v, want a foreign key violation naming the row", err)
	}
	if n := countOf(t, db, `SELECT count(*) FROM sqlite_master WHERE name IN ('parent', 'child')`); n != 0 {
		t.Errorf("a refused batch left %d tables behind", n)
	}
	if v, _ := db.Version(ctx, "fk"); v != 0 {
		t.Errorf("version %d after a refused batch, want 0", v)
	}
	if got := pragma(t, db, "foreign_keys"); got != "1" {
		t.Errorf("foreign_keys = %s after a failed migration, want 1", got)
	}
	// The same tables without the orphan apply.
	bad["002_child.up.sql"] = &fstest.MapFile{Data: []byte(`CREATE TABLE child (parent_id INTEGER REFERENCES parent (id))`)}
	if err := db.Migrate(ctx, "fk", bad); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write.Exec(`INSERT INTO child VALUES (7)`); err == nil {
		t.Error("foreign keys not enforced after migrating")
	}
}

func dbVersion(t *testing.T, db *schema.DB) int {
	t.Helper()
	v, err := db.Version(context.Background(), schema.OutboxSet)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// latestMigration is the number of the newest migration file.
func latestMigration(t *testing.T) int {
	t.Helper()
	ms, err := schema.ReadMigrations(os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	return ms[len(ms)-1].Version
}

// A PostgreSQL keyword/value connection string is refused with a clear
// error, its password hidden, instead of becoming a new SQLite file.
func TestOpen_KeywordDSNRefused(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, target := range []string{"host=127.0.0.1 port=55432 dbname=helpdesk password=hunter2", "dbname=app"} {
		_, err := schema.Open(context.Background(), target, nil)
		if err == nil || !strings.Contains(err.Error(), "postgres:// URL") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Open(%q) = %v; want a refusal naming postgres:// URLs, without the password", target, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("Open left %d files in the working directory; want none", len(entries))
	}
}
