package outbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// unknownProbeDelay is how long after an attempt went unknown the first probe
// waits: a destination may still be applying a request that timed out, and
// a probe that answers "never got it" too early would cause a second copy.
func (ds *destState) unknownProbeDelay() time.Duration { return max(2*ds.Timeout, 5*time.Second) }

const selectUnknownDue = `
SELECT id, idempotency_key FROM effects
WHERE destination = $1 AND state = 'unknown' AND next_attempt_at <= $2
ORDER BY next_attempt_at LIMIT $3`

const resolveUnknown = `
UPDATE effects SET state = $1, delivered_at = $2, last_status = $3, response = $4, last_error = $5,
    send_started_at = NULL, next_attempt_at = $6, updated_at = $6
WHERE id = $7 AND state = 'unknown'`

const deferProbe = `
UPDATE effects SET last_error = $1, next_attempt_at = $2, updated_at = $3 WHERE id = $4 AND state = 'unknown'`

// probeUnknown asks an at_most_once destination about its unknown effects:
// 2xx resolves them as delivered, 404 or 410 sends them again, anything
// else leaves them unknown and asks later.
func (d *Dispatcher) probeUnknown(ctx context.Context, ds *destState) error {
	if ds.Probe == nil {
		return nil
	}
	now := d.now()
	rows, err := d.db.Read.QueryContext(ctx, selectUnknownDue, ds.Name, now.UnixMilli(), cap(ds.slots))
	if err != nil {
		return fmt.Errorf("select unknown effects: %w", err)
	}
	type pending struct {
		id  int64
		key string
	}
	var due []pending
	for rows.Next() {
		var p pending
		if err := rows.Scan(&p.id, &p.key); err != nil {
			rows.Close()
			return fmt.Errorf("select unknown effects: %w", err)
		}
		due = append(due, p)
	}
	rows.Close()
	for _, p := range due {
		if err := d.probeOne(ctx, ds, p.id, p.key); err != nil {
			return err
		}
	}
	return nil
}

func (d *Dispatcher) probeOne(ctx context.Context, ds *destState, id int64, key string) error {
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
	req.Header.Set(HeaderIdempotencyKey, FormatIdempotencyKey(key))
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
	}
	switch {
	case err == nil && status >= 200 && status < 300:
		_, err = d.db.Write.ExecContext(ctx, resolveUnknown, "delivered", now.UnixMilli(), status, string(body),
			"resolved by probe: the destination has it", now.UnixMilli(), id)
	case err == nil && (status == http.StatusNotFound || status == http.StatusGone):
		_, err = d.db.Write.ExecContext(ctx, resolveUnknown, "pending", nil, status, string(body),
			"resolved by probe: the destination never got it; sending again", now.UnixMilli(), id)
		d.Notify()
	default:
		msg := fmt.Sprintf("probe answered HTTP %d; still unknown", status)
		if err != nil {
			msg = "probe failed: " + describeTransportError(err, false) + "; still unknown"
		}
		_, err = d.db.Write.ExecContext(ctx, deferProbe, msg, now.Add(ds.unknownProbeDelay()).UnixMilli(), now.UnixMilli(), id)
	}
	if err != nil {
		return fmt.Errorf("record probe of effect %d: %w", id, err)
	}
	return nil
}
