package outbox

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// acquire claims the call for a, or returns the result to answer instead:
// a replay, a conflict, an in-progress error.
func (l *Layer) acquire(ctx context.Context, a *attempt) *mcp.CallToolResult {
	deadline := time.Now().Add(l.opts.InFlightWait)
	arrived := l.nowMS()
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
			if a.task != nil && other.task != nil && !other.task.cancelled.Load() &&
				!(other.claimed.Load() && l.taskCancelInRow(ctx, other.callID)) {
				// A retry that asks for a task gets the running one's, once
				// its claim is durable; its done closes only when the task
				// ends, so poll for the claim. A task tasks/cancel stopped
				// (here, or in its row from another process) is not
				// joined: it ends with its key set aside
				// (endTaskCancelled), and this call, waiting for done
				// below, then runs as a new one.
				if other.claimed.Load() {
					a.joinedTask = other.task.taskID()
					a.outcome = outcomeReplayed
					return taskJoined
				}
				t := time.NewTimer(poll)
				res := waitFor(ctx, t.C, deadline, a)
				t.Stop()
				if res != nil {
					return res
				}
				continue
			}
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
			l.logger.ErrorContext(ctx, "claim call", "tool", a.tool.name, "call_id", a.uid, "error", err)
			// The claim may have failed before it could read the call's
			// row, so whether an earlier attempt recorded an outcome is
			// not known here: say what a retry does in either case. The
			// error is the driver's (it may name the server's address):
			// the log has it.
			return toolError(codeNotRecorded, "could not record the call%s; nothing was executed, a retry will run it, "+
				"or replay its outcome if an earlier attempt recorded one. The server's log has the cause under call id %s.",
				withCondition(l.db, err), a.uid)
		}
		switch c.kind {
		case claimed:
			a.claimedAt = time.Now()
			a.claimed.Store(true)
			return nil
		case finished:
			a.outcome = outcomeReplayed
			if a.task != nil && c.row.taskID != "" {
				l.leave(a)
				a.joinedTask = c.row.taskID
				return taskJoined
			}
			// A join got the outcome of an attempt that was still running
			// when this one arrived. Having waited is not enough: the wait
			// may have been for the writer's lock, or for another retry of
			// a call that had finished long before.
			if a.waited && c.row.completedAt.Int64 >= arrived {
				a.outcome = outcomeJoined
			}
			l.leave(a)
			return replay(c.row, a)
		case conflict:
			a.outcome = outcomeConflict
			l.leave(a)
			return conflictError(c.row, a)
		case lost:
			a.outcome = outcomeUnknown
			l.leave(a)
			return unknownError(c.row, a)
		case vanished:
			a.outcome = outcomeNotRecorded
			l.leave(a)
			return toolError(codeNotRecorded, "the task ended before it could be taken up; nothing was executed.")
		case busy:
			a.waited = true
			l.leave(a)
			if a.task != nil && c.row.taskID != "" && !l.taskCancelInRow(ctx, c.row.id) {
				// Another process runs the task: a retry that asks for a
				// task gets it at once, with its current status; unless
				// tasks/cancel asked it to stop, then this call waits for
				// its end, as for a local one.
				a.outcome = outcomeReplayed
				a.joinedTask = c.row.taskID
				return taskJoined
			}
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
		return toolError(codeNotRecorded, "call cancelled while waiting for the attempt of %s; nothing was executed.", earlierCall(a.id))
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

// taskCancelInRow reports whether tasks/cancel asked the task of call row
// id to stop (task_cancel): a cancel another process received, which this
// one's attempt learns only at its commit. Such a task is not handed to
// the same call asked again; that call waits for it to end, and then runs.
func (l *Layer) taskCancelInRow(ctx context.Context, id int64) bool {
	var asked int64
	err := l.db.Read.QueryRowContext(ctx, `SELECT task_cancel FROM calls WHERE id = $1`, id).Scan(&asked)
	return err == nil && asked != 0
}
