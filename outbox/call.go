package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
)

type localKey struct{ principal, key string }

// testHookAfterCommit runs where call.after_commit is; tests set it to cancel
// a call whose outcome is already committed.
var testHookAfterCommit func(context.Context)

// attempt is one execution of a call, from its claim to its outcome. It is
// the Tx the handler sees.
type attempt struct {
	layer *Layer
	tool  *toolInfo
	id    callIdentity
	owner string

	// The claimed row; zero for unrecorded calls.
	callID    int64
	uid       string
	createdAt int64

	reached  bool      // the tool handler was called (arguments passed the schema)
	unit     *unit     // the call's turn in the writer's transaction
	readConn *sql.Conn // a read-only tool's connection
	tx       *sql.Tx   // where the handler's statements run: the unit's or the read transaction
	txErr    error     // the database failed under the handler
	effects  int       // effects enqueued so far

	completedAt int64  // unix ms of the recorded outcome
	stored      string // the result as recorded (see confirmCommit)

	outcome string // the calls_total outcome, set where it is decided
	waited  bool   // a replay after waiting for another attempt is a join, not a retry

	done chan struct{} // closed when the attempt leaves Layer.local

	// fenced: the handler's transaction passed the fence and, on
	// PostgreSQL, holds the call's row lock, so its lease needs no renewal.
	fenced atomic.Bool
	// claimed: the claim committed to its unit; callID is set.
	claimed atomic.Bool
}

func (a *attempt) recorded() bool { return a.tool.record && a.id.source != "" }

// retention is how long the call's key names it: the tool's fingerprint
// window for a derived key, the layer's key retention for a client's key.
func (a *attempt) retention() time.Duration {
	if a.id.source == callkey.SourceFingerprint {
		return a.tool.window
	}
	return a.layer.opts.KeyRetention
}

type attemptKey struct{}

func attemptFrom(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

func (l *Layer) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		creq, ok := req.(*mcp.CallToolRequest)
		if !ok || creq.Params == nil {
			return next(ctx, method, req)
		}
		l.mu.Lock()
		t := l.tools[creq.Params.Name]
		l.mu.Unlock()
		if t == nil { // not a tool of the layer: the SDK handles it, unknown tools included
			return next(ctx, method, req)
		}
		return l.call(ctx, t, creq, method, next)
	}
}

func (l *Layer) call(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest, method string, next mcp.MethodHandler) (mcp.Result, error) {
	var handlers mcp.Result // what the SDK's handler answered, if it ran
	res, err := l.run(ctx, t, req, func(ctx context.Context, a *attempt) (mcp.Result, error) {
		res, err := next(context.WithValue(ctx, attemptKey{}, a), method, req)
		handlers = res
		return a.finish(ctx, res, err)
	})
	if cr, ok := res.(*mcp.CallToolResult); ok && err == nil && res != handlers {
		return forProtocol(req, cr), nil
	}
	return res, err
}

// run identifies and claims a call, then has exec carry it out and decide
// its outcome. An answer decided before exec (a replay, a conflict, a bad
// key, a number the tool would not get as sent) is returned without running
// it.
func (l *Layer) run(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest, exec func(context.Context, *attempt) (mcp.Result, error)) (mcp.Result, error) {
	start := time.Now()
	if t.floatArgs {
		if res := checkNumbers(req.Params.Arguments); res != nil {
			return l.refuse(ctx, t, req, start, res)
		}
	}
	// A tool that is never recorded needs no key: skip canonicalising and
	// hashing its arguments on every call.
	id, err := callIdentity{principal: principalOf(req)}, error(nil)
	if t.record {
		id, err = identify(req, t, t.window > 0)
	}
	if err != nil {
		return l.refuse(ctx, t, req, start, toolError(codeInvalidKey, "%v; nothing was executed.", err))
	}
	a := &attempt{layer: l, tool: t, id: id, uid: randomUID()}
	defer func() {
		d := time.Since(start)
		l.opts.Metrics.call(t.name, a.outcome, d)
		l.logCall(ctx, a, req, d)
	}()
	if a.recorded() {
		a.owner = l.newOwner()
		if res := l.acquire(ctx, a); res != nil {
			return res, nil
		}
		defer l.leave(a)
		if err := failpoint.Inject(failpoint.CallAfterClaim); err != nil {
			a.outcome = outcomeNotRecorded
			a.abandon(ctx)
			return toolError(codeNotRecorded, "%v; nothing was executed.", err), nil
		}
	}
	return exec(ctx, a)
}

