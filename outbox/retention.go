package outbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/retention"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Defaults for [Retention] fields left at zero.

// Retention says how long finished records stay in the database: what
// the reaper [Layer.Start] runs keeps, and what an operator's purge
// (mcp-outbox purge) keeps. The zero value of each field selects the
// default documented on it.
//
// What is purged, and when:
//
//   - A call row in state completed or failed, once its key has expired
//     (expires_at, when a retry would run the call again anyway) and Calls
//     has passed since it completed (its tool's [ToolRetention.Outcome]
//     instead, when the tool has one), and only when none of its effects is
//     pending, in_flight, dead or unknown: an operator settling an
//     effect can still see which call it belongs to. Retention can never
//     make a key be forgotten earlier than the layer promises.
//
//   - A delivered effect, Delivered after its delivery.
//
//   - A cancelled effect, Cancelled after it was cancelled (its last update).
//
//   - An in_flight call whose lease passed more than Calls ago: a claim
//     left by an attempt that died and was never retried. It committed
//     nothing (effects are only written with an outcome), and should the
//     attempt still be running somewhere, the fence refuses its commit once
//     the row is gone.
//
// Not purged but settled: an in_flight call whose lease passed more than
// Calls ago and whose claim says on_lost = 'unknown' (it was forwarded to a
// process whose work is outside the call's transaction, such as a tool
// server behind mcp-outbox proxy) may have run there. Deleting it would let
// a retry run it again, so it becomes state unknown instead, owned by
// nobody, for an operator to settle
// (mcp-outbox outbox resolve-call, or the admin API).
//
// Never purged: calls in state unknown, which wait for an operator, and
// pending, in_flight, dead and unknown effects, which still need a
// dispatcher or an operator.
type Retention struct {
	// Calls is the least time a call row is kept after its completion,
	// for the calls of tools without a ToolRetention.Outcome of their
	// own; zero means 24 hours.
	Calls time.Duration
	// Delivered is how long a delivered effect is kept; zero means
	// 7 days.
	Delivered time.Duration
	// Cancelled is how long a cancelled effect is kept; zero means
	// 7 days.
	Cancelled time.Duration
}

// ages is r as the shared purge takes it, defaults filled in; a negative
// duration is an error.
func (r Retention) ages() (retention.Ages, error) {
	return retention.Ages{Calls: r.Calls, Delivered: r.Delivered, Cancelled: r.Cancelled}.WithDefaults(retention.Ages{
		Calls: defaults.CallRetention, Delivered: defaults.DeliveredRetention, Cancelled: defaults.CancelledRetention,
	})
}

// runReaper purges expired records (see [Retention]) at once and then
// every interval until ctx ends, then returns. Zero interval means 10
// minutes; nil logger discards. A failed pass is logged and tried again at
// the next interval: the data it would delete stays correct, only the file
// stays larger for a while. [Layer.Start] runs it on the layer's clock, so
// that records expire on the clock that wrote their expiry.
func runReaper(ctx context.Context, db *schema.DB, r Retention, interval time.Duration, logger *slog.Logger, now func() time.Time) error {
	if interval < 0 {
		return fmt.Errorf("reaper: negative interval %s", interval)
	}
	if interval == 0 {
		interval = defaults.ReapInterval
	}
	ages, err := r.ages()
	if err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	logger = logger.With("subsystem", "reaper")
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c, err := retention.Purge(ctx, db, ages, now(), false)
		switch {
		case err != nil && ctx.Err() != nil:
			// Cut short by shutdown: nothing to report.
		case err != nil:
			logger.WarnContext(ctx, "purge expired records", "error", err,
				"calls", c.Calls, "delivered_effects", c.DeliveredEffects, "cancelled_effects", c.CancelledEffects,
				"unknown_calls", c.UnknownCalls)
		case c.UnknownCalls > 0:
			logger.WarnContext(ctx, "abandoned forwarded calls are now unknown: an operator must settle them (mcp-outbox outbox calls)",
				"unknown_calls", c.UnknownCalls, "calls", c.Calls, "delivered_effects", c.DeliveredEffects,
				"cancelled_effects", c.CancelledEffects)
		case c.Calls+c.DeliveredEffects+c.CancelledEffects > 0:
			logger.InfoContext(ctx, "purged expired records",
				"calls", c.Calls, "delivered_effects", c.DeliveredEffects, "cancelled_effects", c.CancelledEffects)
		default:
			logger.DebugContext(ctx, "nothing to purge")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
