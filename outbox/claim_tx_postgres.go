package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
)

// The claim of a fresh key in the call's own transaction (PostgreSQL,
// issue 28).
//
// A claim whose call may run again if it is lost (on_lost 'rerun', the
// default: the call's work commits with its outcome) needs no commit of
// its own. So on pgx's own driver the claim is the first statement of the
// transaction that will hold the handler's work and the outcome, sent
// with BEGIN in one round trip:
//
//	BEGIN + the claim (INSERT … ON CONFLICT DO NOTHING, or the read of the row)   one round trip
//	the handler's statements                                                      one each
//	the outcome (+ effects) + COMMIT                                              one round trip
//
// Three round trips and one commit for a fresh key, where a claim of its
// own costs a fourth and a second commit. Nothing else changes hands:
//
//   - The uncommitted insert holds the key at the unique index. Another
//     attempt's insert of the same key (any replica) waits for this
//     transaction: if it commits, the waiter reads the outcome (a join);
//     if it rolls back, the waiter claims the key itself and runs the call,
//     which is what a retry of a call whose claim was lost does. The row
//     can only ever be committed by this transaction, with its outcome, so
//     it is its own fence: no SELECT … FOR UPDATE is needed, nobody can take
//     the call over, and its lease needs no renewal.
//   - A waiter waits no longer than its in-flight wait (lock_timeout, set
//     by its own claim statement), then answers in_progress, as a duplicate
//     of a visible in_flight row does.
//   - A crash, a kill or a partition before COMMIT leaves no row at all:
//     nothing of the call committed, and a retry runs it. The rerun policy
//     already allows that of a lost claim.
//   - The status tool of another process does not see the uncommitted row:
//     it answers not_found until the outcome commits (the process that runs
//     the call answers in_flight, from its own attempts). That is true of
//     what is committed, and a retry it prompts is safe: it waits for the
//     running attempt at the key, and then replays its outcome, or runs the
//     call if it did not commit.
//   - The transaction is bounded by the lease (set by the claim statement
//     for the rest of the transaction): idle_in_transaction_session_timeout
//     ends the session of a replica that stopped talking (paused, or cut off
//     by a link that swallows packets) once it has been silent a lease long,
//     which rolls the call back and frees the key for a retry; and
//     lock_timeout bounds the handler's lock waits by the lease too. No
//     statement_timeout: it would cut a handler's own long statements, and
//     a replica cut off mid-statement leaves its session idle once the
//     statement ends, which the idle timeout then ends. A live handler
//     that works outside the database for longer than the lease keeps its
//     call: the renewal loop sends SELECT 1 in a transaction that has been
//     quiet for a sixth of the lease (keepAlive, pipe_postgres.go), so only
//     a silent process loses its session.
//
// A key that is not fresh is answered from the row the same statement read
// when the answer writes nothing (a replay, a conflict, an unknown outcome,
// a live owner elsewhere): the answer goes out at once, and the transaction,
// which wrote nothing, is rolled back behind it before its connection
// returns to the pool, so a replay costs one round trip of latency. A row
// that needs a write (an expired record, an abandoned claim) rolls back and
// goes through claimIn, which decides with every compare-and-set.
//
// Durable claims (on_lost 'unknown', tasks) and claims another process
// reads (a cooperating upstream's fence) commit on their own, as before;
// so does every claim through a driver that wraps pgx's, which sees each
// statement alone.

// The row of a claim in the call's transaction is inserted as the
// outcome will leave it, not in_flight (issue 38): state 'completed',
// no owner and no lease, and an expiry that the outcome will not need to
// move. Nobody but the transaction sees the row before it commits, and it
// commits only with its outcome (the piped outcome fails unless it
// matched, and commitPiped refuses to commit such a unit without one), so
// no reader ever meets this form. What it saves is the database's work:
// the outcome then changes no indexed column (state, owner and expires_at
// are keys or predicates of calls' indexes), so PostgreSQL updates the
// row in place on its page (a HOT update) and writes no index entry for
// it, where an in_flight row costs the calls_in_flight entry at the
// insert and a second entry in each of four indexes at the outcome. A
// failed outcome, or a call that outlasts its expiry's slack, changes
// state or expires_at as before, at today's cost.
//
// The expiry is the claim's time plus the retention, which the outcome
// keeps when the call ended within a slack (settledSlack) and otherwise
// moves to the outcome's time plus the retention, as before: the key
// names its call for its retention counted from the claim or from the
// outcome, never more than the slack short of the latter.

