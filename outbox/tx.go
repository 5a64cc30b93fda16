package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
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

// Effect is a request to a downstream HTTP API, delivered after the call
// commits by the dispatcher.
type Effect struct {
	// Destination names a configured destination (its base URL is not
	// stored, so it can change without touching queued effects).
	Destination string
	// Method is the HTTP method; empty means POST.
	Method string
	// Path is appended to the destination's base URL; it must start with '/'.
	Path string
	// Header holds extra request headers. Secrets do not belong here: they
	// are stored in the database. Configure them on the destination.
	Header map[string]string
	// Body is the request body.
	Body []byte
}

// ErrOwnershipLost is returned when another attempt took over the call: the
// old attempt can no longer commit.
var ErrOwnershipLost = errors.New("outbox: call was taken over by another attempt")

// errClaimGone: the attempt's claim no longer exists when its handler
// begins.
var errClaimGone = errors.New("the call's claim is gone")

// errLeaseExpired: on PostgreSQL, the attempt's lease passed before its
// handler's first statement; see fence.
var errLeaseExpired = errors.New("the attempt's lease expired before its first statement, so it may not commit")

// txError marks errors from the database under a handler: they are never
// recorded as the call's outcome.
type txError struct{ err error }

func (e *txError) Error() string { return e.err.Error() }
func (e *txError) Unwrap() error { return e.err }

func (a *attempt) begin(ctx context.Context) error {
	if a.tx != nil {
		return nil
	}
	if a.txErr != nil {
		return a.txErr
	}
	if err := a.openTx(ctx); err != nil {
		a.txErr = &txError{err}
		return a.txErr
	}
	return nil
}

// openTx takes the call's turn in a group-commit batch (waiting while the
// call's context allows), or, for a read-only tool, a read transaction. Once
// in, cancellation no longer reaches the transaction: whether a cancelled
// call commits is decided at its end, not by the driver interrupting a
// statement, which in SQLite would roll back the whole shared transaction.
func (a *attempt) openTx(ctx context.Context) error {
	if a.tool.readOnly {
		conn, err := a.layer.db.Read.Conn(ctx)
		if err != nil {
			return fmt.Errorf("take database connection: %w", err)
		}
		if a.layer.db.Dialect == schema.SQLite {
			// modernc.org/sqlite reads TxOptions.ReadOnly only to send a
			// plain (deferred) BEGIN: a write in the transaction would run,
			// and vanish with its rollback. query_only makes SQLite refuse
			// it (SQLITE_READONLY) at the statement. It is the connection's
			// setting, so closeTx sets it back before the connection goes
			// back to the pool; the guard refuses the PRAGMA to a handler.
			if _, err := conn.ExecContext(background(ctx), "PRAGMA query_only = 1"); err != nil {
				conn.Close()
				return fmt.Errorf("make the connection read-only: %w", err)
			}
		}
		// On PostgreSQL this is BEGIN READ ONLY: a write fails with
		// SQLSTATE 25006.
		tx, err := conn.BeginTx(background(ctx), &sql.TxOptions{ReadOnly: true})
		if err != nil {
			a.layer.releaseReadConn(conn)
			return fmt.Errorf("begin: %w", err)
		}
		a.readConn, a.tx = conn, tx
		return nil
	}
	redo := func(*unit) error { return nil }
	if a.recorded() {
		// Undo takes the fence again when it has to begin anew (enterRedo).
		redo = a.fence
	}
	u, err := a.layer.group.enterRedo(ctx, true, redo)
	if err != nil && isBusy(err) && a.recorded() && a.layer.db.Dialect == schema.SQLite {
		// On SQLite enterRedo is enter, so enterBusy's retries are the same turn.
		u, err = a.enterBusy(ctx, err)
	}
	if err != nil {
		return err
	}
	u.outcome = a.recorded()
	a.unit, a.tx = u, u.tx()
	if !u.b.own {
		u.g.handlerTurn.Store(true) // until the unit leaves; see hookCommits
	}
	if a.recorded() {
		if err := a.fence(u); err != nil {
			return err
		}
		a.fenced.Store(true)
	}
	return nil
}