// refuse answers a call refused before its key was known (so its event
// carries no hash of the key), and counts it.
func (l *Layer) refuse(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest, start time.Time, res *mcp.CallToolResult) (mcp.Result, error) {
	d := time.Since(start)
	l.opts.Metrics.call(t.name, outcomeNotRecorded, d)
	l.logCall(ctx, &attempt{tool: t, id: callIdentity{principal: principalOf(req)}, outcome: outcomeNotRecorded}, req, d)
	return res, nil
}

// acquire claims the call for a, or returns the result to answer instead:
// a replay, a conflict, an in-progress error.
func (l *Layer) acquire(ctx context.Context, a *attempt) *mcp.CallToolResult {
	deadline := time.Now().Add(l.opts.InFlightWait)
	lk := localKey{a.id.principal, a.id.key}
	poll := 5 * time.Millisecond
	for {
		l.mu.Lock()
		if other := l.local[lk]; other != nil {
			// Read under the lock: an attempt that left to retry its
			// claim (busy) sets a new done when it comes back.
			done := other.done
			l.mu.Unlock()
			a.waited = true
			if res := waitFor(ctx, done, deadline, a); res != nil {
				return res
			}
			continue
		}
		a.done = make(chan struct{})
		l.local[lk] = a
		l.startRenewingLocked()
		l.mu.Unlock()

		c, err := l.claim(ctx, a, deadline)
		if err != nil {
			a.outcome = outcomeNotRecorded
			l.leave(a)
			if ctx.Err() != nil {
				return toolError(codeNotRecorded, "call cancelled while waiting for the database; nothing was executed.")
			}
			if isBusy(err) {
				// Another process holds SQLite's write lock, perhaps running
				// this very call: the writer is busy, as an owner in
				// another process is. Try again until the in-flight wait
				// ends, then answer like a duplicate that waited in vain.
				a.waited = true
				l.logger.DebugContext(ctx, "database write lock held by another process; claim retried", "tool", a.tool.name)
				t := time.NewTimer(poll)
				res := waitFor(ctx, t.C, deadline, a)
				t.Stop()
				if res != nil {
					if a.outcome == outcomeInProgress {
						res = writerBusyError(a, l.opts.InFlightWait)
					}
					return res
				}
				poll = min(2*poll, 200*time.Millisecond)
				continue
			}
			l.logger.ErrorContext(ctx, "claim call", "tool", a.tool.name, "error", err)
			// The claim may have failed before it could read the call's
			// row, so whether an earlier attempt recorded an outcome is
			// not known here: say what a retry does in either case.
			return toolError(codeNotRecorded, "could not record the call (%v); nothing was executed, a retry will run it, or replay its outcome if an earlier attempt recorded one.", err)
		}
		switch c.kind {
		case claimed:
			a.claimed.Store(true)
			return nil
		case finished:
			a.outcome = outcomeReplayed
			if a.waited {
				a.outcome = outcomeJoined
			}
			l.leave(a)
			return replay(c.row, a.id)
		case conflict:
			a.outcome = outcomeConflict
			l.leave(a)
			return conflictError(c.row, a)
		case lost:
			a.outcome = outcomeUnknown
			l.leave(a)
			return unknownError(c.row, a)
		case busy:
			a.waited = true
			l.leave(a)
			// Another process owns the call: it cannot signal us, so poll.
			t := time.NewTimer(poll)
			if res := waitFor(ctx, t.C, deadline, a); res != nil {
				t.Stop()
				return res
			}
			poll = min(2*poll, 200*time.Millisecond)
		}
	}
}

// waitFor waits for ch, the call's context or the deadline. It returns nil
// when ch fired, else the result to answer with.
func waitFor[T any](ctx context.Context, ch <-chan T, deadline time.Time, a *attempt) *mcp.CallToolResult {
	wait := time.Until(deadline)
	if wait <= 0 {
		a.outcome = outcomeInProgress
		return inProgressError(a)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		a.outcome = outcomeNotRecorded
		return toolError(codeNotRecorded, "call cancelled while waiting for the original attempt of key %q; nothing was executed.", a.id.key)
	case <-t.C:
		a.outcome = outcomeInProgress
		return inProgressError(a)
	}
}

