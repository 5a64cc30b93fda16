package opsquery

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Counts is the number of effects in each state.
type Counts struct {
	Pending   int `json:"pending"`
	InFlight  int `json:"in_flight"`
	Delivered int `json:"delivered"`
	Dead      int `json:"dead"`
	Unknown   int `json:"unknown"`
	Cancelled int `json:"cancelled"`
}

// Total is the number of effects counted.
func (c Counts) Total() int {
	return c.Pending + c.InFlight + c.Delivered + c.Dead + c.Unknown + c.Cancelled
}

// Open is the number of effects that still need delivery work.
func (c Counts) Open() int { return c.Pending + c.InFlight }

// CountEffects counts effects by state.
func CountEffects(ctx context.Context, db *schema.DB) (Counts, error) {
	rows, err := db.Read.QueryContext(ctx, `SELECT state, count(*) FROM effects GROUP BY state`)
	if err != nil {
		return Counts{}, fmt.Errorf("count effects: %w", err)
	}
	defer rows.Close()
	var c Counts
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return Counts{}, fmt.Errorf("count effects: %w", err)
		}
		c.set(state, n)
	}
	return c, rows.Err()
}

// Plus is the sum of c and o, state by state.
func (c Counts) Plus(o Counts) Counts {
	return Counts{Pending: c.Pending + o.Pending, InFlight: c.InFlight + o.InFlight, Delivered: c.Delivered + o.Delivered,
		Dead: c.Dead + o.Dead, Unknown: c.Unknown + o.Unknown, Cancelled: c.Cancelled + o.Cancelled}
}

// Of is the number of effects in state.
func (c Counts) Of(state string) int {
	if p := c.field(state); p != nil {
		return *p
	}
	return 0
}

// set records n effects in state.
func (c *Counts) set(state string, n int) {
	if p := c.field(state); p != nil {
		*p = n
	}
}

// field is the count of state; nil for a state that is not one.
func (c *Counts) field(state string) *int {
	switch state {
	case "pending":
		return &c.Pending
	case "in_flight":
		return &c.InFlight
	case "delivered":
		return &c.Delivered
	case "dead":
		return &c.Dead
	case "unknown":
		return &c.Unknown
	case "cancelled":
		return &c.Cancelled
	}
	return nil
}

// EffectRow is one effect as operators see it: the call-independent
// delivery state of Effect, with the effect's id, its call and its times.
type EffectRow struct {
	ID      int64  `json:"id"`
	CallKey string `json:"callKey,omitempty"`
	Tool    string `json:"tool,omitempty"`
	query.EffectStatus
	Response  string    `json:"response,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// EffectFilter selects effects; zero fields select everything.
type EffectFilter struct {
	State       string
	Destination string
	ID          int64
	Limit       int // zero means 100
}

const selectEffectRows = `
SELECT e.id, coalesce(c.key, ''), coalesce(c.tool, ''), e.seq, e.destination, e.method, e.path, e.idempotency_key,
       e.state, e.attempts, e.last_status, e.last_error, coalesce(e.response, ''), e.created_at, e.updated_at,
       e.next_attempt_at, e.delivered_at
FROM effects e LEFT JOIN calls c ON c.id = e.call_id
WHERE ($1 = '' OR e.state = $1) AND ($2 = '' OR e.destination = $2) AND ($3 = 0 OR e.id = $3)
ORDER BY e.id DESC
LIMIT $4`

// selectEffectRowsPostgres types its parameters: PostgreSQL takes the type
// of $3 from "$3 = 0", an integer of 32 bits, and an id past it would not
// bind.
const selectEffectRowsPostgres = `
SELECT e.id, coalesce(c.key, ''), coalesce(c.tool, ''), e.seq, e.destination, e.method, e.path, e.idempotency_key,
       e.state, e.attempts, e.last_status, e.last_error, coalesce(e.response, ''), e.created_at, e.updated_at,
       e.next_attempt_at, e.delivered_at
FROM effects e LEFT JOIN calls c ON c.id = e.call_id
WHERE ($1::text = '' OR e.state = $1::text) AND ($2::text = '' OR e.destination = $2::text) AND ($3::bigint = 0 OR e.id = $3::bigint)
ORDER BY e.id DESC
LIMIT $4`

// ListEffects returns effects, newest first.
func ListEffects(ctx context.Context, db *schema.DB, f EffectFilter) ([]EffectRow, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := db.Read.QueryContext(ctx, db.Pick(selectEffectRows, selectEffectRowsPostgres), f.State, f.Destination, f.ID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list effects: %w", err)
	}
	defer rows.Close()
	out := []EffectRow{}
	for rows.Next() {
		var (
			r                      EffectRow
			created, updated, next int64
			delivered              sql.NullInt64
		)
		if err := rows.Scan(&r.ID, &r.CallKey, &r.Tool, &r.Seq, &r.Destination, &r.Method, &r.Path, &r.IdempotencyKey,
			&r.State, &r.Attempts, &r.LastStatus, &r.LastError, &r.Response, &created, &updated, &next, &delivered); err != nil {
			return nil, fmt.Errorf("list effects: %w", err)
		}
		r.CreatedAt, r.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
		if r.State == "pending" || r.State == "unknown" {
			r.NextAttemptAt = ms(next)
		}
		if delivered.Valid {
			r.DeliveredAt = ms(delivered.Int64)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
