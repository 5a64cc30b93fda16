package admin

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
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
	// Unknown: the database holds no call, no effect and no data key of
	// Principal (not even a forgotten one; calls and effects the retention
	// purged are gone). A request for someone who never called is met by
	// nothing; a principal written in another form than the one calls are
	// recorded under is a mistake, which Similar helps to see.
	Unknown bool `json:"unknown,omitempty"`
	// Similar names, when Unknown, principals recorded on a tenant's
	// server that end with Principal ("tenant:acme/user:alice" for
	// "alice"): a tenant's principal is forgotten under its whole name;
	// and the principals that differ from it in case only ("user:alice"
	// for "user:Alice").
	Similar []string `json:"similar,omitempty"`
	// WALPending (SQLite): the checkpoint after the erase could not empty
	// the -wal file, since a reader held a snapshot from before it. The
	// WAL keeps the pages written before the forget, the wrapped data key
	// among them, until the next checkpoint does: run the forget again
	// (it erases nothing more, and checkpoints) once readers are done.
	WALPending bool `json:"walPending,omitempty"`
}

const (
	eraseCalls = `
UPDATE calls SET result = NULL, task_params = NULL, erased_at = $2
WHERE principal = $1 AND state <> 'in_flight' AND erased_at IS NULL`
	// An effect an operator had cancelled is marked too: the mark is what
	// keeps it from being retried once the purge took its call
	// (effectErased). An effect no call leads to (its call purged, or
	// never recorded) is found by its own principal column.
	eraseEffects = `
UPDATE effects SET body = NULL, headers = '{}', response = NULL,
    state = CASE WHEN state IN ('pending', 'in_flight', 'dead', 'unknown') THEN 'cancelled' ELSE state END,
    last_error = CASE WHEN state IN ('pending', 'in_flight', 'dead', 'unknown', 'cancelled')
        THEN '` + forgottenEffectError + `' ELSE last_error END,
    lease_owner = '', lease_until = 0, updated_at = $2
WHERE (call_id IN (SELECT id FROM calls WHERE principal = $1 AND state <> 'in_flight')
       OR (call_id IS NULL AND principal = $1))
  AND (body IS NOT NULL OR headers <> '{}' OR response IS NOT NULL OR state IN ('pending', 'in_flight', 'dead', 'unknown')
    OR (state = 'cancelled' AND last_error <> '` + forgottenEffectError + `'))`
	countInFlight  = `SELECT count(*) FROM calls WHERE principal = $1 AND state = 'in_flight'`
	principalKnown = `SELECT
    EXISTS (SELECT 1 FROM calls WHERE principal = $1) OR EXISTS (SELECT 1 FROM data_keys WHERE principal = $1)
    OR EXISTS (SELECT 1 FROM effects WHERE call_id IS NULL AND principal = $1)`
	// $1 is "/" and the principal, $2 its length in characters: a suffix
	// test that LIKE would need escaping for. $3 is the principal, found
	// again in another case ("user:Alice" for "user:alice").
	similarPrincipals = `
SELECT DISTINCT principal FROM calls
WHERE (principal LIKE 'tenant:%' AND length(principal) > $2 AND substr(principal, length(principal) - $2 + 1) = $1)
   OR lower(principal) = lower(CAST($3 AS TEXT))
ORDER BY principal LIMIT 5`
)

