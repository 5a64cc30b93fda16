package outbox

import (
	"context"
	"database/sql"
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

// selectNextDue finds the next future due time of one destination and
// state: a range scan of the effects_due index, cheap however many effects
// wait.
const selectNextDue = `
SELECT min(next_attempt_at) FROM effects
WHERE destination = ?1 AND state = ?2 AND next_attempt_at > ?3`

const selectOpen = `
SELECT EXISTS (SELECT 1 FROM effects WHERE destination = ?1 AND state IN ('pending', 'in_flight'))`

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
	// Relaxed: a claim lost to a power failure puts the effect back to
	// pending, which it was; an at_most_once effect is only sent after
	// markSent's full commit, which makes its claim durable too.
	var out []*claimedEffect
	err := d.db.Relaxed(ctx, func(conn *sql.Conn) error {
		var err error
		out, err = d.claimOn(ctx, conn, dest, limit)
		return err
	})
	return out, err
}

func (d *Dispatcher) claimOn(ctx context.Context, conn *sql.Conn, dest string, limit int) ([]*claimedEffect, error) {
	now := d.now()
	rows, err := conn.QueryContext(ctx, claimEffects,
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
//
// Outcomes share commits: the first caller to find no commit under way
// writes its own outcome and every outcome that arrives meanwhile in one
// transaction, so deliveries finishing together cost one fsync, not one
// each. No goroutine is kept for it.
func (d *Dispatcher) record(ctx context.Context, e *claimedEffect, o outcome) (bool, error) {
	r := &pendingRecord{e: e, o: o, done: make(chan struct{})}
	d.recMu.Lock()
	d.recQueue = append(d.recQueue, r)
	if d.recLeader {
		d.recMu.Unlock()
		<-r.done
		return r.ok, r.err
	}
	d.recLeader = true
	d.recMu.Unlock()
	for {
		d.recMu.Lock()
		batch := d.recQueue
		d.recQueue = nil
		if len(batch) == 0 {
			d.recLeader = false
			d.recMu.Unlock()
			break
		}
		d.recMu.Unlock()
		d.writeOutcomes(ctx, batch)
	}
	<-r.done
	return r.ok, r.err
}

// pendingRecord is an outcome waiting for a shared commit.
type pendingRecord struct {
	e    *claimedEffect
	o    outcome
	ok   bool
	err  error
	done chan struct{}
}

func (d *Dispatcher) writeOutcomes(ctx context.Context, batch []*pendingRecord) {
	err := func() error {
		tx, err := d.db.Write.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		defer tx.Rollback()
		now := d.now().UnixMilli()
		for _, r := range batch {
			o := r.o
			var delivered, sent, resp any
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
			if o.response != nil {
				resp = string(o.response)
			}
			res, err := tx.ExecContext(ctx, recordEffectOutcome,
				o.state, o.status, o.err, resp, next, delivered, sent, now, r.e.id, d.owner)
			if err != nil {
				return fmt.Errorf("record outcome of %s: %w", r.e, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return fmt.Errorf("record outcome of %s: %w", r.e, err)
			}
			r.ok = n == 1
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit outcomes: %w", err)
		}
		d.opts.Metrics.commit(commitDeliveries, len(batch))
		return nil
	}()
	for _, r := range batch {
		if err != nil {
			r.ok, r.err = false, err
		}
		close(r.done)
	}
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
