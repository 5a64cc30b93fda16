package admin

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Errors of the actions on effects.
var (
	ErrNoEffect      = errors.New("no such effect")
	ErrEffectState   = errors.New("effect is not in a state this action applies to")
	ErrNotResolvable = errors.New("only an unknown or dead effect can be resolved")
	ErrEffectOutcome = errors.New("outcome must be delivered or retry")
	// ErrEffectErased: the effect's principal was forgotten
	// (ForgetPrincipal), which deleted its body and headers. Sending it
	// again would send an empty request that a destination may well
	// accept, so no action makes it pending again.
	ErrEffectErased = errors.New("its principal was forgotten: its body and headers are erased and cannot be sent")
)

// EffectOutcome is what an operator found out at an effect's destination.
type EffectOutcome string

// The outcomes [ResolveEffect] takes.
const (
	// EffectDelivered: the destination has the effect. It becomes
	// delivered and is never sent again.
	EffectDelivered EffectOutcome = "delivered"
	// EffectRetry: the destination did not apply the effect. It becomes
	// pending with a fresh attempt budget, to be sent again with the same
	// Idempotency-Key.
	EffectRetry EffectOutcome = "retry"
)

// Operator actions on effects. Each is one statement whose WHERE clause
// names the states it applies to, so it cannot race a dispatcher: an
// effect in flight is never changed under its lease.
//
// Every statement that makes an effect pending excludes an erased one
// (effectErased), in its own WHERE, so that no read-then-write can let one
// through.
const (
	retryEffect = `
UPDATE effects SET state = 'pending', attempts = 0, next_attempt_at = $1, send_started_at = NULL,
    last_error = 'retry requested by an operator', updated_at = $1
WHERE id = $2 AND state IN ('dead', 'unknown', 'pending', 'cancelled') AND NOT ` + effectErased
	retryAllDead = `
UPDATE effects SET state = 'pending', attempts = 0, next_attempt_at = $1, send_started_at = NULL,
    last_error = 'retry requested by an operator', updated_at = $1
WHERE state = 'dead' AND NOT ` + effectErased
	cancelEffect = `
UPDATE effects SET state = 'cancelled', last_error = 'cancelled by an operator', send_started_at = NULL, updated_at = $1
WHERE id = $2 AND state IN ('pending', 'dead', 'unknown')`
	resolveRetry = `
UPDATE effects SET state = 'pending', attempts = 0, next_attempt_at = $1, send_started_at = NULL,
    last_error = 'resolved as not applied by an operator; sending again', updated_at = $1
WHERE id = $2 AND state IN ('unknown', 'dead') AND NOT ` + effectErased
	resolveDelivered = `
UPDATE effects SET state = 'delivered', delivered_at = $1, send_started_at = NULL,
    last_error = 'resolved as delivered by an operator', updated_at = $1
WHERE id = $2 AND state IN ('unknown', 'dead')`
)

// RetryEffect makes a dead, unknown or cancelled effect pending again, with
// a fresh attempt budget and the same Idempotency-Key. Retrying an unknown
// effect at an at_most_once destination sends it again: do that only when
// the destination is known not to have applied it. An effect whose
// principal was forgotten is [ErrEffectErased], and nothing changes.
//
// On PostgreSQL the retry holds its call's row lock (FOR KEY SHARE) while
// it changes the effect, so that it and a purge of the call, which locks
// the call before it reads whether any effect still holds it, happen one
// after the other: never a pending effect whose call a purge removed
// under it. (On SQLite the one writer does that already.)
func RetryEffect(ctx context.Context, db *schema.DB, id int64) error {
	if db.Dialect != schema.Postgres {
		return changeEffect(ctx, db, id, retryEffect, time.Now().UnixMilli(), id)
	}
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("change effect %d: %w", id, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, lockEffectsCall, id); err != nil {
		return fmt.Errorf("change effect %d: lock its call: %w", id, err)
	}
	if err := changeEffectIn(ctx, tx, db, id, retryEffect, time.Now().UnixMilli(), id); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("change effect %d: commit: %w", id, err)
	}
	return nil
}

