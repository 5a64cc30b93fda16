package operator

import (
	"context"
	"fmt"
	"slices"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// An effect enqueued for a destination that no dispatcher delivers to (a
// mistyped name, a destination dropped from the configuration) waits in
// state pending with no attempt and no error: nothing else would ever say
// so. The readiness check, the metrics and the page compare the pending
// effects' destinations with the process's dispatcher's set and name the
// ones it does not know. Only this process's set is known here: with
// replicas configured differently, each reports what it cannot deliver.

// unconfiguredDest is a destination with effects pending that the
// dispatcher does not deliver to.
type unconfiguredDest struct {
	Destination string
	Pending     int
}

// countPendingByDestination reads the pending effects per destination.
// It reads only the pending rows' entries of the effects_state index
// (state first), cheap enough for every readiness probe while the backlog
// is what a healthy outbox holds.
const countPendingByDestination = `
SELECT destination, COUNT(*) FROM effects WHERE state = 'pending' GROUP BY destination ORDER BY destination`

// findUnconfigured lists the destinations with pending effects that d
// does not know, by name. It returns nil without reading when d is nil or
// does not know its set yet.
func findUnconfigured(ctx context.Context, db *schema.DB, d Dispatcher) ([]unconfiguredDest, error) {
	if d == nil {
		return nil, nil
	}
	known := d.Destinations()
	if known == nil {
		return nil, nil
	}
	rows, err := db.Read.QueryContext(ctx, countPendingByDestination)
	if err != nil {
		return nil, fmt.Errorf("count pending effects: %w", err)
	}
	defer rows.Close()
	var out []unconfiguredDest
	for rows.Next() {
		var u unconfiguredDest
		if err := rows.Scan(&u.Destination, &u.Pending); err != nil {
			return nil, fmt.Errorf("count pending effects: %w", err)
		}
		if !slices.Contains(known, u.Destination) {
			out = append(out, u)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count pending effects: %w", err)
	}
	return out, nil
}
