package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// effectStates are the states the depth gauge reports, zero included, so a
// state that empties reads 0 instead of vanishing from the scrape.
var effectStates = []string{"pending", "in_flight", "delivered", "dead", "unknown", "cancelled"}

// depthCollector reads the outbox's depth from the database at each scrape:
// every process sharing the file sees the same numbers, and effects written
// or resolved by another process (an operator's CLI, a second server) count.
type depthCollector struct {
	db                            *schema.DB
	now                           func() time.Time
	effects, oldest, unknownCalls *prometheus.Desc
}

// NewDepthCollector returns a collector of the effects in db by state and
// destination (mcp_outbox_effects), of the age of each destination's
// oldest effect still awaiting delivery, pending or in flight
// (mcp_outbox_oldest_pending_age_seconds), and of the calls in state
// unknown, which wait for an operator (mcp_outbox_calls_unknown). It
// queries db on every scrape.
func NewDepthCollector(db *schema.DB) prometheus.Collector {
	return &depthCollector{
		db:  db,
		now: time.Now,
		effects: prometheus.NewDesc("mcp_outbox_effects",
			"Effects in the database by state and destination.", []string{"state", "destination"}, nil),
		oldest: prometheus.NewDesc("mcp_outbox_oldest_pending_age_seconds",
			"Age of the oldest effect of a destination that is pending or in flight; 0 when none is.", []string{"destination"}, nil),
		unknownCalls: prometheus.NewDesc("mcp_outbox_calls_unknown",
			"Calls in state unknown: forwarded, their outcome lost; each waits for an operator (mcp-outbox outbox resolve-call).", nil, nil),
	}
}

func (c *depthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.effects
	ch <- c.oldest
	ch <- c.unknownCalls
}

// selectOldestAwaiting reads only the effects awaiting delivery, through
// effects_state. Taking min(created_at) in the counting pass instead read
// every row of the table (1.1 s per million effects with 200-byte bodies,
// against 0.1 s for counts alone from the covering index effects_due).
const selectOldestAwaiting = `
SELECT destination, min(created_at) FROM effects
WHERE state IN ('pending', 'in_flight') GROUP BY destination`

func (c *depthCollector) Collect(ch chan<- prometheus.Metric) {
	// A scrape must not hang on a locked or slow database.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unknown, err := opsquery.CountUnknownCalls(ctx, c.db)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.unknownCalls, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.unknownCalls, prometheus.GaugeValue, float64(unknown))
	}
	counts, oldest, err := c.read(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.effects, err)
		return
	}
	now := c.now().UnixMilli()
	for dest, byState := range counts {
		for _, state := range effectStates {
			ch <- prometheus.MustNewConstMetric(c.effects, prometheus.GaugeValue, float64(byState.Of(state)), state, dest)
		}
		age := 0.0
		if at, ok := oldest[dest]; ok {
			age = max(0, float64(now-at)/1000)
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, dest)
	}
}

func (c *depthCollector) read(ctx context.Context) (map[string]opsquery.Counts, map[string]int64, error) {
	byDest, err := opsquery.CountEffectsByDestination(ctx, c.db)
	if err != nil {
		return nil, nil, fmt.Errorf("read outbox depth: %w", err)
	}
	counts := map[string]opsquery.Counts{}
	for _, d := range byDest {
		counts[d.Destination] = d.Counts
	}
	rows, err := c.db.Read.QueryContext(ctx, selectOldestAwaiting)
	if err != nil {
		return nil, nil, fmt.Errorf("read outbox depth: %w", err)
	}
	defer rows.Close()
	oldest := map[string]int64{}
	for rows.Next() {
		var dest string
		var first int64
		if err := rows.Scan(&dest, &first); err != nil {
			return nil, nil, fmt.Errorf("read outbox depth: %w", err)
		}
		oldest[dest] = first
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read outbox depth: %w", err)
	}
	return counts, oldest, nil
}
