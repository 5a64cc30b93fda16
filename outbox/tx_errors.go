package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// wrapStmt keeps constraint violations and other statement errors as the
// handler's to decide on, but remembers errors that mean the database is
// unusable (busy, I/O, full, read-only, closed), which must never become a
// recorded outcome.
//
// It also says, in the error the handler gets, what the database's own
// text does not: that a read-only tool's write was refused and why, and on
// PostgreSQL which earlier statement aborted the transaction. Every error
// it returns is remembered as the Tx's (see showable).
func (a *attempt) wrapStmt(query string, err error) error {
	if err == nil {
		return nil
	}
	err = a.sayStmt(query, err)
	a.noteReturned(err)
	if errors.Is(err, ErrReadOnly) {
		// Whatever the handler answers now, it would report as done a
		// write that was not kept.
		if a.txErr == nil {
			a.txErr = &txError{err}
		}
		return err
	}
	msg := err.Error()
	// isBusy: PostgreSQL's 40001, 40P01 and 55P03 are its SQLITE_BUSY, a
	// conflict with another transaction that says nothing of the call;
	// they also aborted the transaction, so the handler cannot go on.
	if storeFailed(a.layer.db, err) || isBusy(err) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, sql.ErrTxDone) ||
		strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked") ||
		strings.Contains(msg, "SQLITE_IOERR") || strings.Contains(msg, "disk I/O error") ||
		strings.Contains(msg, "SQLITE_FULL") || strings.Contains(msg, "interrupted") {
		return a.wrap(err)
	}
	if a.unit != nil && !a.unit.b.own && a.unit.txEnded() {
		// The statement's error ended the shared transaction (ON CONFLICT
		// ROLLBACK, RAISE(ROLLBACK) in a trigger): the handler gets its
		// error, and the attempt can no longer commit.
		a.txErr = &txError{fmt.Errorf("%w: %w", errTxEnded, err)}
	}
	return err
}

// sayStmt adds to a statement's error what the database's text leaves out.
func (a *attempt) sayStmt(query string, err error) error {
	if a.tool.readOnly && isReadOnlyRefusal(a.layer.db.Dialect, err) {
		err = &readOnlyError{tool: a.tool.name, stmt: excerpt(query), err: err}
	}
	if a.layer.db.Dialect != schema.Postgres {
		return err
	}
	switch code := pgcode.Of(err); {
	case code == "":
		// Not the server's: pgx refused it before sending (a wrong
		// number of arguments), and the transaction goes on.
	case code == pgInFailedTx && a.failedStmt != nil:
		return &abortedError{err: err, first: a.failedStmt}
	case a.failedStmt == nil && code != pgInFailedTx:
		// PostgreSQL aborts the transaction at any error: every later
		// statement, and COMMIT, fail with 25P02, which names neither
		// this error nor its statement. The first error is what the
		// log must show.
		a.failedStmt = &stmtError{stmt: excerpt(query), err: err}
	}
	return err
}

// stmtError is a handler's statement that failed, and how.
type stmtError struct {
	stmt string // an excerpt
	err  error
}

func (e *stmtError) Error() string { return fmt.Sprintf("statement %q: %v", e.stmt, e.err) }
func (e *stmtError) Unwrap() error { return e.err }

// abortedError is PostgreSQL's 25P02 with the error that aborted the
// transaction before it.
type abortedError struct {
	err   error // the 25P02
	first *stmtError
}

func (e *abortedError) Error() string {
	return fmt.Sprintf("%v; an earlier statement's error aborted the transaction, and the handler went on: %v", e.err, e.first)
}

// Unwrap: the 25P02 first, so that the error's SQLSTATE is this
// statement's (pgcode.Of).
func (e *abortedError) Unwrap() []error { return []error{e.err, e.first} }

// errAbortedTx is the commit's error when the handler answered after a
// statement error that aborted its transaction (PostgreSQL).
var errAbortedTx = errors.New("an error aborted the call's transaction, and the handler answered as if it had not")

// noteReturned remembers an error the Tx gave the handler, so that a
// handler's error that wraps it is never shown to the client (see
// ShowErrors). A handler that fails more statements than are kept is
// still covered for the driver's errors by their types (fromDatabase).
func (a *attempt) noteReturned(err error) {
	if err != nil && len(a.returned) < maxReturned {
		a.returned = append(a.returned, err)
	}
}

const maxReturned = 32

// txEnded reports whether SQLite ended the batch's transaction, as it does
// after some statement errors. Later statements of the turn would then run
// in autocommit mode, each committing at once, without the call's outcome.
// A BEGIN tells: it fails inside a transaction and opens one outside. The
// one it opens stays open, so that nothing else of this turn runs in
// autocommit mode (a statement the handler prepared, for one), and the
// batch, now broken, rolls it back.
func (u *unit) txEnded() bool {
	if _, err := u.b.tx.ExecContext(context.Background(), "BEGIN"); err != nil {
		return false
	}
	u.b.broken = errTxEnded
	return true
}
