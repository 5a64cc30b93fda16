package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

type claimKind int

const (
	claimed  claimKind = iota // the attempt owns the call and runs it
	finished                  // the call has an outcome: replay it
	conflict                  // the key was used with another tool or other arguments
	busy                      // another live attempt owns the call
	lost                      // the call's outcome is unknown: it is not run again
	vanished                  // a task the runner took up has no row any more
)

// What an abandoned in_flight claim means, in calls.on_lost.
const (
	// onLostRerun: the call's work commits with its outcome, so a claim
	// without an outcome committed nothing, and the next attempt runs it.
	onLostRerun = "rerun"
	// onLostUnknown: the call was handed to a process whose work commits
	// outside the call's transaction; it may have run, so it becomes unknown.
	onLostUnknown = "unknown"
)

// callRow is what a claim reads of an existing call.
type callRow struct {
	id          int64
	uid         string
	tool        string
	argsHash    string
	state       string
	owner       string
	leaseUntil  int64
	result      sql.NullString
	createdAt   int64
	completedAt sql.NullInt64
	expiresAt   int64
	onLost      string
	taskID      string // "" for a call that is no task
	// unreadable: the result is sealed and cannot be opened (sealed.go).
	unreadable error
}

type claimResult struct {
	kind claimKind
	row  callRow
}

const selectCallForClaim = `
SELECT id, uid, tool, args_hash, state, owner, lease_until, result, created_at, completed_at, expires_at, on_lost, coalesce(task_id, '')
FROM calls WHERE principal = $1 AND key = $2`

const insertCall = `
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at, on_lost, tool_call_id, retain_ms)
VALUES ($1, $2, $3, $4, $5, $6, 'in_flight', $7, $8, $9, $10, $11, $12, $13)
RETURNING id`

// insertFreshCall is insertCall that does nothing when the key has a row:
// on SQLite a fresh key's claim is then this one statement, with no read
// before it (claimFresh).
const insertFreshCall = `
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at, on_lost, tool_call_id, retain_ms)
VALUES ($1, $2, $3, $4, $5, $6, 'in_flight', $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (principal, key) DO NOTHING
RETURNING id`

const deleteExpiredCall = `
DELETE FROM calls WHERE id = $1 AND state = $2 AND expires_at <= $3`

// setAsideUnknownCall moves an unknown call made without a key, whose
// fingerprint window has passed, to a key of its own.
const setAsideUnknownCall = `
UPDATE calls SET key = key || '/' || CAST($2 AS TEXT) WHERE id = $1 AND state = 'unknown' AND expires_at <= $3`

// takeOverCall makes the attempt the call's owner; the row's tool-call id
// becomes the new owner's, the attempt that runs the call.
const takeOverCall = `
UPDATE calls SET owner = $1, lease_until = $2, attempts = attempts + 1, tool_call_id = $5
WHERE id = $3 AND state = 'in_flight' AND owner = $4`

const markUnknown = `
UPDATE calls SET state = 'unknown', completed_at = $1, owner = '', lease_until = 0
WHERE id = $2 AND state = 'in_flight' AND owner = $3`

// claim runs the claim described in the package doc, as a unit of the
// writer's group commit. It does not wait for an fsync of its own: the
// outcome's full commit makes the claim durable with it, and a claim lost to
// a crash or a power failure only forgets a call that had not committed
// anything (its attempt then fails the fence).
//
// Two kinds of claim wait for their commit before the call goes on: a claim
// whose call may run outside the call's transaction (on_lost 'unknown') is
// the only record that the call may have happened, so it commits with a full
// fsync; and a claim another process reads (a cooperating upstream checks it
// as its fence) must be committed before the call is forwarded.
//
// A claim that finds another connection holding SQLite's write lock (another
// process on the same file) waits for it no later than deadline, then fails
// with SQLITE_BUSY (see isBusy); acquire then tries again.
func (l *Layer) claim(ctx context.Context, a *attempt, deadline time.Time) (claimResult, error) {
	// A task's claim is the task: the extension forbids answering with it
	// before it is durable, so it commits with an fsync and is waited for.
	durable := a.tool.onLostPolicy() == onLostUnknown || a.task != nil
	if l.db.Dialect == schema.Postgres && a.task == nil {
		oneTrip := true
		if !durable && !a.tool.sharedClaim {
			// Uncommitted, in the call's own transaction: see
			// claim_tx_postgres.go.
			res, tried, done, err := l.claimInTx(ctx, a, deadline)
			if err != nil || done {
				return res, err
			}
			oneTrip = !tried // a row that needs a write goes to claimIn
		}
		// Committed when it returns: durable, or visible to a cooperating
		// upstream, as the waits below make the transactional claim.
		if oneTrip {
			if res, ok, err := l.claimOneTrip(ctx, a, durable); err != nil || ok {
				return res, err
			}
		}
	}
	u, err := l.group.enterBy(ctx, durable, deadline)
	if err != nil {
		return claimResult{}, err
	}
	res, err := l.claimIn(ctx, u, a)
	b := u.leave(err == nil)
	if err == nil && (durable || a.tool.sharedClaim) {
		err = b.wait()
	}
	if err != nil {
		return claimResult{}, err
	}
	return res, nil
}

