package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// ErrNoPending: an action on a destination's pending effects found none,
// most likely because the name is not the one the effects were enqueued
// with. Nothing was changed.
var ErrNoPending = errors.New("no pending effects for that destination")

// The bulk actions on one destination's pending effects: an effect
// enqueued for a name no dispatcher delivers to (a typo, a destination
// renamed or dropped) waits forever, and a Start that knows the right
// name refuses to run while it does. Each is one statement on the pending
// effects only, so it cannot race a dispatcher: an effect in flight, or
// one a dispatcher has just claimed, is not touched. Retargeted effects
// keep their Idempotency-Key, body and headers (sealed values are bound
// to the key, not the destination) and their order within their call.
const (
	retargetPending = `
UPDATE effects SET destination = $1, attempts = 0, next_attempt_at = $2, send_started_at = NULL,
    last_error = $3, updated_at = $2
WHERE destination = $4 AND state = 'pending'`
	cancelPendingOf = `
UPDATE effects SET state = 'cancelled', last_error = 'cancelled by an operator', send_started_at = NULL, updated_at = $1
WHERE destination = $2 AND state = 'pending'`
)

// RetargetPending moves every pending effect of destination from to
// destination to, due now with a fresh attempt budget, and says how many
// it moved; none is [ErrNoPending]. It does not know which names a
// dispatcher delivers to: check to against the configuration first (the
// mcp-outbox command and the operator surface do). An empty name, or
// from equal to to, is an error and nothing changes.
func RetargetPending(ctx context.Context, db *schema.DB, from, to string) (int64, error) {
	switch {
	case from == "" || to == "":
		return 0, errors.New("retarget pending effects: give both destinations")
	case from == to:
		return 0, fmt.Errorf("retarget pending effects: from and to are both %q", from)
	}
	note := fmt.Sprintf("moved from destination %q by an operator", from)
	r, err := db.Write.ExecContext(ctx, retargetPending, to, time.Now().UnixMilli(), note, from)
	if err != nil {
		return 0, fmt.Errorf("retarget pending effects of %q: %w", from, err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("retarget pending effects of %q: %w", from, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("retarget %q: %w", from, ErrNoPending)
	}
	return n, nil
}

// CancelPending cancels every pending effect of destination dest and says
// how many; none is [ErrNoPending]. Like [CancelEffect], a cancelled
// effect no longer holds back the later effects of its call, and
// [RetryEffect] undoes it one effect at a time.
func CancelPending(ctx context.Context, db *schema.DB, dest string) (int64, error) {
	if dest == "" {
		return 0, errors.New("cancel pending effects: give the destination")
	}
	r, err := db.Write.ExecContext(ctx, cancelPendingOf, time.Now().UnixMilli(), dest)
	if err != nil {
		return 0, fmt.Errorf("cancel pending effects of %q: %w", dest, err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("cancel pending effects of %q: %w", dest, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("cancel %q: %w", dest, ErrNoPending)
	}
	return n, nil
}