// ForgetPrincipal erases every recorded argument, result and effect body
// of principal (GDPR Art. 17), in one transaction:
//
//   - crypto-erasure: the principal's data keys are deleted (see package
//     seal), so what was sealed under them cannot be read from this
//     database or a backup taken from now on. The wrapped key must not
//     linger either, since with the key file it unwraps: on SQLite the
//     erase runs with secure_delete (freed space zeroed) and a
//     wal_checkpoint(TRUNCATE) follows, which readers on an older snapshot
//     can hold off (Forgotten.WALPending). On PostgreSQL the old row
//     version stays as a dead tuple until VACUUM, and in WAL segments and
//     archives until they are recycled;
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
// nothing and is no error here: Forgotten.Unknown says so, Similar names
// the principals it may have meant, and UnknownMessage puts both in words.
func ForgetPrincipal(ctx context.Context, db *schema.DB, principal string, now time.Time) (*Forgotten, error) {
	if principal == "" {
		return nil, errors.New("forget principal: empty principal")
	}
	// A user's bare ID (what TokenInfo.UserID held) would otherwise match
	// nothing, silently: calls are recorded under "user:ID".
	if !strings.HasPrefix(principal, "tenant:") {
		principal = callkey.ParsePrincipal(principal)
	}
	conn, err := db.Write.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("forget principal: %w", err)
	}
	defer conn.Close()
	f := &Forgotten{Principal: principal}
	if db.Dialect == schema.Postgres {
		if err := forget(ctx, conn, f, now); err != nil {
			return nil, err
		}
		return f, nil
	}
	// SQLite only marks the space a deleted value took as free: the
	// wrapped data key stayed in the page, and a copy of the file taken
	// after the forget, with the key file, still unwrapped it. With
	// secure_delete the erase overwrites it with zeros. It is a setting of
	// the connection, changed outside a transaction and put back after.
	var was int
	if err := conn.QueryRowContext(ctx, `PRAGMA secure_delete`).Scan(&was); err != nil {
		return nil, fmt.Errorf("forget principal: read secure_delete: %w", err)
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA secure_delete = 1`); err != nil {
		return nil, fmt.Errorf("forget principal: set secure_delete: %w", err)
	}
	ferr := forget(ctx, conn, f, now)
	if _, err := conn.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf(`PRAGMA secure_delete = %d`, was)); err != nil {
		// The pool must not hand out a connection that zeroes every delete.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		return nil, errors.Join(ferr, fmt.Errorf("forget principal: restore secure_delete: %w", err))
	}
	if ferr != nil {
		return nil, ferr
	}
	// The pages written before the erase, data key and all, are still in
	// the -wal file: a checkpoint copies the erased pages into the main
	// file and TRUNCATE empties the WAL. It cannot while a reader holds an
	// older snapshot; the erase is committed all the same, so that is
	// reported, not failed.
	var busy, logFrames, done int
	if err := conn.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logFrames, &done); err != nil || busy != 0 {
		f.WALPending = true
	}
	return f, nil
}

// UnknownMessage says, for a forget whose principal the database never
// saw (Unknown), that nothing was erased, naming the similar principals
// it may have meant; "" otherwise. An erasure script that records success
// as done must not read a typo as a request met: the CLI exits 1 with
// this message, and the admin API answers 404 with it.
func (f *Forgotten) UnknownMessage() string {
	if !f.Unknown {
		return ""
	}
	msg := fmt.Sprintf("principal %s is unknown: no call, effect or data key of it is recorded in this database, nothing was erased", f.Principal)
	if len(f.Similar) > 0 {
		msg += "; similar principals recorded: " + strings.Join(f.Similar, ", ")
	}
	return msg
}

// forget erases f.Principal's data keys, calls and effects in one
// transaction on conn, and fills in f.
func forget(ctx context.Context, conn *sql.Conn, f *Forgotten, now time.Time) error {
	principal := f.Principal
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("forget principal: %w", err)
	}
	defer tx.Rollback()
	if f.DataKeys, err = sealing.Forget(ctx, tx, principal, now); err != nil {
		return err
	}
	ms := now.UnixMilli()
	// Effects first: their WHERE finds the principal's calls by state,
	// which the calls' erase leaves as it is.
	r, err := tx.ExecContext(ctx, eraseEffects, principal, ms)
	if err != nil {
		return fmt.Errorf("erase effects: %w", err)
	}
	f.Effects, _ = r.RowsAffected()
	if r, err = tx.ExecContext(ctx, eraseCalls, principal, ms); err != nil {
		return fmt.Errorf("erase calls: %w", err)
	}
	f.Calls, _ = r.RowsAffected()
	if err := tx.QueryRowContext(ctx, countInFlight, principal).Scan(&f.InFlight); err != nil {
		return fmt.Errorf("count calls in flight: %w", err)
	}
	if f.DataKeys == 0 && f.Calls == 0 && f.Effects == 0 && f.InFlight == 0 {
		if err := similar(ctx, tx, f); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("forget principal: %w", err)
	}
	return nil
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
	rows, err := tx.QueryContext(ctx, similarPrincipals, suffix, utf8.RuneCountInString(suffix), f.Principal)
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
