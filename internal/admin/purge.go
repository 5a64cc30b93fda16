package admin

import (
	"context"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/retention"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// PurgeOptions configure [Purge]. The zero value of each field selects the
// default documented on it.
type PurgeOptions struct {
	// Retention says what is kept; the zero value keeps what
	// the layer's reaper keeps by default.
	Retention outbox.Retention
	// Now is the time the retention is counted back from; zero means
	// time.Now().
	Now time.Time
	// DryRun counts what would be purged and deletes nothing.
	DryRun bool
}

// PurgeCounts are the rows a purge deleted, or would delete in a dry run,
// and the abandoned claims it turned into unknown calls (or would).
type PurgeCounts struct {
	Calls            int64 `json:"calls"`
	DeliveredEffects int64 `json:"deliveredEffects"`
	CancelledEffects int64 `json:"cancelledEffects"`
	// UnknownCalls are abandoned claims of forwarded calls that became
	// state unknown instead of being deleted; nothing was deleted of them.
	UnknownCalls int64 `json:"unknownCalls"`
}

// Purge deletes at once the records opts.Retention no longer keeps (see
// [outbox.Retention]), as the reaper would on its next pass, and says how
// many; nil opts purges now with the default retention. Rows go in
// transactions of at most a thousand, so a large purge does not hold the
// writer from tool calls, and it is safe beside running reapers; if ctx
// ends midway, the counts say what was already deleted. A negative
// retention is an error, and nothing is deleted.
func Purge(ctx context.Context, db *schema.DB, opts *PurgeOptions) (PurgeCounts, error) {
	var o PurgeOptions
	if opts != nil {
		o = *opts
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	r := o.Retention
	ages, err := retention.Ages{Calls: r.Calls, Delivered: r.Delivered, Cancelled: r.Cancelled}.WithDefaults(retention.Ages{
		Calls: defaults.CallRetention, Delivered: defaults.DeliveredRetention, Cancelled: defaults.CancelledRetention,
	})
	if err != nil {
		return PurgeCounts{}, err
	}
	c, err := retention.Purge(ctx, db, ages, o.Now, o.DryRun)
	return PurgeCounts(c), err
}
