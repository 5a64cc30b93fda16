// Package retention is the purge of finished records that the reaper of
// package outbox runs continuously and package admin runs on an operator's
// request: one implementation, so that both delete exactly the same rows.
package retention

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Ages says how long finished records stay: outbox.Retention's fields.
type Ages struct {
	Calls, Delivered, Cancelled time.Duration
}

// WithDefaults fills the zero fields of a with those of def (outbox's
// Default*Retention) and refuses negative ones, which would purge records
// still in use.
func (a Ages) WithDefaults(def Ages) (Ages, error) {
	for _, f := range []struct {
		d   *time.Duration
		def time.Duration
	}{{&a.Calls, def.Calls}, {&a.Delivered, def.Delivered}, {&a.Cancelled, def.Cancelled}} {
		switch {
		case *f.d < 0:
			return a, fmt.Errorf("retention: negative duration %s", *f.d)
		case *f.d == 0:
			*f.d = f.def
		}
	}
	return a, nil
}

// Counts are the rows a purge deleted, or would delete in a dry run, and
// the abandoned claims it turned into unknown calls (or would).
type Counts struct {
	Calls, DeliveredEffects, CancelledEffects, UnknownCalls int64
}

// purgeBatch bounds the rows one purge transaction deletes, so that the
// single writer is held for milliseconds and tool calls queue behind a
// purge only briefly.
const purgeBatch = 1000

// The purge statements. Each delete takes at most its last parameter's
// number of rows, picked by the same condition as its count, with the same
// parameters before it, so a dry run reports what a purge would delete.
// The calls condition leaves a call alone while any effect of it still
// needs work or a decision; delivered and cancelled effects do not hold
// it, and lose their call_id when it goes (ON DELETE SET NULL).
const (
	// effects_delivered, named: without statistics SQLite prefers the
	// equality on effects_state and reads every delivered effect.
	countDelivered  = `SELECT count(*) FROM effects INDEXED BY effects_delivered WHERE state = 'delivered' AND delivered_at <= $1`
	deleteDelivered = `
DELETE FROM effects WHERE id IN (
    SELECT id FROM effects INDEXED BY effects_delivered WHERE state = 'delivered' AND delivered_at <= $1 LIMIT $2)`

	countCancelled  = `SELECT count(*) FROM effects WHERE state = 'cancelled' AND updated_at <= $1`
	deleteCancelled = `
DELETE FROM effects WHERE id IN (
    SELECT id FROM effects WHERE state = 'cancelled' AND updated_at <= $1 LIMIT $2)`

	// An abandoned claim of a forwarded call (on_lost = 'unknown') is not
	// deleted: it becomes unknown, owned by nobody. It leaves the in_flight
	// state, so each batch finds the next ones.
	countLost = `SELECT count(*) FROM calls WHERE state = 'in_flight' AND on_lost = 'unknown' AND lease_until <= $1`
	markLost  = `
UPDATE calls SET state = 'unknown', owner = '', lease_until = 0 WHERE id IN (
    SELECT id FROM calls WHERE state = 'in_flight' AND on_lost = 'unknown' AND lease_until <= $1 LIMIT $2)`

	// Calls in state unknown are never deleted: only an operator settles
	// them. $1 is now, $2 the latest lease of an abandoned claim kept no
	// longer, $3 the Calls age in ms: a call's own retain_ms (its tool's
	// outcome retention) wins over it.
	countCalls = `
SELECT count(*) FROM calls c
WHERE ((c.state IN ('completed', 'failed') AND c.expires_at <= $1
            AND coalesce(c.completed_at, c.created_at) + coalesce(c.retain_ms, $3) <= $1)
       OR (c.state = 'in_flight' AND c.on_lost = 'rerun' AND c.lease_until <= $2))
  AND NOT EXISTS (SELECT 1 FROM effects e
                  WHERE e.call_id = c.id AND e.state IN ('pending', 'in_flight', 'dead', 'unknown'))`
	deleteCalls = `
DELETE FROM calls WHERE id IN (
    SELECT c.id FROM calls c
    WHERE ((c.state IN ('completed', 'failed') AND c.expires_at <= $1
            AND coalesce(c.completed_at, c.created_at) + coalesce(c.retain_ms, $3) <= $1)
           OR (c.state = 'in_flight' AND c.on_lost = 'rerun' AND c.lease_until <= $2))
      AND NOT EXISTS (SELECT 1 FROM effects e
                      WHERE e.call_id = c.id AND e.state IN ('pending', 'in_flight', 'dead', 'unknown'))
    LIMIT $4)`
)

