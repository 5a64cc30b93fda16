package dispatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// The "delivery" event: one log record per recorded attempt, beside the
// layer's "call" events (see package outbox's events.go). The effect's key
// appears only as a hash prefix unless Options.LogSensitive asks for it.

func durationMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// deliveryResult names a recorded delivery outcome: the dispatcher stores a
// retry as the effect going back to pending.
func deliveryResult(o outcome) string {
	if o.state == "pending" {
		return "retry"
	}
	return o.state
}

// logDelivery writes the delivery event of one recorded attempt of e.
func (d *Dispatcher) logDelivery(ctx context.Context, ds *destState, e *claimedEffect, o outcome, took time.Duration) {
	result := deliveryResult(o)
	level := slog.LevelInfo
	if result == "dead" || result == "unknown" {
		// Neither resolves on its own: an operator has to look.
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("destination", ds.Name),
		slog.Int64("effect", e.id),
		slog.Int("attempt", e.attempts),
		slog.String("result", result),
		slog.Int("status", o.status),
		slog.Float64("duration_ms", durationMS(took)),
		slog.String("error", o.err),
		slog.String("key_hash", callkey.HashPrefix(e.key)),
	}
	if d.opts.LogSensitive {
		attrs = append(attrs, slog.String("raw_key", e.key))
	}
	d.logger.LogAttrs(ctx, level, "delivery", attrs...)
}
