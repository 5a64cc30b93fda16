package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Effects of one call are delivered in order: an effect is due only when
// every earlier effect of its call is delivered or cancelled. Effects
// without a call (unrecorded tools) have no order to keep.
const claimEffects = `
UPDATE effects SET state = 'in_flight', lease_owner = ?1, lease_until = ?2, attempts = attempts + 1, updated_at = ?3
WHERE id IN (
    SELECT e.id FROM effects e
    WHERE e.destination = ?4 AND e.state = 'pending' AND e.next_attempt_at <= ?3
      AND (e.call_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM effects p
          WHERE p.call_id = e.call_id AND p.seq < e.seq AND p.state NOT IN ('delivered', 'cancelled')))
    ORDER BY e.next_attempt_at, e.id
    LIMIT ?5)
RETURNING id, seq, method, path, headers, body, idempotency_key, attempts, created_at`

// reclaimExpired returns effects whose dispatcher stopped holding them
// (its lease passed, or its process is known to be gone) to pending. At an at_most_once destination,
// an effect whose request may have left becomes unknown instead: sending
// it again could apply it twice.
const reclaimExpired = `
UPDATE effects SET
    state = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_each(?2))
                 THEN 'unknown' ELSE 'pending' END,
    last_error = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_each(?2))
                 THEN 'delivery interrupted after the request was sent; the destination cannot dedup, so it is not re-sent'
                 ELSE 'delivery interrupted (dispatcher stopped or lost its lease); will retry with the same Idempotency-Key' END,
    lease_owner = '', lease_until = 0, updated_at = ?1,
    -- A probe waits its delay after the attempt that went unknown, as after
    -- a timeout: the destination may still be applying the request.
    next_attempt_at = CASE WHEN send_started_at IS NOT NULL AND destination IN (SELECT value FROM json_each(?2))
                      THEN ?1 + coalesce(json_extract(?5, '$."' || destination || '"'), 5000) ELSE ?1 END
WHERE state = 'in_flight' AND (lease_until <= ?1 OR lease_owner IN (SELECT value FROM json_each(?4)))
  AND destination IN (SELECT value FROM json_each(?3))`

const markSending = `
UPDATE effects SET send_started_at = ?1, updated_at = ?1
WHERE id = ?2 AND lease_owner = ?3 AND state = 'in_flight'`

const recordEffectOutcome = `
UPDATE effects SET state = ?1, last_status = ?2, last_error = ?3, response = ?4, next_attempt_at = ?5,
    delivered_at = ?6, lease_owner = '', lease_until = 0, send_started_at = ?7, updated_at = ?8
WHERE id = ?9 AND lease_owner = ?10 AND state = 'in_flight'`

const selectNextDue = `
SELECT min(next_attempt_at) FROM effects
WHERE (state = 'pending' AND destination IN (SELECT value FROM json_each(?1)))
   OR (state = 'unknown' AND destination IN (SELECT value FROM json_each(?2)))`

const selectLeaseOwners = `
SELECT DISTINCT lease_owner FROM effects
WHERE state = 'in_flight' AND lease_owner != ?1 AND destination IN (SELECT value FROM json_each(?2))`

// deadOwners lists the dispatchers holding leases whose process is gone
// (same host, pid no longer running that process): their effects need not
// wait for the lease to pass, so a restart after a crash resumes at once.
func (d *Dispatcher) deadOwners(ctx context.Context) (string, error) {
	rows, err := d.db.Read.QueryContext(ctx, selectLeaseOwners, d.owner, d.names)
	if err != nil {
		return "", fmt.Errorf("read lease owners: %w", err)
	}
	defer rows.Close()
	dead := []string{}
	for rows.Next() {
		var owner string
		if err := rows.Scan(&owner); err != nil {
			return "", fmt.Errorf("read lease owners: %w", err)
		}
		if d.self.ownerLiveness(owner) == ownerDead {
			dead = append(dead, owner)
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
	r, err := d.db.Write.ExecContext(ctx, reclaimExpired, now, d.amo, d.names, dead, d.probeDelays)
	if err != nil {
		return fmt.Errorf("reclaim expired leases: %w", err)
	}
	if n, _ := r.RowsAffected(); n > 0 {
		d.logger.InfoContext(ctx, "reclaimed effects with expired leases", "count", n)
	}
	return nil
}

func (d *Dispatcher) claim(ctx context.Context, dest string, limit int) ([]*claimedEffect, error) {
	now := d.now()
	rows, err := d.db.Write.QueryContext(ctx, claimEffects,
		d.owner, now.Add(d.opts.Lease).UnixMilli(), now.UnixMilli(), dest, limit)
	if err != nil {
		return nil, fmt.Errorf("claim effects: %w", err)
	}
	defer rows.Close()
	var out []*claimedEffect
	for rows.Next() {
		e := &claimedEffect{}
		var headers string
		if err := rows.Scan(&e.id, &e.seq, &e.method, &e.path, &headers, &e.body, &e.key,
			&e.attempts, &e.createdAt); err != nil {
			return nil, fmt.Errorf("claim effects: %w", err)
		}
		if err := json.Unmarshal([]byte(headers), &e.headers); err != nil {
			e.headers = nil // recorded by the layer as a JSON object; tolerate damage
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim effects: %w", err)
	}
	return out, nil
}

// outcome is the result of one attempt, as recorded.
type outcome struct {
	state     string // delivered, pending (retry), dead, unknown
	status    int
	err       string
	response  []byte
	next      time.Time
	delivered time.Time
	keepSent  bool // unknown keeps send_started_at: the request may have left
}

// record writes an attempt's outcome if this dispatcher still holds the
// lease. It reports false when the lease was lost: another dispatcher owns
// the effect now, and this attempt's outcome must not count.
func (d *Dispatcher) record(ctx context.Context, e *claimedEffect, o outcome) (bool, error) {
	now := d.now().UnixMilli()
	var delivered, sent any
	if !o.delivered.IsZero() {
		delivered = o.delivered.UnixMilli()
	}
	if o.keepSent {
		sent = now
	}
	next := now
	if !o.next.IsZero() {
		next = o.next.UnixMilli()
	}
	var resp any
	if o.response != nil {
		resp = string(o.response)
	}
	r, err := d.db.Write.ExecContext(ctx, recordEffectOutcome,
		o.state, o.status, o.err, resp, next, delivered, sent, now, e.id, d.owner)
	if err != nil {
		return false, fmt.Errorf("record outcome of %s: %w", e, err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("record outcome of %s: %w", e, err)
	}
	return n == 1, nil
}

// markSent records, before an at_most_once request is written, that it may
// have left; a crash after this point makes the effect unknown, not
// pending. It reports false when the lease was lost.
func (d *Dispatcher) markSent(ctx context.Context, e *claimedEffect) (bool, error) {
	r, err := d.db.Write.ExecContext(ctx, markSending, d.now().UnixMilli(), e.id, d.owner)
	if err != nil {
		return false, fmt.Errorf("mark %s sending: %w", e, err)
	}
	n, _ := r.RowsAffected()
	return n == 1, nil
}
