package schema

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Durability selects SQLite's synchronous setting.
type Durability string

const (
	// DurabilityFull (synchronous=FULL) survives power loss. The default.
	DurabilityFull Durability = "full"
	// DurabilityNormal (synchronous=NORMAL) survives a crash of the process,
	// not a power loss: the last commits may be lost when the machine stops.
	DurabilityNormal Durability = "normal"
)

// ParseDurability accepts "full" or "normal", in any case.
func ParseDurability(s string) (Durability, error) {
	switch d := Durability(strings.ToLower(strings.TrimSpace(s))); d {
	case DurabilityFull, DurabilityNormal:
		return d, nil
	case "":
		return DurabilityFull, nil
	}
	return "", fmt.Errorf("durability %q: want full or normal", s)
}

// DefaultBusyTimeout is how long a statement waits for another connection's
// write lock before failing with SQLITE_BUSY.
const DefaultBusyTimeout = 5 * time.Second

// DefaultReadConns is the size of the read pool.
const DefaultReadConns = 4

// Options configure [Open]. The zero value of each field selects its default.
type Options struct {
	// Durability is the synchronous level; zero means DurabilityFull.
	Durability Durability
	// BusyTimeout is SQLite's busy_timeout; zero means DefaultBusyTimeout.
	BusyTimeout time.Duration
	// ReadConns bounds the read pool; zero means DefaultReadConns.
	ReadConns int
	// Driver is the database/sql driver name; empty means the store's
	// own: "sqlite" (modernc.org/sqlite), or "pgx" for a postgres:// URL.
	// It is for a driver that wraps the store's own under another name,
	// to instrument it (otelsql.Register returns such a name) or to
	// inject faults in tests (internal/faultdb). A driver given must take
	// the DSN of the one it wraps. The dialect comes from the target,
	// never from the driver, so a wrapper changes nothing else.
	Driver string
	// PostgresConns bounds the connections to a PostgreSQL store; zero
	// means DefaultPostgresConns. SQLite ignores it.
	PostgresConns int
}

// DB is an open mcp-outbox database.
type DB struct {
	// Write has exactly one connection on SQLite; its transactions begin
	// IMMEDIATE. On PostgreSQL it is the pool, the same as Read.
	Write *sql.DB
	// Read is a pool for queries that write nothing.
	Read *sql.DB
	// Path is the file the database lives in, or on PostgreSQL its URL
	// without password or settings, for messages.
	Path string
	// Durability is the synchronous level every connection uses.
	Durability Durability
	// Dialect is SQLite or Postgres. The zero value means SQLite.
	Dialect Dialect

	store Store  // nil on SQLite
	dsn   string // the store's data source name, for connections outside the pool
	// close, when set, is what Close does instead of closing Write and
	// Read: the DB was made of a handle its user keeps (handle.Adopt).
	close func() error
}

