package admin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
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
	// commits under a new data key. Forget again once they ended. On
	// PostgreSQL a fresh key's claim commits with its outcome
	// (outbox/claim_tx_postgres.go), so a first attempt still running is
	// not seen and not counted: forget again after the principal's calls
	// have stopped.
	InFlight int64 `json:"inFlight"`
	// Unknown: the database holds no call and no data key of Principal
	// (not even a forgotten one; calls the retention purged are gone). A
	// request for someone who never called is met by nothing;
	// a principal written in another form than the one calls are
	// recorded under is a mistake, which Similar helps to see.
	Unknown bool `json:"unknown,omitempty"`
	// Similar names, when Unknown, principals recorded on a tenant's
	// server that end with Principal ("tenant:acme/user:alice" for
	// "alice"): a tenant's principal is forgotten under its whole name.
	Similar []string `json:"similar,omitempty"`
}

const (
	eraseCalls = `
UPDATE calls SET result = NULL, task_params = NULL, erased_at = $2
WHERE principal = $1 AND state <> 'in_flight' AND erased_at IS NULL`
	// An effect an operator had cancelled is marked too: the mark is what
	// keeps it from being retried once the purge took its call
	// (effectErased).
	eraseEffects = `
UPDATE effects SET body = NULL, headers = '{}', response = NULL,
    state = CASE WHEN state IN ('pending', 'in_flight', 'dead', 'unknown') THEN 'cancelled' ELSE state END,
    last_error = CASE WHEN state IN ('pending', 'in_flight', 'dead', 'unknown', 'cancelled')
        THEN '` + forgottenEffectError + `' ELSE last_error END,
    lease_owner = '', lease_until = 0, updated_at = $2
WHERE call_id IN (SELECT id FROM calls WHERE principal = $1 AND state <> 'in_flight')
  AND (body IS NOT NULL OR headers <> '{}' OR response IS NOT NULL OR state IN ('pending', 'in_flight', 'dead', 'unknown')
    OR (state = 'cancelled' AND last_error <> '` + forgottenEffectError + `'))`
	countInFlight  = `SELECT count(*) FROM calls WHERE principal = $1 AND state = 'in_flight'`
	principalKnown = `SELECT
    EXISTS (SELECT 1 FROM calls WHERE principal = $1) OR EXISTS (SELECT 1 FROM data_keys WHERE principal = $1)`
	// $1 is "/" and the principal, $2 its length in characters: a suffix
	// test that LIKE would need escaping for.
	similarPrincipals = `
SELECT DISTINCT principal FROM calls
WHERE principal LIKE 'tenant:%' AND length(principal) > $2 AND substr(principal, length(principal) - $2 + 1) = $1
ORDER BY principal LIMIT 5`
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
//
// principal is written as an operator writes it, as mcp-outbox outbox
// forget-principal takes it: "local", a user's ID ("alice", recorded as
// "user:alice"), or the recorded form ("user:alice", a tenant's
// "tenant:acme/user:alice"). A principal the database never saw erases
// nothing and is no error: Forgotten.Unknown says so, and Similar names the
// tenants' principals it may have meant.
func ForgetPrincipal(ctx context.Context, db *schema.DB, principal string, now time.Time) (*Forgotten, error) {
	if principal == "" {
		return nil, errors.New("forget principal: empty principal")
	}
	// A user's bare ID (what TokenInfo.UserID held) would otherwise match
	// nothing, silently: calls are recorded under "user:ID".
	if !strings.HasPrefix(principal, "tenant:") {
		principal = callkey.ParsePrincipal(principal)
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
	if f.DataKeys == 0 && f.Calls == 0 && f.Effects == 0 && f.InFlight == 0 {
		if err := similar(ctx, tx, f); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("forget principal: %w", err)
	}
	return f, nil
}

// similar sets f.Unknown and f.Similar for a forget that erased nothing.
func similar(ctx context.Context, tx *sql.Tx, f *Forgotten) error {
	var known bool
	if err := tx.QueryRowContext(ctx, principalKnown, f.Principal).Scan(&known); err != nil {
		return fmt.Errorf("look for the principal: %w", err)
	}
	if known {
		return nil
	}
	f.Unknown = true
	suffix := "/" + f.Principal
	rows, err := tx.QueryContext(ctx, similarPrincipals, suffix, utf8.RuneCountInString(suffix))
	if err != nil {
		return fmt.Errorf("look for similar principals: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return fmt.Errorf("look for similar principals: %w", err)
		}
		f.Similar = append(f.Similar, p)
	}
	return rows.Err()
}