// The purge statements on PostgreSQL, where every replica runs a reaper,
// at once if it happens so, while the call path and the dispatchers change
// the same rows. Without a lock between the reapers: each batch locks the
// rows it picked, FOR UPDATE SKIP LOCKED, so concurrent reapers take
// disjoint batches and none waits for a call's transaction that holds its
// row (a claim, an outcome, a lease renewal); a row changed since the
// statement's snapshot is checked again, as it is now, before it is locked,
// so a claim renewed or taken over meanwhile, or an effect an operator
// retried, is not purged on the strength of what it was. (The effects'
// condition of a call, NOT EXISTS, is read from the snapshot: an effect
// only gains a call's reference in the transaction that writes the call's
// outcome, which holds the call's row.) INDEXED BY is SQLite's; PostgreSQL
// finds the partial index effects_delivered by itself. The counts are the
// same text on both.
const (
	deleteDeliveredPostgres = `
DELETE FROM effects WHERE id IN (
    SELECT id FROM effects WHERE state = 'delivered' AND delivered_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`
	countDeliveredPostgres = `SELECT count(*) FROM effects WHERE state = 'delivered' AND delivered_at <= $1`

	deleteCancelledPostgres = `
DELETE FROM effects WHERE id IN (
    SELECT id FROM effects WHERE state = 'cancelled' AND updated_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`

	markLostPostgres = `
UPDATE calls SET state = 'unknown', owner = '', lease_until = 0 WHERE id IN (
    SELECT id FROM calls WHERE state = 'in_flight' AND on_lost = 'unknown' AND lease_until <= $1 LIMIT $2
    FOR UPDATE SKIP LOCKED)`

	// Calls go in two statements of one transaction: lockCallsPostgres
	// picks and locks a batch, and deleteLockedCallsPostgres, whose
	// snapshot is taken after the locks are held, reads the effects'
	// condition again. A single statement read it from a snapshot taken
	// before it locked the call: an operator's retry of a cancelled
	// effect committed in between (it changes the effect, not the call,
	// so nothing made the statement look again) left a pending effect
	// whose call the delete then removed (ON DELETE SET NULL), so it lost
	// its call's order and status. The retry takes the call's row lock
	// too (see admin.RetryEffect): a call whose effect is being retried is
	// skipped, and a retry that comes after the lock waits for this
	// transaction and then finds the call gone, as if it had come later.
	lockCallsPostgres = `
SELECT c.id FROM calls c
WHERE ((c.state IN ('completed', 'failed') AND c.expires_at <= $1
        AND coalesce(c.completed_at, c.created_at) + coalesce(c.retain_ms, $3) <= $1)
       OR (c.state = 'in_flight' AND c.on_lost = 'rerun' AND c.lease_until <= $2))
  AND NOT EXISTS (SELECT 1 FROM effects e
                  WHERE e.call_id = c.id AND e.state IN ('pending', 'in_flight', 'dead', 'unknown'))
LIMIT $4
FOR UPDATE OF c SKIP LOCKED`
	deleteLockedCallsPostgres = `
DELETE FROM calls c WHERE c.id = ANY($1)
  AND NOT EXISTS (SELECT 1 FROM effects e
                  WHERE e.call_id = c.id AND e.state IN ('pending', 'in_flight', 'dead', 'unknown'))`
)

