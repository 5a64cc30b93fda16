package dispatch

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/owner"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Effects of one call are delivered in order: an effect is due only when
// every earlier effect of its call is delivered or cancelled. Effects
// without a call (unrecorded tools) have no order to keep.
//
// "LIMIT $5 + 0", not "LIMIT $5": SQLite plans with the value bound to a
// plain LIMIT parameter, so binding another one expires the prepared
// statement and the next run compiles it again, which doubled the cost of
// a claim. An expression is evaluated at run time instead.
const claimEffects = `
UPDATE effects SET state = 'in_flight', lease_owner = $1, lease_until = $2, attempts = attempts + 1, updated_at = $3
WHERE id IN (
    SELECT e.id FROM effects e
    WHERE e.destination = $4 AND e.state = 'pending' AND e.next_attempt_at <= $3
      AND (e.call_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM effects p
          WHERE p.call_id = e.call_id AND p.seq < e.seq AND p.state NOT IN ('delivered', 'cancelled')))
    ORDER BY e.next_attempt_at, e.id
    LIMIT $5 + 0)
RETURNING id, seq, method, path, headers, body, idempotency_key, attempts, created_at, traceparent`

// claimEffectsPostgres is claimEffects for replicas sharing the table.
// FOR UPDATE SKIP LOCKED leases each due effect to one dispatcher: a row
// another replica's claim (or an operator, or a purge) has locked is
// skipped, not waited for, and a row changed since the statement's snapshot
// is re-read and checked again before it is locked, so two claims never
// return the same effect. The outer "state = 'pending'" says so once more
// for the reader. Per-call order holds across replicas as it does on
// SQLite: an effect is due only when every earlier effect of its call is
// committed as delivered or cancelled, and no state leads back from those,
// so no replica can see effect n+1 due while n is pending or in flight
// anywhere. UPDATE ... RETURNING does not keep the subquery's order; the
// outer SELECT restores it, so that the queue is in claim order.
const claimEffectsPostgres = `
WITH claimed AS (
    UPDATE effects SET state = 'in_flight', lease_owner = $1, lease_until = $2, attempts = attempts + 1, updated_at = $3
    WHERE id IN (
        SELECT e.id FROM effects e
        WHERE e.destination = $4 AND e.state = 'pending' AND e.next_attempt_at <= $3
          AND (e.call_id IS NULL OR NOT EXISTS (
              SELECT 1 FROM effects p
              WHERE p.call_id = e.call_id AND p.seq < e.seq AND p.state NOT IN ('delivered', 'cancelled')))
        ORDER BY e.next_attempt_at, e.id
        LIMIT $5
        FOR UPDATE OF e SKIP LOCKED)
      AND state = 'pending'
    RETURNING id, seq, method, path, headers, body, idempotency_key, attempts, created_at, traceparent, next_attempt_at)
SELECT id, seq, method, path, headers, body, idempotency_key, attempts, created_at, traceparent
FROM claimed ORDER BY next_attempt_at, id`

// reclaimExpired returns effects whose dispatcher stopped holding them
// (its lease passed, or its process is known to be gone) to pending. At an at_most_once destination,
// an effect whose request may have left becomes unknown instead: sending
// it again could apply it twice.
const reclaimExpired = `
UPDATE effects SET
    state = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_each($2))
                 THEN 'unknown' ELSE 'pending' END,
    last_error = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_each($2))
                 THEN 'delivery interrupted after the request was sent; the destination cannot dedup, so it is not re-sent'
                 ELSE 'delivery interrupted (dispatcher stopped or lost its lease); will retry with the same Idempotency-Key' END,
    lease_owner = '', lease_until = 0, updated_at = $1,
    -- A probe waits its delay after the attempt that went unknown, as after
    -- a timeout: the destination may still be applying the request.
    next_attempt_at = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_each($2))
                      THEN $1 + coalesce(json_extract($5, '$."' || destination || '"'), 5000) ELSE $1 END
WHERE state = 'in_flight' AND (lease_until <= $1 OR lease_owner IN (SELECT value FROM json_each($4)))
  AND destination IN (SELECT value FROM json_each($3))
  AND NOT (lease_owner = $6 AND id IN (SELECT value FROM json_each($7)))`

