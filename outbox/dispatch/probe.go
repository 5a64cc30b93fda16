package dispatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// unknownProbeDelay is how long after an attempt went unknown the first probe
// waits: a destination may still be applying a request that timed out, and
// a probe that answers "never got it" too early would cause a second copy.
func (ds *destState) unknownProbeDelay() time.Duration { return max(2*ds.Timeout, 5*time.Second) }

// takeUnknownDue takes the unknown effects whose probe is due: it moves
// their next_attempt_at to $3, when a probe lost with its dispatcher would
// be due again, so that no other dispatcher (another replica, another
// process on the file) probes them meanwhile. The probe's answer is then
// written only to the effect as it was taken (see resolveUnknown).
const (
	takeUnknownDue = `
UPDATE effects SET next_attempt_at = $3
WHERE id IN (
    SELECT id FROM effects
    WHERE destination = $1 AND state = 'unknown' AND next_attempt_at <= $2
    ORDER BY next_attempt_at LIMIT $4)
RETURNING id, idempotency_key, attempts`
	// On PostgreSQL the replicas' probes skip each other's rows, and the
	// outer condition is checked again on a row changed since the
	// statement's snapshot.
	takeUnknownDuePostgres = `
UPDATE effects SET next_attempt_at = $3
WHERE id IN (
    SELECT id FROM effects
    WHERE destination = $1 AND state = 'unknown' AND next_attempt_at <= $2
    ORDER BY next_attempt_at LIMIT $4
    FOR UPDATE SKIP LOCKED)
  AND state = 'unknown' AND next_attempt_at <= $2
RETURNING id, idempotency_key, attempts`
)

// resolveUnknown and deferProbe write a probe's answer only to the effect
// the probe took: still unknown, with the attempts and the due time it was
// taken with. An effect that was resolved by an operator meanwhile, or
// sent again and gone unknown again (attempts counts every claim), is
// another question, which this answer does not settle: a "never got it"
// about the first request must not send the second one again.
const resolveUnknown = `
UPDATE effects SET state = $1, delivered_at = $2, last_status = $3, response = $4, last_error = $5,
    send_started_at = NULL, next_attempt_at = $6, updated_at = $6
WHERE id = $7 AND state = 'unknown' AND attempts = $8 AND next_attempt_at = $9`

const deferProbe = `
UPDATE effects SET last_error = $1, next_attempt_at = $2, updated_at = $3
WHERE id = $4 AND state = 'unknown' AND attempts = $5 AND next_attempt_at = $6`

// probeUnknown asks an at_most_once destination about its unknown effects:
// 2xx resolves them as delivered, 404 or 410 sends them again, anything
// else leaves them unknown and asks later.
func (d *Dispatcher) probeUnknown(ctx context.Context, ds *destState) error {
	if ds.Probe == nil {
		return nil
	}
	now := d.now()
	taken := now.Add(ds.unknownProbeDelay()).UnixMilli()
	rows, err := d.db.Write.QueryContext(ctx, d.db.Pick(takeUnknownDue, takeUnknownDuePostgres),
		ds.Name, now.UnixMilli(), taken, cap(ds.slots))
	if err != nil {
		return fmt.Errorf("take unknown effects: %w", err)
	}
	var due []probed
	for rows.Next() {
		p := probed{taken: taken}
		if err := rows.Scan(&p.id, &p.key, &p.attempts); err != nil {
			rows.Close()
			return fmt.Errorf("take unknown effects: %w", err)
		}
		due = append(due, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("take unknown effects: %w", err)
	}
	for _, p := range due {
		if err := d.probeOne(ctx, ds, p); err != nil {
			return err
		}
	}
	return nil
}

// probed is an unknown effect taken for a probe.
type probed struct {
	id       int64
	key      string
	attempts int
	taken    int64 // the next_attempt_at it was taken with
}

func (d *Dispatcher) probeOne(ctx context.Context, ds *destState, p probed) error {
	id, key := p.id, p.key
	target, err := probeURL(ds, key)
	if err != nil {
		return err
	}
	method := ds.Probe.Method
	if method == "" {
		method = http.MethodGet
	}
	pctx, cancel := context.WithTimeout(ctx, ds.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, method, target, nil)
	if err != nil {
		return fmt.Errorf("build probe: %w", err)
	}
	req.Header.Set(callkey.Header, ds.KeyForm.headerValue(key))
	if ds.AuthHeader != "" {
		req.Header.Set(ds.AuthHeader, ds.AuthValue)
	}
	now := d.now()
	resp, err := ds.client.Do(req)
	var (
		status int
		body   []byte
	)
	if err == nil {
		status = resp.StatusCode
		body, _ = io.ReadAll(io.LimitReader(resp.Body, int64(d.opts.ResponseLimit)))
		resp.Body.Close()
		if d.sealer != nil {
			body = nil // not kept with encryption on: it may echo the effect
		}
	}
	switch {
	case err == nil && status >= 200 && status < 300:
		_, err = d.db.Write.ExecContext(ctx, resolveUnknown, "delivered", now.UnixMilli(), status, string(body),
			"resolved by probe: the destination has it", now.UnixMilli(), id, p.attempts, p.taken)
	case err == nil && (status == http.StatusNotFound || status == http.StatusGone):
		_, err = d.db.Write.ExecContext(ctx, resolveUnknown, "pending", nil, status, string(body),
			"resolved by probe: the destination never got it; sending again", now.UnixMilli(), id, p.attempts, p.taken)
		d.Notify()
	default:
		msg := fmt.Sprintf("probe answered HTTP %d; still unknown", status)
		if err != nil {
			msg = "probe failed: " + describeTransportError(err, false) + "; still unknown"
		}
		_, err = d.db.Write.ExecContext(ctx, deferProbe, msg, now.Add(ds.unknownProbeDelay()).UnixMilli(), now.UnixMilli(),
			id, p.attempts, p.taken)
	}
	if err != nil {
		return fmt.Errorf("record probe of effect %d: %w", id, err)
	}
	return nil
}
