package schema

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations/*.up.sql
var embedded embed.FS

// outboxMigrations is the outbox's own migration set.
var outboxMigrations, _ = fs.Sub(embedded, "migrations")

// OutboxSet names the outbox's migration set in schema_migrations.
const OutboxSet = "outbox"

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

var migrationName = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.up\.sql$`)

// ReadMigrations reads NNN_name.up.sql files from the top of fsys, in version
// order. Versions must start at 1 and have no gaps or duplicates, and there
// must be at least one: an fsys without any is a mistake (most often an
// embed.FS given whole, whose files sit in a directory below its top; pass
// fs.Sub(fsys, "dir")), which would otherwise apply nothing without a word.
func ReadMigrations(fsys fs.FS) ([]Migration, error) {
	if fsys == nil {
		return nil, errors.New("read migrations: no file system given (nil fs.FS)")
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
			continue
		}
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("read migrations: %s: name is not NNN_name.up.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{Version: v, Name: path.Base(e.Name()), SQL: string(body)})
	}
	if len(ms) == 0 {
		switch {
		case len(dirs) == 1:
			return nil, fmt.Errorf("read migrations: no NNN_name.up.sql file at the top of the file system, only the directory %s: pass fs.Sub(fsys, %q)", dirs[0], dirs[0])
		case len(dirs) > 1:
			return nil, fmt.Errorf("read migrations: no NNN_name.up.sql file at the top of the file system, only the directories %s: "+
				"pass the one with the migrations, fs.Sub(fsys, \"DIR\"), or one per store through DB.MigrationsFor", strings.Join(dirs, ", "))
		}
		return nil, errors.New("read migrations: no NNN_name.up.sql file at the top of the file system")
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			if i > 0 && ms[i-1].Version == m.Version {
				return nil, fmt.Errorf("read migrations: version %d appears twice", m.Version)
			}
			return nil, fmt.Errorf("read migrations: version %d missing before %s", i+1, m.Name)
		}
	}
	return ms, nil
}

const createMigrationsTable = `
CREATE TABLE IF NOT EXISTS schema_migrations (
    set_name   TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL DEFAULT (unixepoch('subsec') * 1000),
    PRIMARY KEY (set_name, version)
)`

// Migrate applies the migrations in fsys that the set has not applied yet.
// Open applies the outbox's own set ([OutboxSet]); an application migrates
// its tables with a set of its own name, on every start, from a directory
// per store ([DB.MigrationsFor]); see ExampleDB_Migrate.
// All of them run in one IMMEDIATE transaction: a concurrent Migrate of the
// same set in another process waits for the lock, then finds them applied.
// A database that has a version this binary does not know is refused, so an
// old binary never runs against a newer schema.
//
// Foreign key enforcement is off while migrations run, as SQLite's
// procedure for rebuilding a table requires (with it on, dropping a table
// would first delete its rows and fire the ON DELETE actions of the tables
// that refer to it). Before committing, PRAGMA foreign_key_check must find
// no violation, or nothing is applied. Enforcement is back on when Migrate
// returns. The pragma has no effect inside a transaction, so Migrate holds
// the writer connection from before its transaction begins until after it
// ends.
func (db *DB) Migrate(ctx context.Context, set string, fsys fs.FS) (err error) {
	ms, err := ReadMigrations(fsys)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", set, err)
	}
	if db.Dialect == Postgres {
		return db.migratePostgres(ctx, set, ms)
	}
	conn, err := db.Write.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: take writer connection: %w", set, err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA foreign_keys = OFF"); err != nil {
		return fmt.Errorf("migrate %s: turn foreign keys off: %w", set, err)
	}
	defer func() {
		// Restored even when ctx has ended: every later transaction on this
		// connection relies on it. A connection that cannot be restored is
		// discarded, and the pool opens a new one with foreign keys on.
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "PRAGMA foreign_keys = ON"); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			err = errors.Join(err, fmt.Errorf("migrate %s: turn foreign keys back on: %w", set, rerr))
		}
	}()
	return migrate(ctx, conn, set, ms)
}

func migrate(ctx context.Context, conn *sql.Conn, set string, ms []Migration) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate %s: begin: %w", set, err)
	}
	defer tx.Rollback()

	if _, err := tx.ExecContext(ctx, createMigrationsTable); err != nil {
		return fmt.Errorf("migrate %s: create schema_migrations: %w", set, err)
	}
	n, err := applyMigrations(ctx, tx, set, ms)
	if err != nil {
		return err
	}
	if n > 0 {
		if err := checkForeignKeys(ctx, tx); err != nil {
			return fmt.Errorf("migrate %s: %w", set, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", set, err)
	}
	return nil
}

// applyMigrations applies, in tx, the migrations of ms that the set has
// not applied yet, and says how many it applied. The caller commits.
func applyMigrations(ctx context.Context, tx *sql.Tx, set string, ms []Migration) (int, error) {
	var applied int
	if err := tx.QueryRowContext(ctx,
		`SELECT coalesce(max(version), 0) FROM schema_migrations WHERE set_name = $1`, set,
	).Scan(&applied); err != nil {
		return 0, fmt.Errorf("migrate %s: read version: %w", set, err)
	}
	if applied > len(ms) {
		return 0, fmt.Errorf("migrate %s: database is at version %d, this binary knows %d: upgrade the binary", set, applied, len(ms))
	}
	for _, m := range ms[applied:] {
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return 0, fmt.Errorf("migrate %s: apply %s: %w", set, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO schema_migrations (set_name, version, name) VALUES ($1, $2, $3)`, set, m.Version, m.Name,
		); err != nil {
			return 0, fmt.Errorf("migrate %s: record %s: %w", set, m.Name, err)
		}
	}
	return len(ms) - applied, nil
}

// checkForeignKeys fails if any row refers to a row that does not exist,
// naming the first few.
func checkForeignKeys(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, "PRAGMA foreign_key_check")
	if err != nil {
		return fmt.Errorf("check foreign keys: %w", err)
	}
	defer rows.Close()
	var (
		bad []string
		n   int
	)
	for rows.Next() {
		var (
			table, parent string
			rowid         sql.NullInt64
			fkid          int64
		)
		if err := rows.Scan(&table, &rowid, &parent, &fkid); err != nil {
			return fmt.Errorf("check foreign keys: %w", err)
		}
		if n++; len(bad) < 5 {
			bad = append(bad, fmt.Sprintf("%s row %d refers to a missing row of %s", table, rowid.Int64, parent))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check foreign keys: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("foreign key check found %d violations, nothing applied: %s", n, strings.Join(bad, "; "))
	}
	return nil
}

// Version reports the highest applied version of a migration set, 0 if none.
func (db *DB) Version(ctx context.Context, set string) (int, error) {
	var v int
	err := db.Read.QueryRowContext(ctx,
		`SELECT coalesce(max(version), 0) FROM schema_migrations WHERE set_name = $1`, set).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("read %s version: %w", set, err)
	}
	return v, nil
}