// claimInTxPostgres is claimOneTripPostgres in a transaction begun with
// it. The FROM subquery sets the claim's own lock wait ($10, in
// milliseconds: a duplicate's wait at the key) and the transaction's
// idle bound ($12, the lease), before the insert runs; the
// insert's RETURNING, evaluated only once the row is in, sets the lock
// wait of the handler's statements to the lease.
const claimInTxPostgres = `
WITH ins AS (
  INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at, on_lost, tool_call_id, retain_ms)
  SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, 'completed', '', 0, $7::bigint, $8::bigint, 'rerun', $9::text, $11::bigint
  FROM (SELECT set_config('lock_timeout', $10::text, true) AS l,
               set_config('idle_in_transaction_session_timeout', $12::text, true) AS i) AS bounds
  WHERE bounds.l IS NOT NULL AND bounds.i IS NOT NULL
  ON CONFLICT (principal, key) DO NOTHING
  RETURNING id, set_config('lock_timeout', $12::text, true) AS handler_lock_timeout)
SELECT true, id, '', '', '', '', '', 0::bigint, NULL::text, 0::bigint, NULL::bigint, 0::bigint, '', '' FROM ins WHERE handler_lock_timeout IS NOT NULL
UNION ALL
SELECT false, id, uid, tool, args_hash, state, owner, lease_until, result, created_at, completed_at, expires_at, on_lost, coalesce(task_id, '')
FROM calls WHERE principal = $2::text AND key = $3::text AND NOT EXISTS (SELECT 1 FROM ins)`

// reclaimInTxPostgres inserts the claim again, under its id ($13), in a
// transaction begun anew after the attempt rolled its work back (a failed
// result keeps nothing; input required runs the handler again). It waits
// for nobody ($10 is a millisecond): a key another attempt took in between
// is that attempt's now.
const reclaimInTxPostgres = `
INSERT INTO calls (id, uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at, on_lost, tool_call_id, retain_ms)
SELECT $13::bigint, $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, 'completed', '', 0, $7::bigint, $8::bigint, 'rerun', $9::text, $11::bigint
FROM (SELECT set_config('lock_timeout', $10::text, true) AS l,
             set_config('idle_in_transaction_session_timeout', $12::text, true) AS i) AS bounds
WHERE bounds.l IS NOT NULL AND bounds.i IS NOT NULL
ON CONFLICT DO NOTHING
RETURNING id, set_config('lock_timeout', $12::text, true)`

// settledSlack is how long a call claimed in its transaction may run and
// keep the expiry its claim wrote, which keeps the outcome's update in
// place (see above): its key then expires that much sooner after the
// outcome, at most. A sixteenth of the retention, at most a second: a
// day's retention is counted from the claim of a call that took less than
// a second, a fingerprint window of ten seconds from the claim of one
// that took less than 625 ms.
func settledSlack(retention time.Duration) time.Duration {
	return min(time.Second, retention/16)
}

// settledExpiry is the outcome's expiry for a call claimed in its
// transaction: the claim's, if the outcome's own (expires) is within the
// slack of it.
func (a *attempt) settledExpiry(expires int64) int64 {
	if expires-a.claimExpires <= settledSlack(a.retention()).Milliseconds() {
		return a.claimExpires
	}
	return expires
}

