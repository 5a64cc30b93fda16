package outbox

import (
	"fmt"
	"time"
)

// ToolRetention overrides, for the calls of one tool
// ([ToolOptions.Retention]), how long the layer remembers them, as Restate
// sets idempotency retention per handler: a payment tool may keep its keys
// for the 24 hours Stripe promises, a tool whose results hold personal data
// may keep its records for an hour only. The zero value of each field keeps
// the default documented on it. The two are separate: a short Key alone
// makes retries run again sooner but leaves the row, with its result, for
// the purge's Retention.Calls (a day by default); to keep a result only an
// hour, set both to an hour.
//
// Each call's row carries the values its tool had when the call was
// claimed (calls.expires_at and calls.retain_ms), so the purge honours
// them on both stores, and changing a tool's retention later changes only
// the calls made after.
type ToolRetention struct {
	// Key is how long a client's idempotency key names a call of the
	// tool, counted from the call's completion (from its claim while it
	// runs): a retry with the same key within it replays the call's
	// outcome, a retry after it runs the call again, as a new call.
	// call_status reports the end of it as expiresAt, and answers
	// not_found after it. Zero means [Options.KeyRetention]. A call made
	// without a key is known by its fingerprint for
	// [ToolOptions.FingerprintWindow] instead, and a task for its
	// [TaskOptions.TTL] when that is set.
	Key time.Duration
	// Outcome is the least time a finished call's row, with its recorded
	// result, stays in the database after the call completed (the effects'
	// listings of the operator surface name its key and tool from it); the
	// purge deletes it once both this and its key's time have passed, and
	// once none of its effects waits for delivery or an operator. Zero
	// means the purge's [Retention.Calls], so an operator's purge with
	// another Calls applies to the tool's calls too; a tool with its own
	// Outcome keeps its calls that long whatever Calls says. Set, it must
	// not be shorter than the key's time (Key, or Options.KeyRetention): a
	// row is never purged while its key still names it, so a shorter
	// Outcome would not take effect.
	Outcome time.Duration
}

// check refuses retentions that are negative, or that could not take
// effect; keyDefault is the layer's key retention.
func (r ToolRetention) check(keyDefault time.Duration) error {
	if r.Key < 0 {
		return fmt.Errorf("negative Retention.Key %s: zero means Options.KeyRetention", r.Key)
	}
	if r.Outcome < 0 {
		return fmt.Errorf("negative Retention.Outcome %s: zero means the purge's Retention.Calls", r.Outcome)
	}
	key, from := r.Key, "Retention.Key"
	if key == 0 {
		key, from = keyDefault, "Options.KeyRetention"
	}
	if r.Outcome > 0 && r.Outcome < key {
		return fmt.Errorf("a Retention.Outcome of %s is shorter than the key's time %s (%s): "+
			"a record is kept while its key names it, so it would not take effect; "+
			"shorten Retention.Key too, or leave Outcome zero", r.Outcome, key, from)
	}
	return nil
}

// retainMS is the tool's outcome retention as the calls.retain_ms of its
// calls: NULL (nil) for none, so that the purge applies its own.
func (t *toolInfo) retainMS() any {
	if t.outcomeRetention <= 0 {
		return nil
	}
	return t.outcomeRetention.Milliseconds()
}