// enterBusy tries again to take the call's turn in the writer's
// transaction after the first try met SQLITE_BUSY: another process holds
// the file's write lock (its own batch, or a handler of its own inside
// one) past busy_timeout. The call is claimed and nothing of it has run,
// so waiting is safe, and answering not_recorded would only make the
// client retry what this attempt can still do. It waits, with backoff, no
// later than the call's deadline: its context's, and at most half the
// claim's lease from the claim, after which another process may take the
// call over (the fence would then refuse this attempt anyway). first is
// the error of the first try, returned if the deadline passes.
func (a *attempt) enterBusy(ctx context.Context, first error) (*unit, error) {
	deadline := a.claimedAt.Add(a.layer.opts.Lease / 2)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	err := first
	for wait := 5 * time.Millisecond; isBusy(err); wait = min(2*wait, 200*time.Millisecond) {
		if !time.Now().Add(wait).Before(deadline) {
			return nil, err
		}
		a.layer.logger.DebugContext(ctx, "database write lock held by another process; handler's first statement retried", "tool", a.tool.name)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		var u *unit
		if u, err = a.layer.group.enterBy(ctx, true, deadline); err == nil {
			return u, nil
		}
	}
	return nil, err
}

// fenceSQLite and fencePostgres read the call's row at the handler's first
// statement. By uid too: a claim whose batch did not commit gave back its
// row id, which the next insert takes (SQLite's AUTOINCREMENT only skips
// committed ids), so the id alone may name another call now. On
// PostgreSQL the row is locked until the outcome commits: from the
// handler's first statement on, no other attempt can take the call over,
// and one that tries waits for this transaction (and then finds the
// outcome) or gives up as busy. SQLite's single writer gives the same.
const (
	fenceSQLite   = `SELECT owner, state, lease_until FROM calls WHERE id = $1 AND uid = $2`
	fencePostgres = `SELECT owner, state, lease_until FROM calls WHERE id = $1 AND uid = $2 FOR UPDATE`
)

