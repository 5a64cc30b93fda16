package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// claimOneTripPostgres is the claim of a fresh key, and the read of a
// settled one, in one statement on its own (an implicit transaction):
// one round trip where the transactional claim (claimIn) takes five
// (BEGIN; SET LOCAL and SAVEPOINT; the read; the insert; COMMIT).
//
// The insert goes first and does nothing if the key has a row; only then
// does the statement read that row. A key that another transaction
// inserted and has not yet committed makes the insert wait for it at the
// unique index, as the transactional claim's insert does; such
// transactions are claims, each a few statements long. The read uses the
// statement's snapshot, which may predate a row the insert found
// committed (READ COMMITTED): then it returns nothing, and the claim runs
// the statement again, as claimIn reads again after a race.
//
// set_config(…, true) sets synchronous_commit for the statement's own
// transaction, whose commit follows the statement: like the
// transactional claim's SET LOCAL, a claim that needs no durability of its
// own does not wait for a WAL flush (the outcome's durable commit flushes
// it too, since WAL is flushed in order).
const claimOneTripPostgres = `
WITH ins AS (
  INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at, on_lost, tool_call_id, retain_ms)
  SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, 'in_flight', $7::text, $8::bigint, $9::bigint, $10::bigint, $11::text, $12::text, $14::bigint
  FROM (SELECT set_config('synchronous_commit', CASE WHEN $13::boolean THEN current_setting('synchronous_commit') ELSE 'off' END, true)) AS durability
  ON CONFLICT (principal, key) DO NOTHING
  RETURNING id)
SELECT true, id, '', '', '', '', '', 0::bigint, NULL::text, 0::bigint, NULL::bigint, 0::bigint, '', '' FROM ins
UNION ALL
SELECT false, id, uid, tool, args_hash, state, owner, lease_until, result, created_at, completed_at, expires_at, on_lost, coalesce(task_id, '')
FROM calls WHERE principal = $2::text AND key = $3::text AND NOT EXISTS (SELECT 1 FROM ins)`

// claimOneTrip tries the claim in one round trip (PostgreSQL, a call that
// is no task). It is done (ok) when the key was fresh, or its row is
// settled so that the claim writes nothing: a replay, a conflict, an
// unknown outcome, a live owner. Any claim that must change an existing
// row (an expired record, an abandoned claim to take over or mark
// unknown) is not done here: claimIn reads the row again in a transaction
// and decides with every compare-and-set.
func (l *Layer) claimOneTrip(ctx context.Context, a *attempt, durable bool) (res claimResult, ok bool, err error) {
	ctx = background(ctx) // like a unit's statements: the claim commits or not as a whole
	if a.id.plainKey != "" && l.nowMS() < l.plainFingerprintsUntil.Load() {
		// A keyless call may stand under its plain fingerprint, made
		// before encryption was turned on: claimIn looks there too.
		return claimResult{}, false, nil
	}
	for range maxClaimReads {
		now := l.nowMS()
		var (
			fresh bool
			r     callRow
		)
		err := l.db.Write.QueryRowContext(ctx, claimOneTripPostgres,
			a.uid, a.id.principal, a.id.key, string(a.id.source), a.tool.name, a.id.argsHash, a.owner,
			now+l.opts.Lease.Milliseconds(), now, now+a.retention().Milliseconds(), a.tool.onLostPolicy(), a.toolCallID,
			durable, a.tool.retainMS()).Scan(&fresh,
			&r.id, &r.uid, &r.tool, &r.argsHash, &r.state, &r.owner, &r.leaseUntil,
			&r.result, &r.createdAt, &r.completedAt, &r.expiresAt, &r.onLost, &r.taskID)
		if errors.Is(err, sql.ErrNoRows) {
			continue // raced: see claimOneTripPostgres
		}
		if err != nil {
			return claimResult{}, false, fmt.Errorf("claim call: %w", err)
		}
		if fresh {
			a.callID, a.createdAt = r.id, now
			return claimResult{kind: claimed}, true, nil
		}
		res, ok := l.settled(a, r, now)
		if ok && res.kind == finished {
			// A sealed result costs a read of its data key (sealed.go).
			l.openResult(ctx, l.db.Write, a.id.principal, &res.row)
		}
		return res, ok, nil
	}
	return claimResult{}, false, nil // let claimIn sort it out
}

// settled decides the claim of an existing row when that writes nothing,
// or reports !ok. Its checks run in claimOnce's order, for a call that is
// no task; keep the two in step.
func (l *Layer) settled(a *attempt, r callRow, now int64) (claimResult, bool) {
	if r.state == "unknown" && a.id.source == callkey.SourceFingerprint && r.expiresAt <= now {
		return claimResult{}, false // set aside
	}
	if r.state != "in_flight" && r.state != "unknown" && r.expiresAt <= now {
		return claimResult{}, false // expired: deleted, then claimed anew
	}
	switch {
	case r.tool != a.tool.name || !a.id.matches(r.argsHash):
		return claimResult{kind: conflict, row: r}, true
	case r.state == "unknown":
		return claimResult{kind: lost, row: r}, true
	case r.state != "in_flight":
		return claimResult{kind: finished, row: r}, true
	}
	switch l.liveness(r.owner) {
	case ownerSelf, ownerDead:
		return claimResult{}, false // taken over or marked unknown
	}
	if r.leaseUntil > now {
		return claimResult{kind: busy, row: r}, true
	}
	return claimResult{}, false
}
