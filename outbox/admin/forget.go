package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Forgotten is what ForgetPrincipal erased.
type Forgotten struct {
	Principal string `json:"principal"`
	// DataKeys erased: values sealed under them are unreadable for good,
	// in this database and in any copy of it made from now on.
	DataKeys int64 `json:"dataKeys"`
	// Calls whose result and task arguments were deleted; each keeps its
	// key, tool, state and times, so a retry runs nothing and call_status
	// answers erased.
	Calls int64 `json:"calls"`
	// Effects whose body, headers and recorded response were deleted; the
	// ones not delivered yet were cancelled (never sent).
	Effects int64 `json:"effects"`
	// InFlight calls were running and are not erased: their outcome
	// commits under a new data key. Forget again once they ended.
	InFlight int64 `json:"inFlight"`
}

const (
	eraseCalls = `
UPDATE calls SET result = NULL, task_params = NULL, erased_at = $2
WHERE principal = $1 AND state <> 'in_flight' AND erased_at IS NULL`
	eraseEffects = `
UPDATE effects SET body = NULL, headers = '{}', response = NULL,
    state = CASE WHEN state IN ('pending', 'in_flight', 'dead', 'unknown') THEN 'cancelled' ELSE state END,
    last_error = CASE WHEN state IN ('pending', 'in_flight', 'dead', 'unknown')
        THEN 'cancelled: its principal was forgotten' ELSE last_error END,
    lease_owner = '', lease_until = 0, updated_at = $2
WHERE call_id IN (SELECT id FROM calls WHERE principal = $1 AND state <> 'in_flight')
  AND (body IS NOT NULL OR headers <> '{}' OR response IS NOT NULL OR state IN ('pending', 'in_flight', 'dead', 'unknown'))`
	countInFlight = `SELECT count(*) FROM calls WHERE principal = $1 AND state = 'in_flight'`
)

// ForgetPrincipal erases every recorded argument, result and effect body
// of principal (GDPR Art. 17), in one transaction:
//
//   - crypto-erasure: the principal's data keys are deleted (see package
//     seal), so what was sealed under them cannot be read from this
//     database, its WAL or dead tuples, or a backup taken from now on;
//   - hygiene: the ciphertexts themselves (and any plaintext of a database
//     that was not encrypted) are deleted from calls and effects, and the
//     effects not delivered yet are cancelled.
//
// Every key of the principal stays in calls, marked erased: a retry with a
// forgotten key runs nothing, and call_status answers erased. It holds at
// once for a running layer (every read of a sealed value reads its data
// key's row) and after a restart. It needs no key file. Calls in flight are
// left alone and counted in InFlight. The erase is recorded in data_keys
// (erased_at); callers log it as an operator action.
func ForgetPrincipal(ctx context.Context, db *schema.DB, principal string, now time.Time) (*Forgotten, error) {
	if principal == "" {
		return nil, errors.New("forget principal: empty principal")
	}
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("forget principal: %w", err)
	}
	defer tx.Rollback()
	f := &Forgotten{Principal: principal}
	if f.DataKeys, err = seal.Forget(ctx, tx, principal, now); err != nil {
		return nil, err
	}
	ms := now.UnixMilli()
	// Effects first: their WHERE finds the principal's calls by state,
	// which the calls' erase leaves as it is.
	r, err := tx.ExecContext(ctx, eraseEffects, principal, ms)
	if err != nil {
		return nil, fmt.Errorf("erase effects: %w", err)
	}
	f.Effects, _ = r.RowsAffected()
	if r, err = tx.ExecContext(ctx, eraseCalls, principal, ms); err != nil {
		return nil, fmt.Errorf("erase calls: %w", err)
	}
	f.Calls, _ = r.RowsAffected()
	if err := tx.QueryRowContext(ctx, countInFlight, principal).Scan(&f.InFlight); err != nil {
		return nil, fmt.Errorf("count calls in flight: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("forget principal: %w", err)
	}
	return f, nil
}
