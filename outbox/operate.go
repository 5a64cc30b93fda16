package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Errors of the operator actions.
var (
	ErrNoEffect      = errors.New("no such effect")
	ErrEffectState   = errors.New("effect is not in a state this action applies to")
	ErrNotResolvable = errors.New("only an unknown or dead effect can be resolved")
)

// Operator actions on effects. Each is one statement whose WHERE clause
// names the states it applies to, so it cannot race a dispatcher: an
// effect in flight is never changed under its lease.
const (
	retryEffect = `
UPDATE effects SET state = 'pending', attempts = 0, next_attempt_at = ?1, send_started_at = NULL,
    last_error = 'retry requested by an operator', updated_at = ?1
WHERE id = ?2 AND state IN ('dead', 'unknown', 'pending', 'cancelled')`
	retryAllDead = `
UPDATE effects SET state = 'pending', attempts = 0, next_attempt_at = ?1, send_started_at = NULL,
    last_error = 'retry requested by an operator', updated_at = ?1
WHERE state = 'dead'`
	cancelEffect = `
UPDATE effects SET state = 'cancelled', last_error = 'cancelled by an operator', send_started_at = NULL, updated_at = ?1
WHERE id = ?2 AND state IN ('pending', 'dead', 'unknown')`
	resolveRetry = `
UPDATE effects SET state = 'pending', attempts = 0, next_attempt_at = ?1, send_started_at = NULL,
    last_error = 'resolved as not applied by an operator; sending again', updated_at = ?1
WHERE id = ?2 AND state IN ('unknown', 'dead')`
	resolveDelivered = `
UPDATE effects SET state = 'delivered', delivered_at = ?1, send_started_at = NULL,
    last_error = 'resolved as delivered by an operator', updated_at = ?1
WHERE id = ?2 AND state IN ('unknown', 'dead')`
)

// RetryEffect makes a dead, unknown or cancelled effect pending again, with
// a fresh attempt budget and the same Idempotency-Key. Retrying an unknown
// effect at an at_most_once destination sends it again: do that only when
// the destination is known not to have applied it.
func RetryEffect(ctx context.Context, db *schema.DB, id int64) error {
	return changeEffect(ctx, db, id, retryEffect, time.Now().UnixMilli(), id)
}

// RetryDead makes every dead effect pending again and says how many.
func RetryDead(ctx context.Context, db *schema.DB) (int64, error) {
	r, err := db.Write.ExecContext(ctx, retryAllDead, time.Now().UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("retry dead effects: %w", err)
	}
	return r.RowsAffected()
}

// CancelEffect stops delivery of a pending, dead or unknown effect.
func CancelEffect(ctx context.Context, db *schema.DB, id int64) error {
	return changeEffect(ctx, db, id, cancelEffect, time.Now().UnixMilli(), id)
}

// ResolveEffect settles an unknown (or dead) effect by what an operator
// found out at the destination: delivered, or not applied and to be sent
// again (retry).
func ResolveEffect(ctx context.Context, db *schema.DB, id int64, delivered bool) error {
	stmt := resolveRetry
	if delivered {
		stmt = resolveDelivered
	}
	err := changeEffect(ctx, db, id, stmt, time.Now().UnixMilli(), id)
	if errors.Is(err, ErrEffectState) {
		return fmt.Errorf("%w: %w", ErrNotResolvable, err)
	}
	return err
}

func changeEffect(ctx context.Context, db *schema.DB, id int64, stmt string, args ...any) error {
	r, err := db.Write.ExecContext(ctx, stmt, args...)
	if err != nil {
		return fmt.Errorf("change effect %d: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 1 {
		return nil
	}
	var state string
	err = db.Read.QueryRowContext(ctx, `SELECT state FROM effects WHERE id = ?`, id).Scan(&state)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("effect %d: %w", id, ErrNoEffect)
	}
	if err != nil {
		return fmt.Errorf("read effect %d: %w", id, err)
	}
	return fmt.Errorf("effect %d is %s: %w", id, state, ErrEffectState)
}