// errClaimRaced: another claim changed the call's row between this one's
// read and its write. Only PostgreSQL's concurrent transactions see it;
// claimIn then reads again.
var errClaimRaced = errors.New("the call's row changed under the claim")

// maxClaimReads bounds how often a claim reads the row again after losing
// a race; each loss means another attempt made progress.
const maxClaimReads = 8

// claimIn reads and writes the call's row in the unit u. Every write is a
// compare-and-set on the state it read (and the owner, for a takeover):
// on SQLite the one writer makes the read and the write atomic anyway; on
// PostgreSQL, under READ COMMITTED, a write whose condition no longer
// holds changes nothing, or the insert of a key another claim inserted
// first fails, and the claim reads the row again from its savepoint.
func (l *Layer) claimIn(ctx context.Context, u *unit, a *attempt) (claimResult, error) {
	for range maxClaimReads {
		res, err := l.claimOnce(ctx, u, a)
		if !errors.Is(err, errClaimRaced) {
			return res, err
		}
		if err := u.undo(); err != nil {
			return claimResult{}, err
		}
	}
	return claimResult{}, fmt.Errorf("claim: %w %d times in a row", errClaimRaced, maxClaimReads)
}

// raced turns a write of the claim that found the row changed into
// errClaimRaced.
func raced(r sql.Result, err error) error {
	if err != nil {
		return err
	}
	if n, err := r.RowsAffected(); err != nil || n != 1 {
		return errClaimRaced
	}
	return nil
}

