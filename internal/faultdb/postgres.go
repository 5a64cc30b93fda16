package faultdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// Kinds of faults on PostgreSQL, each a SQLSTATE the server sends for the
// condition.
const (
	// PgConnFailure is 08006 connection_failure.
	PgConnFailure Kind = iota + 101
	// PgAdminShutdown is 57P01 admin_shutdown: the server is shutting down.
	PgAdminShutdown
	// PgDiskFull is 53100 disk_full.
	PgDiskFull
	// PgSerialization is 40001 serialization_failure.
	PgSerialization
	// PgLockNotAvailable is 55P03 lock_not_available: a lock_timeout
	// passed.
	PgLockNotAvailable
)

// PgKinds are all PostgreSQL kinds, for tests that try each.
var PgKinds = []Kind{PgConnFailure, PgAdminShutdown, PgDiskFull, PgSerialization, PgLockNotAvailable}

// pgKinds are each kind's SQLSTATE and the text PostgreSQL sends with it.
var pgKinds = map[Kind]struct{ name, code, msg string }{
	PgConnFailure:      {"conn_failure", "08006", "connection failure"},
	PgAdminShutdown:    {"admin_shutdown", "57P01", "terminating connection due to administrator command"},
	PgDiskFull:         {"disk_full", "53100", `could not extend file "base/16384/16385": No space left on device`},
	PgSerialization:    {"serialization", "40001", "could not serialize access due to concurrent update"},
	PgLockNotAvailable: {"lock_not_available", "55P03", "canceling statement due to lock timeout"},
}

// NewPostgres is [New] for PostgreSQL: the injector's driver wraps pgx
// (database/sql driver "pgx") and takes its DSN, a postgres:// URL. Its
// rules take PostgreSQL kinds ([PgKinds]).
func NewPostgres(seed uint64) *Injector {
	in := &Injector{name: fmt.Sprintf("pgx-faults-%d", drivers.Add(1)), seed: seed, counts: map[string]*counts{}}
	sql.Register(in.name, &drv{base: stdlib.GetDefaultDriver(), inj: in, pg: true})
	return in
}

// pgErr is the error a PostgreSQL kind's fault returns when no server
// produced it: the fields the server sets for it, severity, SQLSTATE and
// text.
func pgErr(k Kind) error {
	p, ok := pgKinds[k]
	if !ok {
		return errNoKind
	}
	return &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: p.code, Message: p.msg}
}

// raise has the server fail a statement with k's SQLSTATE and text, in
// place of the statement a rule picked, and returns the server's
// *pgconn.PgError. In a transaction that aborts it, as a failing
// statement does: later statements fail with 25P02 until ROLLBACK TO a
// savepoint or ROLLBACK, and COMMIT rolls back. Outside one it changes
// nothing.
func (c *conn) raise(ctx context.Context, k Kind) error {
	p, ok := pgKinds[k]
	if !ok {
		return errNoKind
	}
	// No arguments: pgx sends it as a simple query. The texts hold no
	// quote.
	q := fmt.Sprintf(`DO $faultdb$ BEGIN RAISE EXCEPTION USING ERRCODE = '%s', MESSAGE = '%s'; END $faultdb$`, p.code, p.msg)
	if _, err := c.inner.(driver.ExecerContext).ExecContext(ctx, q, nil); err != nil {
		return err
	}
	return pgErr(k) // not reached: the DO block always raises
}
