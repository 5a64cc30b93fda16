// Package sqlite hands the layer an SQLite database the program already
// opened: [FromDB] takes its *sql.DB (modernc.org/sqlite, driver "sqlite"),
// checks the settings the layer's guarantees rest on, and returns the
// [schema.DB] that outbox.New takes. A program that lets the layer open the
// file itself needs none of it: schema.Open(ctx, path, nil) is the default.
//
// SQLite's store is built into package schema; it lives here from the
// point where a program hands over its own handle, so that each store's
// ways in sit in a package of their own under schema/ (schema/postgres has
// PostgreSQL's FromPool and FromDB).
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/schema"
	"github.com/mcp-outbox/mcp-outbox/schema/internal/handle"
)

// FromDB makes a [schema.DB] of the caller's *sql.DB on an SQLite file,
// checks that the layer can use it, and applies the outbox migrations. The
// handle is the file's one writer, shared by the layer and the program: the
// program's own tables, written in the same transactions as the layer's
// records, stay behind one lock. It must have, on every connection (put
// them in the DSN, which every new connection reads):
//
//	file:PATH?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_pragma=busy_timeout(5000)&_txlock=immediate
//
// and db.SetMaxOpenConns(1). journal_mode=WAL lets readers run beside the
// writer; synchronous=FULL makes a committed call survive a power loss
// (NORMAL is accepted, and is schema.DurabilityNormal: a crash of the
// machine may lose the last commits); foreign_keys enforces the tables'
// references; busy_timeout makes a writer in another process wait rather
// than fail at once; _txlock=immediate makes each transaction take the
// write lock at BEGIN, so it cannot fail on its first write with
// SQLITE_BUSY after it read; one connection makes it the file's single
// writer in this process. FromDB reads each of these from the handle and
// fails with an error naming the one that is missing.
//
// The layer reads through a pool of its own on the same file, opened
// with the handle's driver (so a wrapping driver sees those statements
// too) and the same settings; it needs the file's path, so a database in
// memory is refused. DB.Close closes that pool and leaves the caller's
// handle open: the caller closes it after the DB.
func FromDB(ctx context.Context, db *sql.DB) (*schema.DB, error) {
	if db == nil {
		return nil, errors.New("open database: the *sql.DB is nil")
	}
	var version string
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&version); err != nil {
		return nil, fmt.Errorf("open database: not an SQLite database (for PostgreSQL use postgres.FromDB): %w", err)
	}
	path, err := mainFile(ctx, db)
	if err != nil {
		return nil, err
	}
	// Every setting is checked before any is reported, so that one error
	// says all a handle lacks, and the DSN that has it all.
	var lacks []string
	if n := db.Stats().MaxOpenConnections; n != 1 {
		lacks = append(lacks, fmt.Sprintf("the *sql.DB allows %s connections, the layer needs exactly one writer: "+
			"call db.SetMaxOpenConns(1)", limit(n)))
	}
	s, more, err := readSettings(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	lacks = append(lacks, more...)
	deferred, err := beginsDeferred(ctx, db, path)
	if err != nil {
		return nil, fmt.Errorf("open database %s: check _txlock: %w", path, err)
	}
	if deferred {
		lacks = append(lacks, "the *sql.DB begins transactions DEFERRED, the layer needs IMMEDIATE "+
			"(a deferred transaction that reads, then writes, fails with SQLITE_BUSY when another writer went first): "+
			"add _txlock=immediate to the DSN")
	}
	if len(lacks) > 0 {
		return nil, fmt.Errorf("open database %s: %s; a DSN with every setting the layer needs: %s", path,
			strings.Join(lacks, "; "), goodDSN(path))
	}
	read := sql.OpenDB(connector{db.Driver(), dsn(path, s, "deferred", s.busyMS)})
	read.SetMaxOpenConns(schema.DefaultReadConns)
	read.SetMaxIdleConns(schema.DefaultReadConns)
	v, err := handle.Adopt(ctx, handle.Args{Dialect: string(schema.SQLite), Write: db, Read: read,
		Path: path, Durability: string(s.durability), Close: read.Close})
	if err != nil {
		return nil, err
	}
	return v.(*schema.DB), nil
}

func limit(n int) string {
	if n == 0 {
		return "any number of"
	}
	return fmt.Sprint(n)
}