func (l *Layer) claimOnce(ctx context.Context, u *unit, a *attempt) (claimResult, error) {
	now := l.nowMS()
	if ok, err := l.claimFresh(u, a, now); err != nil {
		return claimResult{}, err
	} else if ok {
		return claimResult{kind: claimed}, nil
	}
	var r callRow
	err := u.queryRow(selectCallForClaim, a.id.principal, a.id.key).Scan(
		&r.id, &r.uid, &r.tool, &r.argsHash, &r.state, &r.owner, &r.leaseUntil,
		&r.result, &r.createdAt, &r.completedAt, &r.expiresAt, &r.onLost, &r.taskID)
	if errors.Is(err, sql.ErrNoRows) && a.id.plainKey != "" && now < l.plainFingerprintsUntil.Load() {
		// Encryption was turned on within a fingerprint window: an
		// identical call made before it is under its plain fingerprint.
		err = u.queryRow(selectCallForClaim, a.id.principal, a.id.plainKey).Scan(
			&r.id, &r.uid, &r.tool, &r.argsHash, &r.state, &r.owner, &r.leaseUntil,
			&r.result, &r.createdAt, &r.completedAt, &r.expiresAt, &r.onLost, &r.taskID)
		if err == nil && r.state == "unknown" && r.expiresAt <= now {
			err = sql.ErrNoRows // past its window it names no call; it stays for the operator under its own key
		}
	}
	found := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return claimResult{}, fmt.Errorf("read call: %w", err)
	}

	// An unknown outcome never expires: only an operator settles it. A call
	// made without a key, though, names its identical calls only for the
	// fingerprint window, as a completed one does: past it, an identical
	// call is a new call. The unknown call keeps its row for the operator,
	// under a key of its own (its fingerprint and its uid), which frees the
	// fingerprint for the new call.
	if found && r.state == "unknown" && a.id.source == callkey.SourceFingerprint && r.expiresAt <= now {
		if err := raced(u.exec(setAsideUnknownCall, r.id, r.uid, now)); err != nil {
			return claimResult{}, fmt.Errorf("set aside unknown call: %w", err)
		}
		found = false
	}
	if found && r.state != "in_flight" && r.state != "unknown" && r.expiresAt <= now {
		// The key's record expired: the key is free to name a new call. The
		// old call's effects keep their own Idempotency-Keys.
		if err := raced(u.exec(deleteExpiredCall, r.id, r.state, now)); err != nil {
			return claimResult{}, fmt.Errorf("delete expired call: %w", err)
		}
		found = false
	}

	if !found && a.task != nil && a.task.recover {
		// The task the runner took up ended meanwhile (an operator, the
		// reaper): nothing to run, and never a new task in its place.
		return claimResult{kind: vanished}, nil
	}
	if !found {
		err := u.queryRow(insertCall, a.uid, a.id.principal, a.id.key, string(a.id.source),
			a.tool.name, a.id.argsHash, a.owner, now+l.opts.Lease.Milliseconds(), now, now+a.retention().Milliseconds(),
			a.tool.onLostPolicy(), a.toolCallID, a.tool.retainMS()).Scan(&a.callID)
		if pgcode.Of(err) == pgcode.UniqueViolation {
			return claimResult{}, errClaimRaced
		}
		if err != nil {
			return claimResult{}, fmt.Errorf("insert call: %w", err)
		}
		a.createdAt = now
		if err := a.writeTask(u, ""); err != nil {
			return claimResult{}, err
		}
		return claimResult{kind: claimed}, nil
	}

	if r.tool != a.tool.name || !a.id.matches(r.argsHash) {
		return claimResult{kind: conflict, row: r}, nil
	}
	if r.state == "unknown" {
		return claimResult{kind: lost, row: r}, nil
	}
	if r.state != "in_flight" {
		l.openResult(context.Background(), u.querier(), a.id.principal, &r)
		return claimResult{kind: finished, row: r}, nil
	}
	if a.task != nil && a.task.recover && r.taskID != a.task.taskID() {
		return claimResult{kind: vanished}, nil
	}

	// In flight. This layer's own attempts are in l.local, and a holds the
	// key's entry there, so an owner of this layer is not running: it ended
	// without releasing its claim. An owner in a dead process is not running
	// either. Anyone else is trusted until the lease passes.
	switch l.liveness(r.owner) {
	case ownerSelf, ownerDead:
	default:
		if r.leaseUntil > now {
			return claimResult{kind: busy, row: r}, nil
		}
	}
	if r.onLost == onLostUnknown {
		// The abandoned attempt handed the call to a process whose work
		// commits on its own: it may have run. Never run it again.
		if err := raced(u.exec(markUnknown, now, r.id, r.owner)); err != nil {
			return claimResult{}, fmt.Errorf("mark call unknown: %w", err)
		}
		l.logger.WarnContext(ctx, "outcome of an abandoned call is unknown", "tool", a.tool.name, "previous_owner", r.owner)
		r.state, r.completedAt = "unknown", sql.NullInt64{Int64: now, Valid: true}
		return claimResult{kind: lost, row: r}, nil
	}
	if err := raced(u.exec(takeOverCall, a.owner, now+l.opts.Lease.Milliseconds(), r.id, r.owner, a.toolCallID)); err != nil {
		return claimResult{}, fmt.Errorf("take over call: %w", err)
	}
	l.logger.InfoContext(ctx, "took over call", "tool", a.tool.name, "previous_owner", r.owner)
	a.callID, a.uid, a.createdAt = r.id, r.uid, r.createdAt
	if a.task == nil && r.taskID != "" {
		// A plain retry took over a task: it runs it as the task it is,
		// so that the row ends as a task does and is never deleted.
		a.task = &attemptTask{opts: a.tool.tasks, id: r.taskID}
	}
	if err := a.writeTask(u, r.taskID); err != nil {
		return claimResult{}, err
	}
	return claimResult{kind: claimed}, nil
}

// claimFresh claims a fresh key on SQLite in one statement: the insert,
// which does nothing if the key has a row (ok false; claimOnce then reads
// that row and decides as for any key). In serve's profile under
// outbox-load (one client), the read the insert spares (thirteen columns
// scanned through database/sql) was about a quarter of the claim's CPU
// time, and the claim's CPU per call fell by a quarter at one client and by
// half at 32; most calls bring a fresh key. A replay pays for it: its
// insert does nothing, and the read follows. SQLite's one writer makes the insert and a later read
// of the same unit see one state, so nothing can come between them.
//
// Tasks and the window after encryption was turned on take claimOnce's
// read first: a task the runner took up must not be inserted again, and a
// keyless call may stand under its plain fingerprint, which the insert
// would not see. PostgreSQL claims a fresh key in claimOneTrip.
func (l *Layer) claimFresh(u *unit, a *attempt, now int64) (ok bool, err error) {
	if l.db.Dialect != schema.SQLite || a.task != nil ||
		(a.id.plainKey != "" && now < l.plainFingerprintsUntil.Load()) {
		return false, nil
	}
	err = u.queryRow(insertFreshCall, a.uid, a.id.principal, a.id.key, string(a.id.source),
		a.tool.name, a.id.argsHash, a.owner, now+l.opts.Lease.Milliseconds(), now, now+a.retention().Milliseconds(),
		a.tool.onLostPolicy(), a.toolCallID, a.tool.retainMS()).Scan(&a.callID)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("insert call: %w", err)
	}
	a.createdAt = now
	return true, nil
}
