package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Tx is the transaction a handler works in: its own statements and the
// effects it enqueues commit with the call's outcome, or not at all. It is
// narrower than *sql.Tx on purpose: the layer decides when to begin and
// commit, and stays free to share one commit among several calls.
//
// Its statement methods are those of sqlc's DBTX interface for
// database/sql, so generated queries run in the call's transaction
// unchanged: pass the Tx to the generated package's New.
//
// The handler's turn in the writer's transaction begins at its first
// statement, so a handler that does preparatory work first does not hold the
// write lock meanwhile; from then until the handler returns, other calls
// wait for their turn. Calls that end while others wait share one commit
// (group commit, see [Options.MaxBatchCalls]); each call's work sits in its
// own savepoint, so a failing handler rolls back only its own work.
// Statements are not interrupted when the call is cancelled (the context
// passed to them does not reach the driver): the layer decides at the end
// whether a cancelled call commits.
//
// Statements that control the transaction or change the connection under
// it are refused before anything runs, with an error wrapping
// [ErrStatementRefused] that names the statement: BEGIN, START, COMMIT,
// END, ROLLBACK, ABORT, SAVEPOINT, RELEASE, PREPARE (TRANSACTION), ATTACH,
// DETACH, VACUUM, SET, RESET, DISCARD, LISTEN, UNLISTEN, DEALLOCATE, LOAD,
// set_config and pg_settings, and every SQLite PRAGMA but the read-only
// ones that describe the schema (table_info, index_list,
// foreign_key_list…). A text of several statements is refused if any of
// them is; comments and string literals are read as the database reads
// them. A refusal, like a database failure under the handler, means the
// call can no longer commit: whatever the handler returns, nothing of it
// is recorded, the client is told so, and a retry runs the call again.
//
// A tool annotated readOnlyHint gets a read-only transaction, which the
// layer never commits: a statement that writes fails, with an error
// wrapping [ErrReadOnly], and the call is not answered as done. On
// PostgreSQL the first statement that fails aborts the transaction; the
// error of every statement after it names that first one (see "The
// handler's transaction" in the package doc).
type Tx interface {
	// ExecContext runs a statement in the call's transaction.
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	// QueryContext runs a query in the call's transaction.
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	// QueryRowContext runs a query expected to return one row. An error,
	// a refusal included, is reported by the row's Scan and Err.
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	// PrepareContext prepares a statement in the call's transaction; it is
	// closed when the call ends. Unlike the methods above, the statement
	// runs with the context its caller passes: on SQLite, a context that
	// ends while it runs interrupts SQLite, which rolls back the
	// transaction the call shares with others, so none of those calls is
	// recorded (each is told so, and a retry runs it). That costs a retry,
	// never a wrong outcome; the methods above cost nothing of the kind
	// (sqlc's default, emit_prepared_queries false, never prepares).
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	// Enqueue adds an effect to the outbox. Like the handler's rows, it is
	// not visible to the dispatcher until the call commits, and gone if the
	// call does not. It returns the effect's Idempotency-Key, which is
	// sent on every delivery attempt. On the wire the header's value is
	// that key as a Structured Field string, in double quotes
	// (Idempotency-Key: "call_…-1", as draft-ietf-httpapi-idempotency-key-header
	// writes it): a destination that compares it with the key returned
	// here must strip the quotes.
	Enqueue(ctx context.Context, e Effect) (string, error)
}

// handlerTx is where a handler's statements run: a *sql.Tx, or the
// *sql.Conn of a piped unit, inside the transaction its pipeline began
// (pipe_postgres.go).
type handlerTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// ErrOwnershipLost is returned when another attempt took over the call: the
// old attempt can no longer commit.
var ErrOwnershipLost = errors.New("outbox: call was taken over by another attempt")

// txError marks errors from the database under a handler: they are never
// recorded as the call's outcome.
type txError struct{ err error }

func (e *txError) Error() string { return e.err.Error() }
func (e *txError) Unwrap() error { return e.err }

// discardWork rolls back what the handler did so far, effects included,
// keeping the transaction and the claim.
func (a *attempt) discardWork(ctx context.Context) error {
	if a.unit == nil {
		return nil
	}
	if err := a.unit.undo(); err != nil {
		return a.wrap(fmt.Errorf("roll back handler: %w", err))
	}
	// A unit without a savepoint undoes by beginning anew: a handler that
	// runs again in this attempt (tool.go, input required) works in the
	// new transaction.
	a.tx = a.unit.tx()
	a.effects, a.pending = 0, nil
	// The principal's data key may have been made by this work (its first
	// sealed value) and rolled back with it: look it up again, or the
	// outcome would be sealed under a key no row holds.
	a.sealKey, a.sealKeyTx = nil, nil
	// The transaction an earlier statement's error aborted is gone too.
	a.failedStmt = nil
	return nil
}

func (a *attempt) wrap(err error) error {
	if err == nil {
		return nil
	}
	var te *txError
	if errors.As(err, &te) {
		return err
	}
	a.txErr = &txError{err}
	return a.txErr
}