// fence checks, in the unit that will hold the outcome, that the call's
// row still names this attempt as owner.
func (a *attempt) fence(u *unit) error {
	var (
		owner, state string
		leaseUntil   int64
	)
	// A piped unit sends BEGIN with it: one round trip for both.
	err := u.queryFirst(a.layer.db.Pick(fenceSQLite, fencePostgres), []any{a.callID, a.uid}, &owner, &state, &leaseUntil)
	if errors.Is(err, sql.ErrNoRows) {
		// The claim is gone: the batch it rode in did not commit, or an
		// operator cleared it. Nobody else owns the call: a retry runs it.
		return errClaimGone
	}
	if err != nil {
		return fmt.Errorf("check ownership: %w", err)
	}
	if state == "in_flight" && owner != a.owner {
		switch a.layer.liveness(owner) {
		case ownerSelf, ownerDead:
			// The row names an attempt that is not running: one of
			// this layer (a holds the key's place in Layer.local, so
			// no other attempt here runs the call) or of a dead
			// process. So nobody took the call over: this attempt's
			// takeover was lost with the batch it rode in, and the
			// call stands as it was, which a retry takes over again.
			return errClaimGone
		}
	}
	if owner != a.owner || state != "in_flight" {
		return ErrOwnershipLost
	}
	if a.layer.db.Dialect == schema.Postgres && leaseUntil <= a.layer.nowMS() {
		// The lease passed before the handler's first statement (this
		// process was paused, or cut off from the database, longer than
		// the lease): another replica may be about to take the call
		// over, and an owner whose lease expired never commits. The
		// call stays claimed by nobody alive; a retry takes it over.
		return errLeaseExpired
	}
	return nil
}

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
	if err == nil || a.layer.db.Dialect != schema.Postgres || schema.PgCode(err) != "42601" || !strings.Contains(query, "?") {
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
	switch code := schema.PgCode(err); {
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
// statement's (schema.PgCode).
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

// Enqueue adds an effect to the call's transaction. Every error it returns
// is the Tx's, never shown to the client (see showable): it speaks of the
// server's configuration or state, which the model cannot act on.
func (a *attempt) Enqueue(ctx context.Context, e Effect) (key string, err error) {
	defer func() { a.noteReturned(err) }()
	if a.tool.readOnly {
		// Like a write: an effect that would never be sent must not be
		// reported as done, whatever the handler answers.
		err = fmt.Errorf("outbox: enqueue in tool %q, which is annotated readOnlyHint: its transaction is never "+
			"committed, so the effect would never be sent; a tool that enqueues must not be annotated readOnlyHint: %w",
			a.tool.name, ErrReadOnly)
		if a.txErr == nil {
			a.txErr = &txError{err}
		}
		return "", err
	}
	if err := a.layer.checkEffect(&e); err != nil {
		return "", err
	}
	headers, err := effectHeaders(e)
	if err != nil {
		return "", err
	}
	if a.txErr != nil {
		return "", a.txErr
	}
	if a.failedStmt != nil {
		// PostgreSQL aborted the transaction at that statement's error; a
		// deferred effect would be written by the outcome's statement,
		// which cannot run either. Say so here, where the handler can
		// still notice, rather than answer a key for an effect that will
		// never exist.
		return "", fmt.Errorf("outbox: enqueue effect: an earlier statement's error aborted the call's transaction, "+
			"so nothing more of the call can commit: %w", a.failedStmt)
	}
	if err := a.begin(ctx); err != nil {
		return "", err
	}
	a.effects++
	key = callkey.EffectKey(a.uid, a.effects)
	now := a.layer.nowMS()
	// Sealed here, on both stores: a deferred effect (PostgreSQL) is
	// written by the outcome's statement as it stands now.
	headers, body, err := sealEffect(func(ref sealing.Ref, v []byte) ([]byte, error) { return a.seal(a.tx, ref, v) },
		key, a.id.principal, headers, e.Body)
	if err != nil {
		a.effects--
		return "", err
	}
	if a.defersEffects() {
		a.pending = append(a.pending, pendingEffect{seq: a.effects, destination: e.Destination, method: e.Method, path: e.Path,
			headers: headers, body: body, key: key, at: now, traceparent: traceparentOf(ctx)})
		return key, nil
	}
	var callID any
	if a.recorded() {
		callID = a.callID
	}
	_, err = a.unit.exec(insertEffect,
		callID, a.id.principal, a.effects, e.Destination, e.Method, e.Path, headers, body, key, now, now, now, traceparentOf(ctx))
	if err != nil {
		a.effects--
		return "", a.wrap(fmt.Errorf("enqueue effect: %w", err))
	}
	return key, nil
}

const insertEffect = `
INSERT INTO effects (call_id, principal, seq, destination, method, path, headers, body, idempotency_key,
                     next_attempt_at, created_at, updated_at, traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`

func validateEffect(e *Effect) error {
	if e.Destination == "" {
		return errors.New("outbox: effect without destination")
	}
	if e.Method == "" {
		e.Method = http.MethodPost
	}
	e.Method = strings.ToUpper(e.Method)
	if !isToken(e.Method) {
		return fmt.Errorf("outbox: effect method %q is not an HTTP token", e.Method)
	}
	if !strings.HasPrefix(e.Path, "/") {
		return fmt.Errorf("outbox: effect path %q must start with /", e.Path)
	}
	for k, v := range e.Header {
		if !isToken(k) || strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("outbox: effect header %q is not valid", k)
		}
		if strings.EqualFold(k, HeaderIdempotencyKey) {
			return errors.New("outbox: effect headers must not set Idempotency-Key; the dispatcher sets it")
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2), the
// syntax of both methods and header names.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