// reclaimExpiredPostgres is reclaimExpired in PostgreSQL's terms. Every
// replica runs it, at once if it happens so; that is safe without a lock
// between them, because the statement picks its rows by their own columns
// (no list of ids read before): an UPDATE that waited for another
// transaction's row lock checks its WHERE again on the row as that
// transaction left it (READ COMMITTED), so an effect another replica has
// just reclaimed, claimed or recorded is no longer in_flight with a passed
// lease and is left alone. An advisory lock would only save the duplicate
// scan, at the price of one more moving part. $4, the owners known dead,
// is always '[]' on PostgreSQL (see deadOwners).
const reclaimExpiredPostgres = `
UPDATE effects SET
    state = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_array_elements_text($2::json))
                 THEN 'unknown' ELSE 'pending' END,
    last_error = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_array_elements_text($2::json))
                 THEN 'delivery interrupted after the request was sent; the destination cannot dedup, so it is not re-sent'
                 ELSE 'delivery interrupted (dispatcher stopped or lost its lease); will retry with the same Idempotency-Key' END,
    lease_owner = '', lease_until = 0, updated_at = $1::bigint,
    next_attempt_at = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_array_elements_text($2::json))
                      THEN $1::bigint + coalesce(($5::json ->> destination)::bigint, 5000) ELSE $1::bigint END
WHERE state = 'in_flight' AND (lease_until <= $1::bigint OR lease_owner IN (SELECT value FROM json_array_elements_text($4::json)))
  AND destination IN (SELECT value FROM json_array_elements_text($3::json))
  AND NOT (lease_owner = $6 AND id IN (SELECT value::bigint FROM json_array_elements_text($7::json)))`

// releaseClaimed undoes claims of effects never attempted (see release).
const (
	releaseClaimed = `
UPDATE effects SET state = 'pending', lease_owner = '', lease_until = 0, attempts = attempts - 1, updated_at = $1
WHERE id IN (SELECT value FROM json_each($2)) AND lease_owner = $3 AND state = 'in_flight'`
	releaseClaimedPostgres = `
UPDATE effects SET state = 'pending', lease_owner = '', lease_until = 0, attempts = attempts - 1, updated_at = $1
WHERE id IN (SELECT value::bigint FROM json_array_elements_text($2::json)) AND lease_owner = $3 AND state = 'in_flight'`
)

const markSending = `
UPDATE effects SET send_started_at = $1, updated_at = $1
WHERE id = $2 AND lease_owner = $3 AND state = 'in_flight'`

const recordEffectOutcome = `
UPDATE effects SET state = $1, last_status = $2, last_error = $3, response = $4, next_attempt_at = $5,
    delivered_at = $6, lease_owner = '', lease_until = 0, send_started_at = $7, updated_at = $8
WHERE id = $9 AND lease_owner = $10 AND state = 'in_flight'`

// dispatchStmts are the writes of the delivery path, prepared once on the
// writer connection and reused: parsing the claim statement cost more than
// running it, and was the largest item of a delivery's CPU profile.
type dispatchStmts struct {
	claim, record, markSent, release *sql.Stmt // on the writer
	nextDue, open                    *sql.Stmt // on the read pool
}

// statements returns the prepared statements, preparing them on first use.
// Rounds run one at a time, and the delivery goroutines only start after
// the round that prepared them.
//
// On PostgreSQL Write is a pool: database/sql prepares a statement again
// on each connection it runs on (tx.StmtContext on the transaction's), so
// the same *sql.Stmt serves every connection.
func (d *Dispatcher) statements(ctx context.Context) (*dispatchStmts, error) {
	if st := d.stmts.Load(); st != nil {
		return st, nil
	}
	st := &dispatchStmts{}
	for _, p := range []struct {
		to    **sql.Stmt
		db    *sql.DB
		query string
	}{
		{&st.claim, d.db.Write, d.db.Pick(claimEffects, claimEffectsPostgres)},
		{&st.record, d.db.Write, recordEffectOutcome},
		{&st.markSent, d.db.Write, markSending},
		{&st.release, d.db.Write, d.db.Pick(releaseClaimed, releaseClaimedPostgres)},
		{&st.nextDue, d.db.Read, selectNextDue},
		{&st.open, d.db.Read, selectOpen},
	} {
		s, err := p.db.PrepareContext(ctx, p.query)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("prepare dispatch statements: %w", err)
		}
		*p.to = s
	}
	d.stmts.Store(st)
	return st, nil
}

