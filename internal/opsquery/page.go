package opsquery

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Reads for the operator page: what an operator looks at first, bounded so
// that the page stays cheap however large the tables grow.

// DestinationCounts is the number of effects in each state at one destination.
type DestinationCounts struct {
	Destination string `json:"destination"`
	Counts
}

// CountEffectsByDestination counts effects by destination and state, the
// destinations in name order.
func CountEffectsByDestination(ctx context.Context, db *schema.DB) ([]DestinationCounts, error) {
	rows, err := db.Read.QueryContext(ctx, `SELECT destination, state, count(*) FROM effects GROUP BY destination, state ORDER BY destination`)
	if err != nil {
		return nil, fmt.Errorf("count effects by destination: %w", err)
	}
	defer rows.Close()
	var out []DestinationCounts
	for rows.Next() {
		var (
			dest, state string
			n           int
		)
		if err := rows.Scan(&dest, &state, &n); err != nil {
			return nil, fmt.Errorf("count effects by destination: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].Destination != dest {
			out = append(out, DestinationCounts{Destination: dest})
		}
		out[len(out)-1].Counts.set(state, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count effects by destination: %w", err)
	}
	return out, nil
}

// StuckEffect is a dead or unknown effect with the principal of its call,
// which the call's key is scoped by.
type StuckEffect struct {
	EffectRow
	Principal string `json:"principal,omitempty"`
}

const selectStuckEffects = `
SELECT e.id, coalesce(c.principal, ''), coalesce(c.key, ''), coalesce(c.tool, ''), e.seq, e.destination, e.method,
       e.path, e.state, e.attempts, e.last_status, e.last_error, e.created_at, e.updated_at
FROM effects e LEFT JOIN calls c ON c.id = e.call_id
WHERE e.state IN ('dead', 'unknown')
ORDER BY e.updated_at DESC, e.id DESC
LIMIT $1`

// ListStuckEffects returns up to limit dead and unknown effects, the most
// recently stuck first: neither state changes without an operator. The
// rows carry no response or Idempotency-Key; ListEffects has them.
func ListStuckEffects(ctx context.Context, db *schema.DB, limit int) ([]StuckEffect, error) {
	rows, err := db.Read.QueryContext(ctx, selectStuckEffects, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead and unknown effects: %w", err)
	}
	defer rows.Close()
	out := []StuckEffect{}
	for rows.Next() {
		var (
			e                StuckEffect
			created, updated int64
		)
		if err := rows.Scan(&e.ID, &e.Principal, &e.CallKey, &e.Tool, &e.Seq, &e.Destination, &e.Method, &e.Path,
			&e.State, &e.Attempts, &e.LastStatus, &e.LastError, &created, &updated); err != nil {
			return nil, fmt.Errorf("list dead and unknown effects: %w", err)
		}
		e.CreatedAt, e.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead and unknown effects: %w", err)
	}
	return out, nil
}

// CallRow is one row of the calls table as operators see it. Key is the
// raw idempotency key: whoever shows it decides how much of it to show.
type CallRow struct {
	ID          int64       `json:"id"`
	Principal   string      `json:"principal"`
	Key         string      `json:"key"`
	KeySource   string      `json:"keySource"`
	Tool        string      `json:"tool"`
	State       query.State `json:"state"`
	Attempts    int         `json:"attempts"`
	Effects     int         `json:"effects"`
	Delivered   int         `json:"delivered"`
	CreatedAt   time.Time   `json:"createdAt"`
	CompletedAt *time.Time  `json:"completedAt,omitempty"`
}

const selectRecentCalls = `
SELECT c.id, c.principal, c.key, c.key_source, c.tool, c.state, c.attempts, c.created_at, c.completed_at,
       (SELECT count(*) FROM effects e WHERE e.call_id = c.id),
       (SELECT count(*) FROM effects e WHERE e.call_id = c.id AND e.state = 'delivered')
FROM calls c
ORDER BY c.id DESC
LIMIT $1`

// RecentCalls returns the newest limit calls, with how many effects each
// enqueued and how many of them are delivered.
func RecentCalls(ctx context.Context, db *schema.DB, limit int) ([]CallRow, error) {
	rows, err := db.Read.QueryContext(ctx, selectRecentCalls, limit)
	if err != nil {
		return nil, fmt.Errorf("list recent calls: %w", err)
	}
	defer rows.Close()
	out := []CallRow{}
	for rows.Next() {
		var (
			c         CallRow
			state     string
			created   int64
			completed sql.NullInt64
		)
		if err := rows.Scan(&c.ID, &c.Principal, &c.Key, &c.KeySource, &c.Tool, &state, &c.Attempts, &created, &completed,
			&c.Effects, &c.Delivered); err != nil {
			return nil, fmt.Errorf("list recent calls: %w", err)
		}
		c.State, c.CreatedAt = query.State(state), time.UnixMilli(created).UTC()
		if completed.Valid {
			c.CompletedAt = ms(completed.Int64)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list recent calls: %w", err)
	}
	return out, nil
}

// EffectIDs maps the positions of the effects of the call named uid (its
// Status.CallID) to their ids, which the operator actions take.
func EffectIDs(ctx context.Context, db *schema.DB, uid string) (map[int]int64, error) {
	rows, err := db.Read.QueryContext(ctx, `SELECT e.seq, e.id FROM effects e JOIN calls c ON c.id = e.call_id WHERE c.uid = $1`, uid)
	if err != nil {
		return nil, fmt.Errorf("effect ids of call %s: %w", uid, err)
	}
	defer rows.Close()
	out := map[int]int64{}
	for rows.Next() {
		var (
			seq int
			id  int64
		)
		if err := rows.Scan(&seq, &id); err != nil {
			return nil, fmt.Errorf("effect ids of call %s: %w", uid, err)
		}
		out[seq] = id
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("effect ids of call %s: %w", uid, err)
	}
	return out, nil
}

// Bucket is the activity of one interval of a DeliveryHistory.
type Bucket struct {
	Start     time.Time `json:"start"`
	Delivered int       `json:"delivered"`
	// Failed counts the effects that are dead or unknown now and became so
	// in this interval. An effect retried since then no longer counts: the
	// effects table keeps only the last state, not the history of attempts.
	Failed int `json:"failed"`
}

// selectDeliveredBuckets names effects_delivered: without statistics
// SQLite prefers the equality on effects_state and reads every delivered
// effect the retention keeps (250 ms per million here, against 2 ms).
const (
	selectDeliveredBuckets = `
SELECT (delivered_at - $1) / $2, count(*) FROM effects INDEXED BY effects_delivered
WHERE state = 'delivered' AND delivered_at >= $1 AND delivered_at < $3
GROUP BY 1`
	// PostgreSQL has no INDEXED BY and finds the partial index by itself.
	selectDeliveredBucketsPostgres = `
SELECT (delivered_at - $1) / $2, count(*) FROM effects
WHERE state = 'delivered' AND delivered_at >= $1 AND delivered_at < $3
GROUP BY 1`
	selectFailedBuckets = `
SELECT (updated_at - $1) / $2, count(*) FROM effects
WHERE state IN ('dead', 'unknown') AND updated_at >= $1 AND updated_at < $3
GROUP BY 1`
)

// DeliveryHistory counts deliveries and failures in n consecutive buckets
// of width step, the last one ending at end, oldest first.
func DeliveryHistory(ctx context.Context, db *schema.DB, end time.Time, step time.Duration, n int) ([]Bucket, error) {
	if n < 1 || step < time.Millisecond {
		return nil, fmt.Errorf("delivery history: want at least one bucket of at least 1ms, got %d of %s", n, step)
	}
	stepMS := step.Milliseconds()
	endMS := end.UnixMilli()
	startMS := endMS - int64(n)*stepMS
	out := make([]Bucket, n)
	for i := range out {
		out[i].Start = time.UnixMilli(startMS + int64(i)*stepMS).UTC()
	}
	for _, q := range []struct {
		stmt  string
		count func(b *Bucket, n int)
	}{
		{db.Pick(selectDeliveredBuckets, selectDeliveredBucketsPostgres), func(b *Bucket, n int) { b.Delivered = n }},
		{selectFailedBuckets, func(b *Bucket, n int) { b.Failed = n }},
	} {
		if err := countBuckets(ctx, db, q.stmt, startMS, stepMS, endMS, func(i, c int) { q.count(&out[i], c) }, n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func countBuckets(ctx context.Context, db *schema.DB, stmt string, startMS, stepMS, endMS int64, set func(i, n int), buckets int) error {
	rows, err := db.Read.QueryContext(ctx, stmt, startMS, stepMS, endMS)
	if err != nil {
		return fmt.Errorf("delivery history: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var i, n int
		if err := rows.Scan(&i, &n); err != nil {
			return fmt.Errorf("delivery history: %w", err)
		}
		if i >= 0 && i < buckets {
			set(i, n)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("delivery history: %w", err)
	}
	return nil
}
