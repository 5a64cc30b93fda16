package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Defaults for [Retention] fields left at zero.
const (
	// DefaultCallRetention matches DefaultKeyRetention, so that by default a
	// call row lives exactly as long as its key is remembered; calls known by
	// a short fingerprint window stay this long for operators, whose effect
	// listings name the call's key and tool.
	DefaultCallRetention = 24 * time.Hour
	// DefaultDeliveredRetention keeps delivered effects, with the response
	// the destination sent, long enough to answer "did it go out?" for a
	// week after the fact.
	DefaultDeliveredRetention = 7 * 24 * time.Hour
	// DefaultCancelledRetention gives an operator a week to change their
	// mind: a cancelled effect can be retried until it is purged.
	DefaultCancelledRetention = 7 * 24 * time.Hour
	// DefaultReapInterval is how often [RunReaper] purges by default.
	DefaultReapInterval = 10 * time.Minute
)

// purgeBatch bounds the rows one purge transaction deletes, so that the
// single writer is held for milliseconds and tool calls queue behind a
// purge only briefly.
const purgeBatch = 1000

// Retention says how long finished records stay in the database. The zero
// value of each field selects the default documented on it.
//
// What is purged, and when:
//
//   - A call row in state completed or failed, once its key has expired
//     (expires_at, when a retry would run the call again anyway) and Calls
//     has passed since it completed, and only when none of its effects is
//     pending, in_flight, dead or unknown: an operator settling an
//     effect can still see which call it belongs to. Retention can never
//     make a key be forgotten earlier than the layer promises.
//
//   - A delivered effect, Delivered after its delivery.
//
//   - A cancelled effect, Cancelled after it was cancelled (its last update).
//
//   - An in_flight call whose lease passed more than Calls ago: a claim
//     left by an attempt that died and was never retried. It committed
//     nothing (effects are only written with an outcome), and should the
//     attempt still be running somewhere, the fence refuses its commit once
//     the row is gone.
//
// Not purged but settled: an in_flight call whose lease passed more than
// Calls ago and whose claim says on_lost = 'unknown' (it was forwarded to a
// process whose work is outside the call's transaction, such as a tool
// server behind mcp-outbox proxy) may have run there. Deleting it would let
// a retry run it again, so it becomes state unknown instead, owned by
// nobody, for an operator to settle ([ResolveCall]).
//
// Never purged: calls in state unknown, which wait for an operator, and
// pending, in_flight, dead and unknown effects, which still need a
// dispatcher or an operator.
type Retention struct {
	// Calls is the least time a call row is kept after its completion;
	// zero means DefaultCallRetention.
	Calls time.Duration
	// Delivered is how long a delivered effect is kept; zero means
	// DefaultDeliveredRetention.
	Delivered time.Duration
	// Cancelled is how long a cancelled effect is kept; zero means
	// DefaultCancelledRetention.
	Cancelled time.Duration
}

func (r Retention) withDefaults() (Retention, error) {
	for _, f := range []struct {
		d   *time.Duration
		def time.Duration
	}{{&r.Calls, DefaultCallRetention}, {&r.Delivered, DefaultDeliveredRetention}, {&r.Cancelled, DefaultCancelledRetention}} {
		switch {
		case *f.d < 0:
			return r, fmt.Errorf("retention: negative duration %s", *f.d)
		case *f.d == 0:
			*f.d = f.def
		}
	}
	return r, nil
}

// PurgeCounts are the rows a purge deleted, or would delete in a dry run,
// and the abandoned claims it turned into unknown calls (or would).
type PurgeCounts struct {
	Calls            int64 `json:"calls"`
	DeliveredEffects int64 `json:"deliveredEffects"`
	CancelledEffects int64 `json:"cancelledEffects"`
	// UnknownCalls are abandoned claims of forwarded calls that became
	// state unknown instead of being deleted; nothing was deleted of them.
	UnknownCalls int64 `json:"unknownCalls"`
}

// Effects is the number of effects of both kinds.
func (c PurgeCounts) Effects() int64 { return c.DeliveredEffects + c.CancelledEffects }

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
	// them. $1 is now, $2 the latest completion kept no longer.
	countCalls = `
SELECT count(*) FROM calls c
WHERE ((c.state IN ('completed', 'failed') AND c.expires_at <= $1 AND coalesce(c.completed_at, c.created_at) <= $2)
       OR (c.state = 'in_flight' AND c.on_lost = 'rerun' AND c.lease_until <= $2))
  AND NOT EXISTS (SELECT 1 FROM effects e
                  WHERE e.call_id = c.id AND e.state IN ('pending', 'in_flight', 'dead', 'unknown'))`
	deleteCalls = `
DELETE FROM calls WHERE id IN (
    SELECT c.id FROM calls c
    WHERE ((c.state IN ('completed', 'failed') AND c.expires_at <= $1 AND coalesce(c.completed_at, c.created_at) <= $2)
           OR (c.state = 'in_flight' AND c.on_lost = 'rerun' AND c.lease_until <= $2))
      AND NOT EXISTS (SELECT 1 FROM effects e
                      WHERE e.call_id = c.id AND e.state IN ('pending', 'in_flight', 'dead', 'unknown'))
    LIMIT $3)`
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

	deleteCallsPostgres = `
DELETE FROM calls WHERE id IN (
    SELECT c.id FROM calls c
    WHERE ((c.state IN ('completed', 'failed') AND c.expires_at <= $1 AND coalesce(c.completed_at, c.created_at) <= $2)
           OR (c.state = 'in_flight' AND c.on_lost = 'rerun' AND c.lease_until <= $2))
      AND NOT EXISTS (SELECT 1 FROM effects e
                      WHERE e.call_id = c.id AND e.state IN ('pending', 'in_flight', 'dead', 'unknown'))
    LIMIT $3
    FOR UPDATE OF c SKIP LOCKED)`
)

