package schema

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
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

func openPostgres(ctx context.Context, target string, o Options) (*DB, error) {
	name := Redact(target)
	cfg, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", name, err)
	}
	q := cfg.Query()
	if q.Get("application_name") == "" {
		q.Set("application_name", "mcp-outbox")
	}
	if q.Get("connect_timeout") == "" {
		// pgx waits for ever by default; an unreachable store must fail a
		// call with an error, not hang it.
		q.Set("connect_timeout", "5")
	}
	if o.Durability == DurabilityNormal {
		// The counterpart of synchronous=NORMAL: a commit returns before
		// its WAL is flushed; a crash of the server (not of this process)
		// can lose the last commits, never half of one.
		q.Set("synchronous_commit", "off")
	}
	cfg.RawQuery = q.Encode()
	driver := "pgx" // unless a test wraps it (Options.Driver, which Open defaulted to SQLite's)
	if o.Driver != "sqlite" {
		driver = o.Driver
	}
	pool, err := sql.Open(driver, cfg.String())
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
	db := &DB{Write: pool, Read: pool, Path: name, Durability: o.Durability, Dialect: Postgres, url: cfg.String()}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.PingContext(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open database %s: %w", name, err)
	}
	if err := db.Migrate(ctx, OutboxSet, postgresMigrations); err != nil {
		pool.Close()
		return nil, err
	}
	return db, nil
}

// URL is the connection string of a PostgreSQL database, with the settings
// Open added; "" for SQLite. It is for connections outside the pool (a
// listener).
func (db *DB) URL() string { return db.url }

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

// PostgreSQL error codes (SQLSTATE) that the layer tells apart.
const (
	PgUniqueViolation      = "23505"
	PgSerializationFailure = "40001"
	PgDeadlockDetected     = "40P01"
	PgLockNotAvailable     = "55P03"
	PgQueryCanceled        = "57014"
)

// PgCode is the SQLSTATE of a PostgreSQL error, or "" for any other error.
func PgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// PgCommitRolledBack reports whether err is a COMMIT that PostgreSQL
// answered with ROLLBACK: an error had ended the transaction before, so
// nothing of it committed.
func PgCommitRolledBack(err error) bool { return errors.Is(err, pgx.ErrTxCommitRollback) }

// PgUnavailable reports whether err says the server could not be reached
// or went away (connection refused or reset, the server shutting down or
// in recovery): the store failed, not the statement.
func PgUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if code := PgCode(err); code != "" {
		// Class 08: connection exception; 57P: operator intervention
		// (admin shutdown, crash shutdown, cannot connect now); 53:
		// insufficient resources (disk full, out of memory, too many
		// connections); 58: system error (I/O).
		return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") ||
			strings.HasPrefix(code, "53") || strings.HasPrefix(code, "58")
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "unexpected EOF") ||
		strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset") ||
		strings.Contains(msg, "conn closed") || strings.Contains(msg, "driver: bad connection")
}