// Purge deletes the records r no longer keeps at time now (outbox.Retention
// says which) and says how many. With dryRun it deletes nothing and says
// how many it would. Rows go in transactions of at most a thousand, so a large purge
// does not hold the writer from tool calls; if ctx ends midway, the counts
// say what was already deleted.
//
// r must have been through WithDefaults: a zero age would purge at once.
func Purge(ctx context.Context, db *schema.DB, r Ages, now time.Time, dryRun bool) (Counts, error) {
	nowMS := now.UnixMilli()
	// Effects go first: calls are never held by delivered or cancelled
	// effects, but deleting those first keeps the ON DELETE SET NULL of
	// the calls' deletes from touching rows about to go anyway.
	var c Counts
	completedBefore := nowMS - r.Calls.Milliseconds()
	steps := []struct {
		what          string
		count, delete string
		args          []any // the count's; the delete's batch size follows
		n             *int64
	}{
		{"expired delivered effects", db.Pick(countDelivered, countDeliveredPostgres), db.Pick(deleteDelivered, deleteDeliveredPostgres),
			[]any{nowMS - r.Delivered.Milliseconds()}, &c.DeliveredEffects},
		{"expired cancelled effects", countCancelled, db.Pick(deleteCancelled, deleteCancelledPostgres),
			[]any{nowMS - r.Cancelled.Milliseconds()}, &c.CancelledEffects},
		{"abandoned claims of forwarded calls (marking them unknown)", countLost, db.Pick(markLost, markLostPostgres),
			[]any{completedBefore}, &c.UnknownCalls},
		{"expired calls", countCalls, db.Pick(deleteCalls, lockCallsPostgres),
			[]any{nowMS, completedBefore, r.Calls.Milliseconds()}, &c.Calls},
	}
	for _, s := range steps {
		if dryRun {
			if err := db.Read.QueryRowContext(ctx, s.count, s.args...).Scan(s.n); err != nil {
				return c, fmt.Errorf("count %s: %w", s.what, err)
			}
			continue
		}
		args := append(s.args, purgeBatch)
		batch := purgeBatchOf
		if s.delete == lockCallsPostgres {
			batch = purgeCallsPostgres
		}
		for {
			n, picked, err := batch(ctx, db, s.delete, args)
			*s.n += n
			if err != nil {
				return c, fmt.Errorf("purge %s: %w", s.what, err)
			}
			if picked < purgeBatch {
				break
			}
		}
	}
	return c, nil
}

// purgeBatchOf runs one batch delete in its own transaction. A purge lost
// to a power failure only brings back rows the next purge deletes again,
// so it does not pay for an fsync of its own.
// It returns the rows changed, twice: as changed, and as picked for the
// batch (the same here).
func purgeBatchOf(ctx context.Context, db *schema.DB, stmt string, args []any) (int64, int64, error) {
	var n int64
	err := db.Relaxed(ctx, func(conn *sql.Conn) error {
		res, err := conn.ExecContext(ctx, stmt, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, n, err
}

// purgeCallsPostgres deletes one batch of calls on PostgreSQL: lock, then
// delete what still qualifies (see lockCallsPostgres). It returns the calls
// deleted and the calls picked, which a later read may have spared.
func purgeCallsPostgres(ctx context.Context, db *schema.DB, lock string, args []any) (int64, int64, error) {
	var n, picked int64
	err := db.Relaxed(ctx, func(conn *sql.Conn) error {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		rows, err := tx.QueryContext(ctx, lock, args...)
		if err != nil {
			return err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		picked = int64(len(ids))
		if picked == 0 {
			return nil
		}
		res, err := tx.ExecContext(ctx, deleteLockedCallsPostgres, ids)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		return tx.Commit()
	})
	return n, picked, err
}