// lockEffectsCall takes the row lock of an effect's call that a delete
// waits for (FOR KEY SHARE lets the call's own updates through).
const lockEffectsCall = `SELECT 1 FROM calls WHERE id = (SELECT call_id FROM effects WHERE id = $1) FOR KEY SHARE`

// RetryDead makes every dead effect pending again and says how many. An
// erased one ([ErrEffectErased]) stays dead; ForgetPrincipal leaves none
// dead, so there is none unless something else made it so.
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
// found out at the destination: [EffectDelivered], or [EffectRetry] for
// one not applied there, to be sent again. Any other outcome is
// [ErrEffectOutcome], and retry of an effect whose principal was forgotten
// is [ErrEffectErased]; nothing is changed.
func ResolveEffect(ctx context.Context, db *schema.DB, id int64, outcome EffectOutcome) error {
	var stmt string
	switch outcome {
	case EffectDelivered:
		stmt = resolveDelivered
	case EffectRetry:
		stmt = resolveRetry
	default:
		return fmt.Errorf("resolve effect %d: outcome %q: %w", id, outcome, ErrEffectOutcome)
	}
	err := changeEffect(ctx, db, id, stmt, time.Now().UnixMilli(), id)
	if errors.Is(err, ErrEffectState) {
		return fmt.Errorf("%w: %w", ErrNotResolvable, err)
	}
	return err
}

// forgottenEffectError is the last_error ForgetPrincipal leaves on every
// effect it erased that was not delivered.
const forgottenEffectError = "cancelled: its principal was forgotten"

// effectErased is true of an effect ForgetPrincipal erased. Two marks,
// since either alone can go: its call's erased_at holds while the call is
// kept, but the retention purges the call of a cancelled effect (call_id
// becomes NULL) while the effect stays; the effect's own last_error stays
// with it, and nothing changes a cancelled effect's last_error once no
// action makes it pending. A body of NULL is no mark: an effect without a
// body has one.
const effectErased = `((state = 'cancelled' AND last_error = '` + forgottenEffectError + `')
    OR EXISTS (SELECT 1 FROM calls c WHERE c.id = effects.call_id AND c.erased_at IS NOT NULL))`

func changeEffect(ctx context.Context, db *schema.DB, id int64, stmt string, args ...any) error {
	return changeEffectIn(ctx, db.Write, db, id, stmt, args...)
}

// changeEffectIn is changeEffect in the transaction (or pool) w.
func changeEffectIn(ctx context.Context, w interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, db *schema.DB, id int64, stmt string, args ...any) error {
	r, err := w.ExecContext(ctx, stmt, args...)
	if err != nil {
		return fmt.Errorf("change effect %d: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 1 {
		return nil
	}
	var (
		state  string
		erased bool
	)
	err = db.Read.QueryRowContext(ctx, `SELECT state, `+effectErased+` FROM effects WHERE id = $1`, id).Scan(&state, &erased)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("effect %d: %w", id, ErrNoEffect)
	}
	if err != nil {
		return fmt.Errorf("read effect %d: %w", id, err)
	}
	if erased && (stmt == retryEffect || stmt == resolveRetry) {
		return fmt.Errorf("effect %d is %s and stays so: %w", id, state, ErrEffectErased)
	}
	return fmt.Errorf("effect %d is %s: %w", id, state, ErrEffectState)
}

// Errors of ResolveCall and ResolveCallUID.
var (
	ErrNoCall         = errors.New("no such call")
	ErrCallNotUnknown = errors.New("only a call in state unknown can be resolved")
	ErrCallOutcome    = errors.New("outcome must be completed, failed or rerun")
	// ErrSealerNeeded: the database is used with a key file, and a
	// resolution's note would be the one result stored in plaintext.
	ErrSealerNeeded = errors.New("the database is encrypted: give its key file (--encryption-key-file), " +
		"so that the note is stored encrypted as every recorded result is; nothing was changed")
)

// CallOutcome is what an operator found out about a call in state unknown.
type CallOutcome string