// claimInTx tries the claim in the call's own transaction (see above).
// tried is false when it cannot (the pool's driver cannot pipeline, or a
// keyless call may stand under its plain fingerprint): the claim then
// goes on as before. done is false when the row needs a write: claimIn
// decides.
func (l *Layer) claimInTx(ctx context.Context, a *attempt, deadline time.Time) (res claimResult, tried, done bool, err error) {
	if a.id.plainKey != "" && l.nowMS() < l.plainFingerprintsUntil.Load() {
		return claimResult{}, false, false, nil
	}
	conn, err := l.db.Write.Conn(ctx)
	if err != nil {
		return claimResult{}, true, true, fmt.Errorf("take database connection: %w", err)
	}
	u := l.group.pipedUnit(conn, true, a.reclaim)
	if u == nil {
		conn.Close()
		return claimResult{}, false, false, nil
	}
	lease := strconv.FormatInt(max(l.opts.Lease.Milliseconds(), 1), 10)
	for range maxClaimReads {
		now := l.nowMS()
		wait := strconv.FormatInt(max(time.Until(deadline).Milliseconds(), 1), 10)
		args := []any{a.uid, a.id.principal, a.id.key, string(a.id.source), a.tool.name, a.id.argsHash,
			now, now + a.retention().Milliseconds(), a.toolCallID,
			wait, a.tool.retainMS(), lease}
		var (
			fresh bool
			r     callRow
		)
		err := u.queryFirst(claimInTxPostgres, args, &fresh,
			&r.id, &r.uid, &r.tool, &r.argsHash, &r.state, &r.owner, &r.leaseUntil,
			&r.result, &r.createdAt, &r.completedAt, &r.expiresAt, &r.onLost, &r.taskID)
		if errors.Is(err, sql.ErrNoRows) {
			// Raced (see claimOneTripPostgres): the insert met a row its
			// statement's snapshot does not show, typically after waiting
			// at the key for the transaction that committed it. The
			// transaction wrote nothing; the next statement has a snapshot
			// that shows the row. An outcome found then is a join.
			a.waited = true
			continue
		}
		if err != nil {
			u.leave(false)
			if pgcode.Of(err) == pgcode.LockNotAvailable {
				// Another attempt's transaction held the key for all of
				// the in-flight wait: it is running the call.
				return claimResult{kind: busy}, true, true, nil
			}
			return claimResult{}, true, true, fmt.Errorf("claim call: %w", err)
		}
		if fresh {
			args[9] = "1" // reclaim waits for nobody
			a.callID, a.createdAt, a.reclaimArgs = r.id, now, append(args, r.id)
			a.claimExpires = args[7].(int64)
			a.claimInTx = true
			u.outcome = true
			u.b.piped.settledClaim = true
			a.unit, a.tx = u, u.tx()
			// The uncommitted row is its own fence: no lease to renew,
			// but the transaction must not look idle while the handler
			// works outside the database (keepAlive).
			a.fenced.Store(true)
			u.b.piped.keepOn()
			a.inTx.Store(u.b.piped)
			return claimResult{kind: claimed}, true, true, nil
		}
		res, ok := l.settled(a, r, now)
		if !ok {
			u.leave(false)
			return claimResult{}, true, false, nil
		}
		// The answer writes nothing: it goes out now, and the transaction
		// ends behind it (a replay costs one round trip of latency).
		go u.leave(false)
		if res.kind == finished {
			// A sealed result costs a read of its data key (sealed.go).
			l.openResult(ctx, l.db.Write, a.id.principal, &res.row)
		}
		return res, true, true, nil
	}
	u.leave(false)
	return claimResult{}, true, false, nil // let claimIn sort it out
}

// reclaim is the redo of a unit whose claim rode in its transaction:
// after the transaction rolled back (discardWork), the claim is inserted
// again in the new one, under the same id and uid, so that nothing else
// of the attempt changes. A key another attempt claimed in between is
// that attempt's: this one has lost it.
func (a *attempt) reclaim(u *unit) error {
	var (
		id      int64
		relaxed string
	)
	err := u.queryFirst(reclaimInTxPostgres, a.reclaimArgs, &id, &relaxed)
	if errors.Is(err, sql.ErrNoRows) || pgcode.Of(err) == pgcode.LockNotAvailable {
		return ErrOwnershipLost
	}
	if err != nil {
		return fmt.Errorf("claim again: %w", err)
	}
	u.b.piped.keepOn() // the rollback turned it off
	return nil
}