// Purge deletes the records r no longer keeps at time now (see [Retention])
// and says how many. With dryRun it deletes nothing and says how many it
// would. Rows go in transactions of at most a thousand, so a large purge
// does not hold the writer from tool calls; if ctx ends midway, the counts
// say what was already deleted.
func Purge(ctx context.Context, db *schema.DB, r Retention, now time.Time, dryRun bool) (PurgeCounts, error) {
	r, err := r.withDefaults()
	if err != nil {
		return PurgeCounts{}, err
	}
	nowMS := now.UnixMilli()
	// Effects go first: calls are never held by delivered or cancelled
	// effects, but deleting those first keeps the ON DELETE SET NULL of
	// the calls' deletes from touching rows about to go anyway.
	var c PurgeCounts
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
		{"expired calls", countCalls, db.Pick(deleteCalls, deleteCallsPostgres),
			[]any{nowMS, completedBefore}, &c.Calls},
	}
	for _, s := range steps {
		if dryRun {
			if err := db.Read.QueryRowContext(ctx, s.count, s.args...).Scan(s.n); err != nil {
				return c, fmt.Errorf("count %s: %w", s.what, err)
			}
			continue
		}
		args := append(s.args, purgeBatch)
		for {
			n, err := purgeBatchOf(ctx, db, s.delete, args)
			*s.n += n
			if err != nil {
				return c, fmt.Errorf("purge %s: %w", s.what, err)
			}
			if n < purgeBatch {
				break
			}
		}
	}
	return c, nil
}

// purgeBatchOf runs one batch delete in its own transaction. A purge lost
// to a power failure only brings back rows the next purge deletes again,
// so it does not pay for an fsync of its own.
func purgeBatchOf(ctx context.Context, db *schema.DB, stmt string, args []any) (int64, error) {
	var n int64
	err := db.Relaxed(ctx, func(conn *sql.Conn) error {
		res, err := conn.ExecContext(ctx, stmt, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// RunReaper purges expired records (see [Purge]) at once and then every
// interval until ctx ends, then returns. Zero interval means
// DefaultReapInterval; nil logger discards. A failed pass is logged and
// tried again at the next interval: the data it would delete stays
// correct, only the file stays larger for a while.
func RunReaper(ctx context.Context, db *schema.DB, r Retention, interval time.Duration, logger *slog.Logger) error {
	return runReaper(ctx, db, r, interval, logger, time.Now)
}

// runReaper is RunReaper on the clock now: [Layer.Start] passes the
// layer's, so that records expire on the clock that wrote their expiry.
func runReaper(ctx context.Context, db *schema.DB, r Retention, interval time.Duration, logger *slog.Logger, now func() time.Time) error {
	if interval < 0 {
		return fmt.Errorf("reaper: negative interval %s", interval)
	}
	if interval == 0 {
		interval = DefaultReapInterval
	}
	if _, err := r.withDefaults(); err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	logger = logger.With("subsystem", "reaper")
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c, err := Purge(ctx, db, r, now(), false)
		switch {
		case err != nil && ctx.Err() != nil:
			// Cut short by shutdown: nothing to report.
		case err != nil:
			logger.WarnContext(ctx, "purge expired records", "error", err,
				"calls", c.Calls, "delivered_effects", c.DeliveredEffects, "cancelled_effects", c.CancelledEffects,
				"unknown_calls", c.UnknownCalls)
		case c.UnknownCalls > 0:
			logger.WarnContext(ctx, "abandoned forwarded calls are now unknown: an operator must settle them (mcp-outbox outbox calls)",
				"unknown_calls", c.UnknownCalls, "calls", c.Calls, "delivered_effects", c.DeliveredEffects,
				"cancelled_effects", c.CancelledEffects)
		case c.Calls+c.Effects() > 0:
			logger.InfoContext(ctx, "purged expired records",
				"calls", c.Calls, "delivered_effects", c.DeliveredEffects, "cancelled_effects", c.CancelledEffects)
		default:
			logger.DebugContext(ctx, "nothing to purge")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
