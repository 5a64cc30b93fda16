package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// finish decides the call's outcome from what the SDK's handler chain
// returned, and commits it with the handler's work, or abandons the attempt.
func (a *attempt) finish(ctx context.Context, res mcp.Result, err error) (mcp.Result, error) {
	cr, _ := res.(*mcp.CallToolResult)
	var reason string
	switch {
	case !a.reached:
		reason = "handler not reached" // arguments failed the schema: the SDK's error stands
	case err != nil:
		reason = "protocol error"
	case ctx.Err() != nil:
		// Cancelled before the commit. The SDK still sends a "context
		// canceled" result; it must never become the recorded outcome.
		reason = "cancelled"
		a.logStopped(ctx)
	case a.txErr != nil:
		// The database failed under the handler (busy, I/O, full), or the
		// guard refused one of its statements: either says nothing of the
		// call, so it is never its outcome.
		msg := "database failed under the handler; nothing recorded"
		switch {
		case errors.Is(a.txErr, ErrStatementRefused):
			msg = "handler ran a statement the layer refuses; nothing recorded"
		case errors.Is(a.txErr, ErrReadOnly):
			msg = "handler of a read-only tool wrote; nothing recorded"
		}
		a.layer.logger.ErrorContext(ctx, msg, "tool", a.tool.name, "call_id", a.uid, "error", a.txErr)
		a.giveTaskBack(a.txErr)
		a.abandon(ctx)
		return a.notCommitted(a.txErr), nil
	case a.handlerErr != nil:
		// An unmarked error is a fault, not an outcome (see Final): keep
		// nothing, so a retry runs the call again, and keep its text from
		// the client.
		a.outcome = outcomeNotRecorded
		if a.tool.showErrors && a.showable(a.handlerErr) {
			// The handler's own words, for the model (a validation error):
			// an answer, not a fault, so not logged at ERROR, where alerts
			// look.
			a.layer.logger.InfoContext(ctx, "tool handler's error shown to the client; nothing recorded",
				"tool", a.tool.name, "call_id", a.uid, "error", a.handlerErr)
			a.abandon(ctx)
			return a.handlerFailedShown(a.handlerErr), nil
		}
		a.layer.logger.ErrorContext(ctx, "tool handler failed; nothing recorded",
			"tool", a.tool.name, "call_id", a.uid, "error", a.handlerErr)
		a.abandon(ctx)
		return a.handlerFailed(), nil
	case cr == nil:
		reason = "no result"
	case cr.InputRequests != nil:
		// A multi round-trip request: the client retries with the same
		// _meta and its inputResponses, as part of this logical call.
		reason = "input required"
	}
	if reason != "" {
		a.outcome = outcomeNotRecorded
		a.layer.logger.DebugContext(ctx, "call not recorded", "tool", a.tool.name, "reason", reason)
		a.abandon(ctx)
		return res, err
	}
	err = a.commit(background(ctx), cr)
	if errors.Is(err, errCommitUnknown) {
		err = a.confirmCommit(background(ctx), err)
	}
	if err != nil {
		a.giveTaskBack(err)
		a.abandon(ctx)
		if !errors.Is(err, ErrOwnershipLost) {
			a.layer.logger.ErrorContext(ctx, "commit call", "tool", a.tool.name, "call_id", a.uid, "error", err)
		}
		return a.notCommitted(err), nil
	}
	// Committed: a failpoint below may still lose the answer, but the
	// outcome is the recorded one.
	a.outcome = outcomeExecuted
	if cr.IsError {
		a.outcome = outcomeFailed
	}
	if a.effects > 0 {
		a.layer.enqueued()
	}
	if a.recorded() {
		if testHookAfterCommit != nil {
			testHookAfterCommit(ctx)
		}
		if err := failpoint.Inject(failpoint.CallAfterCommit); err != nil {
			return toolError(codeNotRecorded, "%v after the commit; the call is recorded, a retry replays it.", err), nil
		}
		setCallMeta(cr, a.id, a.uid, stateOf(cr), false, a.createdAt, a.completedAt)
	}
	return cr, nil
}