// closeStatements frees the prepared statements once nothing uses them: at
// the end of Run or Drain, after every attempt finished.
func (d *Dispatcher) closeStatements() {
	if st := d.stmts.Swap(nil); st != nil {
		st.close()
	}
}

func (st *dispatchStmts) close() {
	for _, s := range []*sql.Stmt{st.claim, st.record, st.markSent, st.release, st.nextDue, st.open} {
		if s != nil {
			s.Close()
		}
	}
}

// selectNextDue finds the next future due time of one destination and
// state: a range scan of the effects_due index, cheap however many effects
// wait.
const selectNextDue = `
SELECT min(next_attempt_at) FROM effects
WHERE destination = $1 AND state = $2 AND next_attempt_at > $3`

const selectOpen = `
SELECT EXISTS (SELECT 1 FROM effects WHERE destination = $1 AND state IN ('pending', 'in_flight'))`

const selectLeaseOwners = `
SELECT DISTINCT lease_owner FROM effects
WHERE state = 'in_flight' AND lease_owner != $1 AND destination IN (SELECT value FROM json_each($2))`

// deadOwners lists the dispatchers holding leases whose process is gone
// (same host, pid no longer running that process): their effects need not
// wait for the lease to pass, so a restart after a crash resumes at once.
//
// On PostgreSQL it lists none: the replicas sharing the table run on other
// machines, or in containers that may share a host name and a pid
// namespace's numbers with this one, where /proc answers about another
// process. Only the lease tells there, so a lease is only ever reclaimed
// once it has passed.
func (d *Dispatcher) deadOwners(ctx context.Context) (string, error) {
	if d.db.Dialect == schema.Postgres {
		return "[]", nil
	}
	rows, err := d.db.Read.QueryContext(ctx, selectLeaseOwners, d.owner, d.names)
	if err != nil {
		return "", fmt.Errorf("read lease owners: %w", err)
	}
	defer rows.Close()
	dead := []string{}
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			return "", fmt.Errorf("read lease owners: %w", err)
		}
		if d.self.Of(o) == owner.Dead {
			dead = append(dead, o)
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("read lease owners: %w", err)
	}
	b, _ := json.Marshal(dead)
	return string(b), nil
}

func (d *Dispatcher) reclaim(ctx context.Context) error {
	dead, err := d.deadOwners(ctx)
	if err != nil {
		return err
	}
	now := d.now().UnixMilli()
	r, err := d.db.Write.ExecContext(ctx, d.db.Pick(reclaimExpired, reclaimExpiredPostgres), now, d.amo, d.names, dead, d.probeDelays,
		d.owner, d.heldIDs())
	if err != nil {
		return fmt.Errorf("reclaim expired leases: %w", err)
	}
	if n, _ := r.RowsAffected(); n > 0 {
		d.logger.InfoContext(ctx, "reclaimed effects with expired leases", "count", n)
	}
	return nil
}

// heldIDs lists, as a JSON array, the effects this dispatcher holds right
// now: queued, or attempted with the outcome not yet written. Their leases
// are this very process's, and it knows they are alive, so reclaim leaves
// them alone even when they look expired: a lease can only look expired
// to its own holder when this process's clock jumped forward (or stood
// still, paused, for longer than the lease, and then any other dispatcher
// whose clock is right has reclaimed the effect already). Reclaiming one
// would send it again while its first attempt is still in flight. An
// attempt that outlives its lease because the destination is slow is
// bounded by the destination's Timeout, which the default lease is twice.
func (d *Dispatcher) heldIDs() string {
	ids := []int64{}
	d.sending.Range(func(k, _ any) bool {
		ids = append(ids, k.(int64))
		return true
	})
	for _, ds := range d.dests {
		ds.mu.Lock()
		for _, e := range ds.queue {
			ids = append(ids, e.id)
		}
		ds.mu.Unlock()
	}
	b, _ := json.Marshal(ids)
	return string(b)
}