// statement checks a handler's statement text before it runs, and takes
// the call's turn in the writer's transaction. An attempt that can no
// longer commit runs nothing more: on SQLite, a statement after one that
// ended the shared transaction would run outside it, and commit at once.
func (a *attempt) statement(ctx context.Context, query string) error {
	if a.txErr != nil {
		return a.txErr
	}
	if err := checkStatements(a.layer.db.Dialect, query); err != nil {
		a.txErr = &txError{err}
		return a.txErr
	}
	if err := a.begin(ctx); err != nil {
		a.noteReturned(err)
		return err
	}
	return nil
}

// ExecContext runs a statement in the call's transaction.
func (a *attempt) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := a.statement(ctx, query); err != nil {
		return nil, err
	}
	var r sql.Result
	var err error
	if a.unit != nil {
		r, err = a.unit.exec(query, args...)
	} else {
		r, err = a.tx.ExecContext(ctx, query, args...)
	}
	return r, a.wrapStmt(query, a.placeholderHint(query, err))
}

// QueryContext runs a query in the call's transaction.
func (a *attempt) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := a.statement(ctx, query); err != nil {
		return nil, err
	}
	if a.unit != nil {
		ctx = a.unit.stmtContext(ctx) // see unit.exec
	}
	r, err := a.tx.QueryContext(ctx, query, args...)
	return r, a.wrapStmt(query, a.placeholderHint(query, err))
}

// QueryRowContext runs a query expected to return one row.
func (a *attempt) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if err := a.statement(ctx, query); err != nil {
		return a.errRow(err)
	}
	var row *sql.Row
	if a.unit != nil {
		row = a.unit.queryRow(query, args...)
	} else {
		row = a.tx.QueryRowContext(ctx, query, args...)
	}
	// Both drivers run the query and read its first row before
	// QueryRowContext returns (modernc steps it; pgx's stdlib preloads
	// it), so a failure of the store is in the row's Err now, and the
	// attempt learns of it whatever the handler does with the row.
	if err := row.Err(); err != nil {
		// The row's error is what Scan returns: a row carrying the hint
		// in its place (a stranger's INSERT … VALUES (?, ?) RETURNING id
		// got PostgreSQL's bare syntax error here, and the hint only
		// from ExecContext), or the layer's word on it (a read-only
		// tool's write, a statement after an aborting error).
		if said := a.wrapStmt(query, a.placeholderHint(query, err)); said != err {
			return a.errRow(said)
		}
	}
	return row
}

// PrepareContext prepares a statement in the call's transaction.
//
// The *sql.Stmt it returns runs with the context its caller passes, which
// reaches the driver: the layer cannot keep it out as it does for the
// other methods. On SQLite a context that ends while such a statement
// runs interrupts it, and SQLite then rolls back the whole transaction the
// call shares with others: that batch fails, and none of its calls is
// recorded (each is told so; a retry runs it). It costs those calls a
// retry, never a wrong outcome. The statement's errors are not seen by the
// layer either: after one, the handler should return an error, as after
// any failed statement. If it goes on, nothing commits out of turn: on
// PostgreSQL the failed statement aborted the transaction, and on SQLite
// a statement that would run in autocommit mode after SQLite ended the
// transaction is refused by the writer's commit hook (see hookCommits).
func (a *attempt) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	if err := a.statement(ctx, query); err != nil {
		return nil, err
	}
	if a.unit != nil {
		ctx = a.unit.stmtContext(ctx)
	}
	st, err := a.tx.PrepareContext(ctx, query)
	if err == nil && a.unit != nil && a.unit.b.piped != nil {
		// On a *sql.Conn the statement outlives the transaction unless
		// closed; a *sql.Tx closes its own.
		a.unit.b.piped.trackStmt(st)
	}
	return st, a.wrapStmt(query, a.placeholderHint(query, err))
}

// placeholderHint names the likely cause of PostgreSQL's syntax error in a
// statement with a '?': SQLite's placeholder, which PostgreSQL does not
// know. A handler written against SQLite fails only once it meets
// PostgreSQL, and the server's own text ("syntax error at or near ',')
// does not say why. (A '?' can also be a JSONB operator, so it is not
// refused up front.)
func (a *attempt) placeholderHint(query string, err error) error {
	if err == nil || a.layer.db.Dialect != schema.Postgres || pgcode.Of(err) != "42601" || !strings.Contains(query, "?") {
		return err
	}
	return fmt.Errorf("%w (PostgreSQL numbers its placeholders: write $1, $2, … instead of ?; SQLite accepts them too)", err)
}

// errRow is a *sql.Row whose Scan and Err return err. *sql.Row has no
// constructor; database/sql returns a done context's error before it
// takes a connection, and the row then carries that error.
func (a *attempt) errRow(err error) *sql.Row {
	return a.layer.db.Read.QueryRowContext(failedContext{err}, "")
}

// failedContext is a context that is done, with err as its error.
type failedContext struct{ err error }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (failedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (failedContext) Done() <-chan struct{}       { return closedChan }
func (c failedContext) Err() error                { return c.err }
func (failedContext) Value(any) any               { return nil }