// mainFile is the path of the handle's main database, "" in memory.
func mainFile(ctx context.Context, db *sql.DB) (string, error) {
	rows, err := db.QueryContext(ctx, `PRAGMA database_list`)
	if err != nil {
		return "", fmt.Errorf("open database: read database_list: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq int
		var name, file string
		if err := rows.Scan(&seq, &name, &file); err != nil {
			return "", fmt.Errorf("open database: read database_list: %w", err)
		}
		if name == "main" {
			if file == "" {
				return "", errors.New("open database: the *sql.DB is a database in memory; " +
					"the layer reads through a pool of its own on the same file: open a file")
			}
			return file, nil
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("open database: read database_list: %w", err)
	}
	return "", errors.New("open database: the *sql.DB has no main database")
}

type settings struct {
	durability schema.Durability
	busyMS     int64
}

// readSettings reads the settings the layer needs from the writer
// connection, and says of each one that is wrong what it is and how to
// set it.
func readSettings(ctx context.Context, db *sql.DB) (s settings, lacks []string, err error) {
	pragma := func(name string, v any) {
		if err == nil {
			if qerr := db.QueryRowContext(ctx, "PRAGMA "+name).Scan(v); qerr != nil {
				err = fmt.Errorf("read %s: %w", name, qerr)
			}
		}
	}
	var mode string
	var sync, fk int
	pragma("journal_mode", &mode)
	pragma("synchronous", &sync)
	pragma("foreign_keys", &fk)
	pragma("busy_timeout", &s.busyMS)
	if err != nil {
		return s, nil, err
	}
	if !strings.EqualFold(mode, "wal") {
		lacks = append(lacks, fmt.Sprintf("journal_mode is %s, the layer needs WAL: "+
			"add _pragma=journal_mode(WAL) to the DSN (it is stored in the file, so once is enough)", mode))
	}
	switch sync {
	case 2:
		s.durability = schema.DurabilityFull
	case 1:
		s.durability = schema.DurabilityNormal
	default:
		names := map[int]string{0: "OFF", 3: "EXTRA"}
		lacks = append(lacks, fmt.Sprintf("synchronous is %s, the layer needs FULL (or NORMAL, which may lose the last commits "+
			"to a crash of the machine): add _pragma=synchronous(FULL) to the DSN", names[sync]))
	}
	if fk != 1 {
		lacks = append(lacks, "foreign_keys is off, the layer's tables need it on: add _pragma=foreign_keys(1) to the DSN")
	}
	if s.busyMS <= 0 {
		lacks = append(lacks, fmt.Sprintf("busy_timeout is 0, so a write that meets another process's lock fails at once "+
			"with SQLITE_BUSY: add _pragma=busy_timeout(%d) to the DSN", schema.DefaultBusyTimeout.Milliseconds()))
	}
	return s, lacks, nil
}

// goodDSN is a DSN for path with every setting the layer needs.
func goodDSN(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)" +
		"&_pragma=foreign_keys(1)&_pragma=busy_timeout(" + fmt.Sprint(schema.DefaultBusyTimeout.Milliseconds()) + ")&_txlock=immediate"
}

// beginsDeferred reports whether the writer's transactions begin
// DEFERRED, not taking the write lock at BEGIN. There is no pragma to read
// it (it is the driver's _txlock), so it is tried: with a transaction of
// the writer open and nothing run in it, a connection of our own asks for
// the write lock without waiting. BEGIN IMMEDIATE (or EXCLUSIVE) holds it
// already, and the ask fails with SQLITE_BUSY; a deferred BEGIN takes no
// lock until its first statement, and the ask succeeds.
func beginsDeferred(ctx context.Context, db *sql.DB, path string) (bool, error) {
	probe := sql.OpenDB(connector{db.Driver(), dsn(path, settings{durability: schema.DurabilityFull}, "deferred", 0)})
	defer probe.Close()
	c, err := probe.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	_, err = c.ExecContext(ctx, `BEGIN IMMEDIATE`)
	if err == nil {
		_, _ = c.ExecContext(ctx, `ROLLBACK`)
		return true, nil
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	if errors.As(err, &e) && e.Code()&0xff == 5 {
		return false, nil // SQLITE_BUSY: the writer holds the lock
	}
	return false, err
}

// dsn is a modernc.org/sqlite data source name with the handle's settings
// (schema.Open builds the same for its own pools). busy_timeout comes
// first so that the pragmas after it wait for a lock.
func dsn(path string, s settings, txlock string, busyMS int64) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyMS))
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous("+strings.ToUpper(string(s.durability))+")")
	q.Set("_txlock", txlock)
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// connector opens connections of the handle's driver on another DSN.
type connector struct {
	d   driver.Driver
	dsn string
}

func (c connector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c connector) Driver() driver.Driver                        { return c.d }