// leave removes a from the attempts of this layer and wakes its waiters.
func (l *Layer) leave(a *attempt) {
	l.mu.Lock()
	lk := localKey{a.id.principal, a.id.key}
	if l.local[lk] == a {
		delete(l.local, lk)
		close(a.done)
	}
	l.mu.Unlock()
}

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
	case a.txErr != nil:
		a.abandon(ctx)
		return a.notCommitted(a.txErr), nil
	case cr == nil:
		reason = "no result"
	case cr.InputRequests != nil:
		// A multi round-trip request: the client retries with the same
		// _meta and its inputResponses, as part of this logical call.
		reason = "input required"
	case isRetryable(cr.GetError()):
		reason = "retryable error"
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
		a.abandon(ctx)
		if !errors.Is(err, ErrOwnershipLost) {
			a.layer.logger.ErrorContext(ctx, "commit call", "tool", a.tool.name, "error", err)
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
		a.layer.mu.Lock()
		notify := a.layer.notify
		a.layer.mu.Unlock()
		if notify != nil {
			notify()
		}
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
		return toolError(codeInProgress, "%v; this attempt recorded nothing. Ask the %s tool for the outcome of key %q.",
			ErrOwnershipLost, StatusToolName, a.id.key)
	}
	var unknown *commitUnknownError
	if errors.As(err, &unknown) {
		a.outcome = outcomeInProgress
		return toolError(codeInProgress, "the database did not confirm the call's commit (%v), and could not be read to tell: "+
			"the call may have been recorded. Ask the %s tool for the outcome of key %q, or retry with the same key: "+
			"a retry replays the outcome if it was recorded, and runs the call if it was not.", err, StatusToolName, a.id.key)
	}
	a.outcome = outcomeNotRecorded
	return toolError(codeNotRecorded, "the call did not commit (%v); nothing of it was recorded, a retry will run it.", err)
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
	stored, err := encodeResult(cr)
	if err != nil {
		return err
	}
	a.stored = stored
	now := a.layer.nowMS()
	a.completedAt = now
	r, err := a.unit.exec(recordOutcome,
		stateOf(cr), stored, now, now+a.retention().Milliseconds(), a.callID, a.owner)
	if err != nil {
		return fmt.Errorf("record outcome: %w", err)
	}
	if n, err := r.RowsAffected(); err != nil || n != 1 {
		return ErrOwnershipLost
	}
	if err := failpoint.Inject(failpoint.CallBeforeCommit); err != nil {
		return err
	}
	return a.closeTx(true)
}

const recordOutcome = `
UPDATE calls SET state = $1, result = $2, completed_at = $3, expires_at = $4, owner = '', lease_until = 0
WHERE id = $5 AND owner = $6 AND state = 'in_flight'`

// closeTx ends the handler's transaction. Committing a unit waits until
// the batch it joined is durable (or failed), so no call answers before its
// outcome is on disk.
func (a *attempt) closeTx(commit bool) error {
	if a.readConn != nil {
		_ = a.tx.Rollback() // a read-only tool has nothing to commit
		a.readConn.Close()
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

// abandon rolls back the handler's work and deletes the attempt's claim, so
// the call leaves no trace and a retry runs it.
//
// The release needs no durability of its own, like the claim: a release lost
// to a crash or a power failure leaves a claim of an attempt that no longer
// runs, which the next attempt takes over.
func (a *attempt) abandon(ctx context.Context) {
	if !a.recorded() || a.callID == 0 {
		if a.tx != nil {
			a.closeTx(false)
		}
		return
	}
	if a.readConn != nil {
		a.closeTx(false)
	}
	u := a.unit
	a.unit, a.tx = nil, nil
	var err error
	if u != nil {
		err = u.undo()
	} else {
		u, err = a.layer.group.enter(background(ctx), false)
	}
	if err == nil {
		_, err = u.exec(`DELETE FROM calls WHERE id = $1 AND owner = $2 AND state = 'in_flight'`, a.callID, a.owner)
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

type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// Retryable marks a handler error as transient: the call is not recorded
// as failed, its claim is released, and a retry runs the handler again.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err}
}

func isRetryable(err error) bool {
	var r *retryableError
	var t *txError
	return errors.As(err, &r) || errors.As(err, &t) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOwnershipLost)
}