// Open opens a database and applies the outbox migrations. target is the
// path of an SQLite file (created if needed; WAL, busy_timeout, foreign
// keys and the durability level are set on every connection), or a
// postgres:// URL of an existing PostgreSQL database, which needs the
// PostgreSQL store linked in (import _
// "github.com/mcp-outbox/mcp-outbox/schema/postgres"); without it, Open
// fails with an error saying so.
//
// Open makes the pool itself. To hand the layer a pool or *sql.DB the
// program configures (TLS, credentials, sizes, a tracer), use
// postgres.FromPool or postgres.FromDB (package schema/postgres), or
// sqlite.FromDB (package schema/sqlite), which return the same DB.
func Open(ctx context.Context, target string, opts *Options) (*DB, error) {
	path := target
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Durability == "" {
		o.Durability = DurabilityFull
	}
	if _, err := ParseDurability(string(o.Durability)); err != nil {
		return nil, err
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = DefaultBusyTimeout
	}
	if o.ReadConns <= 0 {
		o.ReadConns = DefaultReadConns
	}
	if path == "" {
		return nil, errors.New("open database: empty path")
	}
	if IsPostgresURL(target) {
		return openStore(ctx, Postgres, target, o)
	}
	if looksLikeKeywordDSN(target) {
		// Otherwise it would silently become the name of a new SQLite
		// file in the working directory.
		return nil, fmt.Errorf("open database: %q looks like a PostgreSQL keyword/value connection string; "+
			"give a postgres:// URL (postgres://USER@HOST:PORT/DB?sslmode=…) or an SQLite file path", redactKeywordDSN(target))
	}
	if o.Driver == "" {
		o.Driver = "sqlite"
	}
	if dir := filepath.Dir(path); dir != "" {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("open database %s: directory: %w", path, err)
		}
	}

	write, err := sql.Open(o.Driver, dsn(path, o, "immediate"))
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxLifetime(0)
	write.SetConnMaxIdleTime(0)

	read, err := sql.Open(o.Driver, dsn(path, o, "deferred"))
	if err != nil {
		write.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	read.SetMaxOpenConns(o.ReadConns)
	read.SetMaxIdleConns(o.ReadConns)

	db := &DB{Write: write, Read: read, Path: path, Durability: o.Durability, Dialect: SQLite}
	if err := db.setWAL(ctx, o.BusyTimeout); err != nil {
		db.Close()
		return nil, err
	}
	if err := db.Migrate(ctx, OutboxSet, outboxMigrations); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// dsn builds a modernc.org/sqlite data source name. busy_timeout comes first
// so that the pragmas after it wait for a lock instead of failing at once.
func dsn(path string, o Options, txlock string) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", o.BusyTimeout.Milliseconds()))
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous("+strings.ToUpper(string(o.Durability))+")")
	q.Set("_txlock", txlock)
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// setWAL switches the file to WAL mode. The mode is stored in the file, so
// one connection suffices; switching needs a moment of exclusive access and
// SQLite reports SQLITE_BUSY without waiting on busy_timeout when another
// process holds the file, hence the retry until the busy timeout. Other
// errors are final: retrying a damaged file only kept the caller waiting
// out the busy timeout before it heard why.
//
// This is the first statement that reads the file, so it is where a file
// that is not a database, or one cut short, is found. SQLite writes
// nothing to such a file; the error says so and names it.
func (db *DB) setWAL(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var mode string
		err := db.Write.QueryRowContext(ctx, "PRAGMA journal_mode=WAL").Scan(&mode)
		if err == nil && strings.EqualFold(mode, "wal") {
			return nil
		}
		switch code := sqliteCode(err); {
		case code == sqliteNotADB || code == sqliteCorrupt:
			return fmt.Errorf("open database %s: the file is not an SQLite database or is damaged (%w); "+
				"it was left as it is: restore it from a backup, or give another file", db.Path, err)
		case err != nil && code != sqliteBusy && code != sqliteLocked:
			return fmt.Errorf("open database %s: set WAL: %w", db.Path, err)
		case err == nil:
			err = fmt.Errorf("journal mode is %q", mode)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("open database %s: set WAL: %w", db.Path, err)
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// SQLite's primary result codes that Open tells apart.
const (
	sqliteBusy    = 5
	sqliteLocked  = 6
	sqliteCorrupt = 11
	sqliteNotADB  = 26
)

// sqliteCode is the primary result code of a modernc.org/sqlite error, or
// 0 for any other error.
func sqliteCode(err error) int {
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	if errors.As(err, &e) {
		return e.Code() & 0xff
	}
	return 0
}

// Close closes both handles. A DB made of the user's own handle
// (postgres.FromPool, postgres.FromDB, sqlite.FromDB) closes only what the
// layer opened beside it: the user's pool or *sql.DB stays open, theirs to
// close, after the DB.
func (db *DB) Close() error {
	if db.close != nil {
		return db.close()
	}
	if db.Read == db.Write {
		return db.Write.Close()
	}
	return errors.Join(db.Write.Close(), db.Read.Close())
}

// Relaxed runs fn on the writer connection with synchronous=NORMAL, then
// restores the database's level. It is for writes that may be lost on power
// loss without harm: in WAL mode every later FULL commit fsyncs the log,
// and with it every frame written before, so a relaxed write becomes
// durable with the next full commit, and is only ever lost together with
// everything that came after it. The outbox's claims are such writes: a
// lost claim leaves a call that never ran, which a retry runs.
//
// If the level cannot be restored the connection is discarded, so that no
// later transaction runs with less durability than configured.
//
// On PostgreSQL the level is synchronous_commit, and relaxed means off:
// a commit returns before its WAL is flushed, and PostgreSQL flushes the
// WAL in order, so the same holds.
func (db *DB) Relaxed(ctx context.Context, fn func(*sql.Conn) error) error {
	conn, err := db.Write.Conn(ctx)
	if err != nil {
		return fmt.Errorf("take writer connection: %w", err)
	}
	defer conn.Close()
	if db.Durability == DurabilityNormal {
		return fn(conn)
	}
	if db.Dialect == Postgres {
		return db.relaxedPostgres(ctx, conn, fn)
	}
	if _, err := conn.ExecContext(ctx, "PRAGMA synchronous=NORMAL"); err != nil {
		return fmt.Errorf("relax synchronous: %w", err)
	}
	ferr := fn(conn)
	if _, err := conn.ExecContext(context.WithoutCancel(ctx), "PRAGMA synchronous=FULL"); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		return errors.Join(ferr, fmt.Errorf("restore synchronous: %w", err))
	}
	return ferr
}

// relaxedPostgres is Relaxed on PostgreSQL. It restores the level the
// connection had, not the server's default (which RESET would): on a pool
// the user configures (postgres.FromPool), the connection may carry a
// level of their own, set by their AfterConnect, that their next
// transaction on it relies on. The prior level comes back in the same
// round trip as the change (the select list is evaluated left to right).
func (db *DB) relaxedPostgres(ctx context.Context, conn *sql.Conn, fn func(*sql.Conn) error) error {
	var was string
	err := conn.QueryRowContext(ctx,
		`SELECT current_setting('synchronous_commit'), set_config('synchronous_commit', 'off', false)`).Scan(&was, new(string))
	if err != nil {
		return fmt.Errorf("relax synchronous_commit: %w", err)
	}
	if was == "off" {
		return fn(conn) // relaxed already (Durability normal, or the user's pool)
	}
	ferr := fn(conn)
	if _, err := conn.ExecContext(context.WithoutCancel(ctx), `SELECT set_config('synchronous_commit', $1, false)`, was); err != nil {
		// The connection must not go back to the pool relaxed. database/sql
		// discards it on ErrBadConn, but under a pool of pgx's
		// (stdlib.OpenDBFromPool) discarding only releases the pgx
		// connection to it, alive: the store closes it first (discarder).
		_ = conn.Raw(func(dc any) error {
			if d, ok := db.store.(discarder); ok {
				d.Discard(dc)
			}
			return driver.ErrBadConn
		})
		return errors.Join(ferr, fmt.Errorf("restore synchronous_commit: %w", err))
	}
	return ferr
}

// discarder is a Store that can close a connection of its driver for
// good, whatever pool it came from.
type discarder interface{ Discard(driverConn any) }

// looksLikeKeywordDSN reports whether target reads as libpq's keyword/value
// form ("host=db port=5432 dbname=app"), which no SQLite path is meant to
// be: a keyword libpq knows, then '='.
func looksLikeKeywordDSN(target string) bool {
	for _, kw := range []string{"host=", "hostaddr=", "dbname=", "user=", "port=", "password=", "sslmode="} {
		if strings.HasPrefix(target, kw) || strings.Contains(target, " "+kw) {
			return true
		}
	}
	return false
}

// redactKeywordDSN hides a password= value, for error messages.
func redactKeywordDSN(target string) string {
	fields := strings.Fields(target)
	for i, f := range fields {
		if strings.HasPrefix(f, "password=") {
			fields[i] = "password=xxxxx"
		}
	}
	return strings.Join(fields, " ")
}