// The outcomes an operator can resolve an unknown call to.
const (
	// CallCompleted: the call ran and its work is done. It becomes
	// completed; a retry replays the operator's note as its result.
	CallCompleted CallOutcome = "completed"
	// CallFailed: the call ran and failed, or must not run: it becomes
	// failed; a retry replays the operator's note as a tool error.
	CallFailed CallOutcome = "failed"
	// CallRerun: the call did not run. Its row is deleted, so that the
	// next retry with its key runs it. A note is not recorded.
	CallRerun CallOutcome = "rerun"
)

// Resolution is an operator's decision on a call in state unknown.
type Resolution struct {
	// Outcome is required; anything but the three CallOutcome constants is
	// [ErrCallOutcome].
	Outcome CallOutcome
	// Note follows "[resolved by an operator]" in the text of the result a
	// retry replays, for CallCompleted and CallFailed; it may be empty.
	Note string
	// Sealer seals the recorded result on a database used with a key file
	// (of outbox.Options.Keys, the same key file's); nil on one without.
	Sealer *sealing.Sealer
}

// CallRef names a call by whose it is and its key, as the calls table
// holds them (the status tool's principal and key).
type CallRef struct {
	// Principal is "local" for calls without an authenticated user, and
	// "user:" followed by the go-sdk's TokenInfo.UserID otherwise.
	Principal string
	Key       string
}

// resolvedPrefix starts the text of the result an operator's resolution
// records, so that whoever reads a replay sees that no tool produced it.
const resolvedPrefix = "[resolved by an operator]"

// The statements of ResolveCall. Each write applies only to a call in
// state unknown, so a resolution cannot race an attempt: nothing claims an
// unknown call. A call resolved as completed or failed keeps its key for
// the window it was made with, counted again from the resolution, so that
// the client's retries after the operator's decision replay it instead of
// running it again. A call is found by either of its names, then recorded
// by its id, which its result is sealed with; PostgreSQL has GREATEST
// where SQLite has the scalar max.
const (
	resolveCallOutcome = `
UPDATE calls SET state = $1, result = $2, completed_at = $3, owner = '', lease_until = 0,
    expires_at = max(expires_at, $3 + max(expires_at - created_at, 0))
WHERE state = 'unknown' AND id = $4`
	resolveCallOutcomePostgres = `
UPDATE calls SET state = $1, result = $2, completed_at = $3, owner = '', lease_until = 0,
    expires_at = GREATEST(expires_at, $3::bigint + GREATEST(expires_at - created_at, 0))
WHERE state = 'unknown' AND id = $4`
	resolveCallFindByKey = `SELECT id, principal FROM calls WHERE principal = $1 AND key = $2`
	resolveCallFindByUID = `SELECT id, principal FROM calls WHERE uid = $1`
	resolveCallStateByID = `SELECT state FROM calls WHERE id = $1`

	resolveCallRerunByKey = `DELETE FROM calls WHERE state = 'unknown' AND principal = $1 AND key = $2`
	resolveCallRerunByUID = `DELETE FROM calls WHERE state = 'unknown' AND uid = $1`
	resolveCallStateByKey = `SELECT state FROM calls WHERE principal = $1 AND key = $2`
	resolveCallStateByUID = `SELECT state FROM calls WHERE uid = $1`

	// A database used with a key file has live data keys (its hash key at
	// least); one decrypted has none left (outbox.Decrypt).
	liveDataKey = `SELECT EXISTS (SELECT 1 FROM data_keys WHERE erased_at IS NULL)`
)

// callName is how a resolution names its call: its statements, the
// values of the name's parameters, and the call's name in errors.
type callName struct {
	find, rerun, state string
	args               []any
	name               string
}