// claim leases up to limit due effects of dest in one statement.
func (d *Dispatcher) claim(ctx context.Context, st *dispatchStmts, dest string, limit int) ([]*claimedEffect, error) {
	// Relaxed: a claim lost to a power failure puts the effect back to
	// pending, which it was; an at_most_once effect is only sent after
	// markSent's full commit, which makes its claim durable too.
	var out []*claimedEffect
	err := d.db.Relaxed(ctx, func(conn *sql.Conn) error {
		// A transaction only to reach the statement prepared on this very
		// connection: a *sql.Conn cannot run a *sql.Stmt otherwise.
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("claim effects: begin: %w", err)
		}
		defer tx.Rollback()
		if out, err = d.claimIn(ctx, tx.StmtContext(ctx, st.claim), dest, limit); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("claim effects: commit: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (d *Dispatcher) claimIn(ctx context.Context, stmt *sql.Stmt, dest string, limit int) ([]*claimedEffect, error) {
	now := d.now()
	leaseUntil := now.Add(d.opts.Lease)
	rows, err := stmt.QueryContext(ctx, d.owner, leaseUntil.UnixMilli(), now.UnixMilli(), dest, limit)
	if err != nil {
		return nil, fmt.Errorf("claim effects: %w", err)
	}
	defer rows.Close()
	var out []*claimedEffect
	for rows.Next() {
		e := &claimedEffect{leaseUntil: leaseUntil}
		var headers string
		if err := rows.Scan(&e.id, &e.seq, &e.method, &e.path, &headers, &e.body, &e.key,
			&e.attempts, &e.createdAt, &e.traceparent); err != nil {
			return nil, fmt.Errorf("claim effects: %w", err)
		}
		e.rawHeaders = headers
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim effects: %w", err)
	}
	rows.Close()
	b := d.sealer.Batch()
	for _, e := range out {
		d.openEffect(ctx, b, e)
	}
	return out, nil
}

// release gives back claimed effects that were never attempted: pending
// again, at once, and the claim not counted as an attempt.
func (d *Dispatcher) release(ctx context.Context, st *dispatchStmts, effects []*claimedEffect) error {
	if len(effects) == 0 {
		return nil
	}
	ids := make([]int64, len(effects))
	for i, e := range effects {
		ids[i] = e.id
	}
	b, _ := json.Marshal(ids)
	if _, err := st.release.ExecContext(ctx, d.now().UnixMilli(), string(b), d.owner); err != nil {
		return fmt.Errorf("release %d claimed effects: %w", len(effects), err)
	}
	return nil
}

// markSent records, before an at_most_once request is written, that it may
// have left; a crash after this point makes the effect unknown, not
// pending. It reports false when the lease was lost.
func (d *Dispatcher) markSent(ctx context.Context, e *claimedEffect) (bool, error) {
	r, err := d.stmts.Load().markSent.ExecContext(ctx, d.now().UnixMilli(), e.id, d.owner)
	if err != nil {
		return false, fmt.Errorf("mark %s sending: %w", e, err)
	}
	n, _ := r.RowsAffected()
	return n == 1, nil
}

// openEffect opens a claimed effect's sealed headers and body. The
// principal is not known here: the data key's own counts, and the
// Idempotency-Key in the associated data still binds each value to its row.
//
// The claim's effects share a Batch: their data keys are read once each,
// not once per value.
func (d *Dispatcher) openEffect(ctx context.Context, b *sealing.Batch, e *claimedEffect) {
	headers, err := b.Open(ctx, d.db.Read, sealing.Ref{Row: e.key, Column: "headers"}, []byte(e.rawHeaders))
	if err == nil {
		e.body, err = b.Open(ctx, d.db.Read, sealing.Ref{Row: e.key, Column: "body"}, e.body)
	}
	if err != nil {
		e.unreadable = err
		e.body = nil
		return
	}
	if err := json.Unmarshal(headers, &e.headers); err != nil {
		e.headers = nil // recorded by the layer as a JSON object; tolerate damage
	}
}
