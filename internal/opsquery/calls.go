// Package opsquery holds the operator's reads of an outbox database: counts
// of effects by state and destination, listings of effects, stuck effects,
// unknown calls and recent calls, and the delivery history the page charts.
// The command line, the operator surface and the dispatcher's metrics read
// through it; a client's "what happened to my call?" is package query.
package opsquery

import (
	"context"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// UnknownCall is a call in state unknown: forwarded to a tool server whose
// work is outside the call's transaction, its outcome lost. It waits for an
// operator, who finds out whether it ran and settles it. Key is the raw
// idempotency key: whoever shows it decides how much of it to show.
type UnknownCall struct {
	Principal string    `json:"principal"`
	Key       string    `json:"key"`
	KeySource string    `json:"keySource"`
	Tool      string    `json:"tool"`
	CallID    string    `json:"callId"`
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"createdAt"`
}

const selectUnknownCalls = `
SELECT principal, key, key_source, tool, uid, attempts, created_at
FROM calls WHERE state = 'unknown'
ORDER BY created_at, id
LIMIT $1`

// ListUnknownCalls returns up to limit calls in state unknown, the oldest
// first: none of them changes without an operator.
func ListUnknownCalls(ctx context.Context, db *schema.DB, limit int) ([]UnknownCall, error) {
	rows, err := db.Read.QueryContext(ctx, selectUnknownCalls, limit)
	if err != nil {
		return nil, fmt.Errorf("list unknown calls: %w", err)
	}
	defer rows.Close()
	out := []UnknownCall{}
	for rows.Next() {
		var (
			c       UnknownCall
			created int64
		)
		if err := rows.Scan(&c.Principal, &c.Key, &c.KeySource, &c.Tool, &c.CallID, &c.Attempts, &created); err != nil {
			return nil, fmt.Errorf("list unknown calls: %w", err)
		}
		c.CreatedAt = time.UnixMilli(created).UTC()
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list unknown calls: %w", err)
	}
	return out, nil
}

// CountUnknownCalls is the number of calls in state unknown.
func CountUnknownCalls(ctx context.Context, db *schema.DB) (int, error) {
	var n int
	if err := db.Read.QueryRowContext(ctx, `SELECT count(*) FROM calls WHERE state = 'unknown'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count unknown calls: %w", err)
	}
	return n, nil
}

// ms is a time of the tables (Unix milliseconds), in UTC.
func ms(v int64) *time.Time {
	t := time.UnixMilli(v).UTC()
	return &t
}