// ResolveCall settles a call in state unknown (forwarded to a tool server
// whose work is outside the call's transaction, its outcome lost) by what
// an operator found out there: completed or failed records that outcome,
// with a result whose text is "[resolved by an operator]" and the note,
// which retries replay; rerun deletes the call, so that the next retry
// runs it. The call's effects, if any, are not touched. A call in any other state is
// [ErrCallNotUnknown], and one not there [ErrNoCall]. On a database used
// with a key file the result is sealed with Resolution.Sealer, as the
// layer seals every result; without one it is [ErrSealerNeeded].
func ResolveCall(ctx context.Context, db *schema.DB, call CallRef, r Resolution) error {
	return resolveCall(ctx, db, callName{
		find:  resolveCallFindByKey,
		rerun: resolveCallRerunByKey, state: resolveCallStateByKey,
		args: []any{call.Principal, call.Key}, name: fmt.Sprintf("call %q of %s", call.Key, call.Principal),
	}, r)
}

// ResolveCallUID is ResolveCall for the call named by its uid (the callId
// of the status tool and the logs), which is never reused: after a rerun
// deletes the call, the next one with its key has another uid, so a
// resolution meant for the old call cannot reach the new one. Its errors
// name the uid, never the key.
func ResolveCallUID(ctx context.Context, db *schema.DB, uid string, r Resolution) error {
	return resolveCall(ctx, db, callName{
		find:  resolveCallFindByUID,
		rerun: resolveCallRerunByUID, state: resolveCallStateByUID,
		args: []any{uid}, name: "call " + uid,
	}, r)
}

func resolveCall(ctx context.Context, db *schema.DB, c callName, rs Resolution) error {
	switch rs.Outcome {
	case CallCompleted, CallFailed:
		return recordResolution(ctx, db, c, rs)
	case CallRerun:
	default:
		return fmt.Errorf("outcome %q: %w", rs.Outcome, ErrCallOutcome)
	}
	r, err := db.Write.ExecContext(ctx, c.rerun, c.args...)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", c.name, err)
	}
	if n, _ := r.RowsAffected(); n == 1 {
		return nil
	}
	var state string
	err = db.Read.QueryRowContext(ctx, c.state, c.args...).Scan(&state)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: %w", c.name, ErrNoCall)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", c.name, err)
	}
	return fmt.Errorf("%s is %s: %w", c.name, state, ErrCallNotUnknown)
}

// recordResolution records a completed or failed resolution's result, in
// one transaction with the data key it is sealed under.
func recordResolution(ctx context.Context, db *schema.DB, c callName, rs Resolution) error {
	// The recorded result is what outbox replays: the same JSON as the
	// result of a handler that returned this text.
	res, err := json.Marshal(&mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: strings.TrimSpace(resolvedPrefix + " " + rs.Note)}},
		IsError: rs.Outcome == CallFailed,
	})
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", c.name, err)
	}
	defer tx.Rollback()
	var (
		id        int64
		principal string
	)
	err = tx.QueryRowContext(ctx, c.find, c.args...).Scan(&id, &principal)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: %w", c.name, ErrNoCall)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", c.name, err)
	}
	result := string(res)
	if rs.Sealer != nil {
		// As outbox's callRef names a call's result: the layer opens it
		// under that name when a retry replays it.
		ref := sealing.Ref{Row: strconv.FormatInt(id, 10), Column: "result", Principal: principal}
		if result, err = rs.Sealer.SealString(ctx, tx, ref, result); err != nil {
			return fmt.Errorf("resolve %s: seal the result: %w", c.name, err)
		}
	} else {
		var encrypted bool
		if err := tx.QueryRowContext(ctx, liveDataKey).Scan(&encrypted); err != nil {
			return fmt.Errorf("resolve %s: look for data keys: %w", c.name, err)
		}
		if encrypted {
			return fmt.Errorf("resolve %s: %w", c.name, ErrSealerNeeded)
		}
	}
	r, err := tx.ExecContext(ctx, db.Pick(resolveCallOutcome, resolveCallOutcomePostgres),
		string(rs.Outcome), result, time.Now().UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", c.name, err)
	}
	if n, _ := r.RowsAffected(); n != 1 {
		var state string
		if err := tx.QueryRowContext(ctx, resolveCallStateByID, id).Scan(&state); err != nil {
			return fmt.Errorf("read %s: %w", c.name, err)
		}
		return fmt.Errorf("%s is %s: %w", c.name, state, ErrCallNotUnknown)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("resolve %s: commit: %w", c.name, err)
	}
	return nil
}