// confirmCommit finds out, by reading the call's row again, whether a
// commit whose answer was lost (errCommitUnknown) happened: it returns nil
// if the row holds this attempt's outcome. It reads for a few seconds, the
// time a restarting database takes; if it still cannot tell, it returns
// an error that says so, and the call's answer must not claim that
// nothing was recorded.
func (a *attempt) confirmCommit(ctx context.Context, cause error) error {
	if !a.recorded() || a.stored == "" {
		return &commitUnknownError{cause}
	}
	deadline := time.Now().Add(confirmCommitFor)
	wait := 50 * time.Millisecond
	for {
		var n int
		err := a.layer.db.Read.QueryRowContext(ctx,
			`SELECT count(*) FROM calls WHERE id = $1 AND uid = $2 AND state IN ('completed', 'failed') AND result = $3 AND completed_at = $4`,
			a.callID, a.uid, a.stored, a.completedAt).Scan(&n)
		if err == nil {
			if n == 1 {
				a.layer.logger.WarnContext(ctx, "commit's answer lost; the call's row shows it committed", "tool", a.tool.name, "error", cause)
				return nil
			}
			return cause // read back: not committed
		}
		if time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			return &commitUnknownError{cause}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		wait = min(2*wait, time.Second)
	}
}

// confirmCommitFor bounds how long confirmCommit tries to read the row.
const confirmCommitFor = 5 * time.Second

// commitUnknownError: the commit may or may not have happened, and the
// row could not be read to tell.
type commitUnknownError struct{ err error }

func (e *commitUnknownError) Error() string { return e.err.Error() }
func (e *commitUnknownError) Unwrap() error { return e.err }

// notCommitted is the answer of an attempt that committed nothing. When
// another attempt took the call over, that attempt's outcome is the call's,
// so the caller is sent to the status tool rather than told to retry.
func (a *attempt) notCommitted(err error) *mcp.CallToolResult {
	if errors.Is(err, ErrOwnershipLost) {
		a.outcome = outcomeInProgress
		return toolError(codeInProgress, "%v; this attempt recorded nothing. That attempt's outcome is the call's: "+
			"a retry gets it, replayed, or waits for it while the call runs. %s for the call's outcome.",
			ErrOwnershipLost, askStatus(a.id))
	}
	var unknown *commitUnknownError
	if errors.As(err, &unknown) {
		a.outcome = outcomeInProgress
		retry := "retry with the same key"
		if keyless(a.id) {
			retry = "make the identical call again"
		}
		// err is the driver's: finish logs it under the call id.
		return toolError(codeInProgress, "the database did not confirm the call's commit, and could not be read to tell: "+
			"the call may have been recorded. %s for its outcome, or %s: "+
			"a retry replays the outcome if it was recorded, and runs the call if it was not. "+
			"The server's log has the cause under call id %s.", askStatus(a.id), retry, a.uid)
	}
	a.outcome = outcomeNotRecorded
	retry := a.retryGets()
	var said *saidError
	if errors.Is(err, errLeaseExpired) || errors.Is(err, errClaimGone) || errors.As(err, &said) {
		// The layer's own reasons (the fence's) are said.
		return toolError(codeNotRecorded, "the call did not commit (%v); nothing of it was kept: %s.", err, retry)
	}
	if errors.Is(err, ErrReadOnly) {
		return toolError(codeNotRecorded, "the tool is annotated readOnlyHint, so its transaction is read-only and never committed, "+
			"and its handler wrote: the write was refused, and nothing of the call was kept. "+
			"The server's log has the statement under call id %s.", a.uid)
	}
	// Anything else may carry the driver's text (the database failed under
	// the handler, its COMMIT or the outcome's statement failed): it goes
	// to the log (finish), not to the client.
	return toolError(codeNotRecorded, "the call did not commit%s, and nothing of it was kept: %s. "+
		"The server's log has the cause under call id %s.", withCondition(a.db(), err), retry, a.uid)
}

// db is the attempt's database; nil for an attempt built without a layer
// (the tests of answers' words).
func (a *attempt) db() *schema.DB {
	if a.layer == nil {
		return nil
	}
	return a.layer.db
}

