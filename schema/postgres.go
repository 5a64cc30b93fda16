package schema

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"time"
)

// Dialect names the database behind a [DB].
type Dialect string

const (
	// SQLite is the embedded store: one file, one writer.
	SQLite Dialect = "sqlite"
	// Postgres is the shared store of several replicas.
	Postgres Dialect = "postgres"
)

// IsPostgresURL reports whether target names a PostgreSQL database
// (postgres:// or postgresql://) rather than an SQLite file.
func IsPostgresURL(target string) bool {
	return strings.HasPrefix(target, "postgres://") || strings.HasPrefix(target, "postgresql://")
}

//go:embed migrations_postgres/*.up.sql
var embeddedPostgres embed.FS

var postgresMigrations, _ = fs.Sub(embeddedPostgres, "migrations_postgres")

// DefaultPostgresConns bounds the connections a process opens to
// PostgreSQL. Every recorded call holds one from its claim's transaction to
// the end of its outcome's, for as long as its handler runs statements.
const DefaultPostgresConns = 32

// migrateLock is the advisory lock key under which migrations run, so that
// replicas starting together apply each migration once ("mcp-outbox" in
// ASCII, as an int64).
const migrateLock = 0x6d63702d6f7574

// openStore opens target with the store registered for dialect d: a pool
// (Write and Read are the same), pinged, and migrated with the outbox set
// for d.
func openStore(ctx context.Context, d Dialect, target string, o Options) (*DB, error) {
	name := Redact(target)
	store, err := storeFor(d)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", name, err)
	}
	dsn, err := store.DSN(target, o.Durability)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", name, err)
	}
	driver := o.Driver
	if driver == "" {
		driver = store.DriverName()
	}
	pool, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", name, err)
	}
	conns := o.PostgresConns
	if conns <= 0 {
		conns = DefaultPostgresConns
	}
	pool.SetMaxOpenConns(conns)
	pool.SetMaxIdleConns(conns)
	pool.SetConnMaxIdleTime(5 * time.Minute)
	db := &DB{Write: pool, Read: pool, Path: name, Durability: o.Durability, Dialect: d, store: store, dsn: dsn}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.PingContext(pctx); err != nil {
		pool.Close()
		if store.Unavailable(err) {
			return nil, fmt.Errorf("open database %s: %w: %w", name, ErrUnavailable, err)
		}
		return nil, fmt.Errorf("open database %s: %w", name, err)
	}
	if err := db.Migrate(ctx, OutboxSet, postgresMigrations); err != nil {
		pool.Close()
		if store.Unavailable(err) {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, err
	}
	return db, nil
}

// Redact is a database target fit for logs and errors: an SQLite path as
// it is, a PostgreSQL URL without its password and settings.
func Redact(target string) string {
	if !IsPostgresURL(target) {
		return target
	}
	u, err := url.Parse(target)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	u.RawQuery = ""
	return u.String()
}

const createMigrationsTablePostgres = `
CREATE TABLE IF NOT EXISTS schema_migrations (
    set_name   TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    applied_at BIGINT  NOT NULL DEFAULT ((extract(epoch FROM clock_timestamp()) * 1000)::bigint),
    PRIMARY KEY (set_name, version)
)`

// migratePostgres applies ms in one transaction that first takes an
// advisory lock, so that replicas starting at once wait for each other
// (CREATE TABLE IF NOT EXISTS alone races: two transactions can both find
// the table missing). PostgreSQL's DDL is transactional, so a failed
// migration leaves nothing behind.
func (db *DB) migratePostgres(ctx context.Context, set string, ms []Migration) error {
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate %s: begin: %w", set, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
		return fmt.Errorf("migrate %s: lock: %w", set, err)
	}
	if _, err := tx.ExecContext(ctx, createMigrationsTablePostgres); err != nil {
		return fmt.Errorf("migrate %s: create schema_migrations: %w", set, err)
	}
	if _, err := applyMigrations(ctx, tx, set, ms); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", set, err)
	}
	return nil
}

// MigrationsFor picks an application's migration set for db's dialect:
// sqlite for SQLite, postgres for PostgreSQL. Either may be nil when the
// application does not support that store.
func (db *DB) MigrationsFor(sqlite, postgres fs.FS) (fs.FS, error) {
	m := sqlite
	if db.Dialect == Postgres {
		m = postgres
	}
	if m == nil {
		return nil, fmt.Errorf("no migrations for %s", db.Dialect)
	}
	return m, nil
}

// Pick returns the statement for db's dialect. Most statements are
// written once and run on both stores; the few that cannot are written
// twice, side by side.
func (db *DB) Pick(sqlite, postgres string) string {
	if db.Dialect == Postgres {
		return postgres
	}
	return sqlite
}