// saidError marks an error whose text is the layer's own, which a client
// may read (a failpoint's, in tests of a binary built with them).
type saidError struct{ err error }

func (e *saidError) Error() string { return e.err.Error() }
func (e *saidError) Unwrap() error { return e.err }

// retryGets says what a retry of a call this attempt did not commit gets.
// "Runs it again" is true only while no other attempt has the call: an
// attempt cut off from the database past its lease, or whose connection
// died with its uncommitted claim, may have lost the call to another
// replica, which ran it, and whose outcome a retry then gets. The call's
// row tells, if it can be read.
func (a *attempt) retryGets() string {
	const runs = "a retry runs it again"
	if !a.recorded() || a.task != nil {
		return runs
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var uid, state string
	var expires int64
	err := a.layer.db.Read.QueryRowContext(ctx, `SELECT uid, state, expires_at FROM calls WHERE principal = $1 AND key = $2`,
		a.id.principal, a.id.key).Scan(&uid, &state, &expires)
	switch {
	case errors.Is(err, sql.ErrNoRows), err == nil && uid == a.uid:
		return runs
	case err != nil:
		return "a retry runs it again, unless another attempt took the call over meanwhile: the retry then gets that attempt's outcome"
	case state == "in_flight":
		return "another attempt has taken the call over; a retry waits for that attempt's outcome and gets it, replayed"
	case expires <= a.layer.nowMS():
		return runs
	}
	return "another attempt has run the call since; a retry gets its outcome, replayed"
}

func stateOf(cr *mcp.CallToolResult) string {
	if cr.IsError {
		return "failed"
	}
	return "completed"
}

// commit records the outcome with the handler's work in one transaction.
func (a *attempt) commit(ctx context.Context, cr *mcp.CallToolResult) error {
	if a.tool.readOnly || (!a.recorded() && a.tx == nil) {
		if a.tx != nil {
			a.closeTx(false)
		}
		return nil
	}
	if !a.recorded() {
		if cr.IsError {
			a.closeTx(false)
			return nil
		}
		if err := a.abortedTx(); err != nil {
			a.closeTx(false)
			return err
		}
		return a.closeTx(true)
	}
	if err := a.begin(ctx); err != nil {
		return err
	}
	if cr.IsError {
		// A failed call keeps nothing of its work, effects included.
		if err := a.discardWork(ctx); err != nil {
			return err
		}
	}
	if err := a.abortedTx(); err != nil {
		return err
	}
	stored, err := encodeResult(cr)
	if err != nil {
		return err
	}
	// Sealed in the unit: a principal's first data key commits with it.
	sealed, err := a.seal(a.unit.tx(), callRef(a.callID, "result", a.id.principal), []byte(stored))
	if err != nil {
		return fmt.Errorf("seal result: %w", err)
	}
	stored = string(sealed)
	a.stored = stored
	now := a.layer.nowMS()
	a.completedAt = now
	args := []any{stateOf(cr), stored, now, now + a.retention().Milliseconds(), a.callID, a.owner}
	if p := a.unit.b.piped; p != nil {
		// The outcome goes with COMMIT (pipe_postgres.go), which tells
		// whether it matched.
		q, qe := recordOutcomePiped, recordOutcomeWithEffectsPiped
		if a.claimInTx {
			// The claim's row is in its settled form (claim_tx_postgres.go).
			q, qe = recordOutcomeSettledPiped, recordOutcomeSettledWithEffectsPiped
			args[3], args[5] = a.settledExpiry(args[3].(int64)), a.uid
		}
		if len(a.pending) > 0 {
			q, args = qe, append(args, effectColumns(a.id.principal, a.pending)...)
		}
		if err := failpoint.Inject(failpoint.CallBeforeCommit); err != nil {
			return &saidError{err}
		}
		p.last = &schema.Piped{SQL: q, Args: args}
		return a.closeTx(true)
	}
	q := recordOutcome
	if len(a.pending) > 0 {
		q, args = recordOutcomeWithEffects, append(args, effectColumns(a.id.principal, a.pending)...)
	}
	r, err := a.unit.exec(q, args...)
	if err != nil {
		return fmt.Errorf("record outcome: %w", err)
	}
	if n, err := r.RowsAffected(); err != nil || n != 1 {
		return ErrOwnershipLost
	}
	if err := failpoint.Inject(failpoint.CallBeforeCommit); err != nil {
		return &saidError{err}
	}
	return a.closeTx(true)
}

// abortedTx is the commit's error when a statement error aborted the
// handler's transaction (PostgreSQL) and the handler still answered
// success: COMMIT would only roll back, and the outcome's statement fail
// with 25P02, which names neither the error nor its statement. Neither is
// sent.
func (a *attempt) abortedTx() error {
	if a.failedStmt == nil {
		return nil
	}
	return a.wrap(fmt.Errorf("%w: %w", errAbortedTx, a.failedStmt))
}

// recordOutcome is the fence's last word: the row must still name the
// attempt as owner, and no tasks/cancel may have asked the call (a task)
// to stop. A task's stored params go with its end.
const recordOutcome = `
UPDATE calls SET state = $1, result = $2, completed_at = $3, expires_at = $4, owner = '', lease_until = 0, task_params = NULL
WHERE id = $5 AND owner = $6 AND state = 'in_flight' AND task_cancel = 0`

// closeTx ends the handler's transaction. Committing a unit waits until
// the batch it joined is durable (or failed), so no call answers before its
// outcome is on disk.
func (a *attempt) closeTx(commit bool) error {
	if a.readConn != nil {
		_ = a.tx.(*sql.Tx).Rollback() // a read-only tool has nothing to commit
		a.layer.releaseReadConn(a.readConn)
		a.tx, a.readConn = nil, nil
		return nil
	}
	b := a.unit.leave(commit)
	a.tx, a.unit = nil, nil
	if commit {
		return b.wait()
	}
	return nil
}

// releaseReadConn gives a read-only tool's connection back to the pool,
// on SQLite with query_only off again (see openTx); one that cannot be
// set back is closed rather than left to refuse the next user's writes.
func (l *Layer) releaseReadConn(conn *sql.Conn) {
	if l.db.Dialect == schema.SQLite {
		if _, err := conn.ExecContext(context.Background(), "PRAGMA query_only = 0"); err != nil {
			// Raw's ErrBadConn makes database/sql discard the connection.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	_ = conn.Close()
}

// abandon rolls back the handler's work and deletes the attempt's claim, so
// the call leaves no trace and a retry runs it.
//
// The release needs no durability of its own, like the claim: a release lost
// to a crash or a power failure leaves a claim of an attempt that no longer
// runs, which the next attempt takes over.
func (a *attempt) abandon(ctx context.Context) {
	if !a.recorded() || a.callID == 0 || a.claimInTx {
		// A claim in the call's transaction (PostgreSQL) goes with its
		// rollback: it never committed, so there is nothing to delete.
		if a.tx != nil {
			a.closeTx(false)
		}
		return
	}
	if a.readConn != nil {
		a.closeTx(false)
	}
	u := a.unit
	a.unit, a.tx, a.pending = nil, nil, nil
	var err error
	if u != nil {
		err = u.undoAll()
	} else {
		u, err = a.layer.group.enter(background(ctx), false)
	}
	if err == nil {
		if a.task != nil {
			// A task's row is what tasks/get reads: it ends, or stays for
			// the next process, but is never deleted (task_run.go).
			err = a.endTask(ctx, u)
		} else {
			_, err = u.exec(`DELETE FROM calls WHERE id = $1 AND owner = $2 AND state = 'in_flight'`, a.callID, a.owner)
		}
	}
	if u != nil {
		u.leave(err == nil)
	}
	if err != nil {
		// The row stays in_flight under an owner that is not running:
		// the next attempt sees that and takes it over.
		a.layer.logger.WarnContext(ctx, "release claim", "tool", a.tool.name, "error", err)
	}
}

// isRetryable reports whether a result's error means that nothing of the
// call happened for certain: the database failed, the call was cancelled, or
// another attempt took it over. Such a result is never recorded.
func isRetryable(err error) bool {
	var t *txError
	return errors.As(err, &t) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOwnershipLost)
}
