// Package query answers "what happened to my call?" from the outbox tables:
// the state of a call found by its key (or by tool and arguments, for a
// client that sent no key), its recorded result and times, and the delivery
// state of each effect it enqueued. It only reads.
//
// Every function takes the [schema.DB] and reads through its Read pool.
// The few statements that differ between SQLite and PostgreSQL are chosen
// by the DB's Dialect, which comes from what was opened, never from the
// driver's type: a pool behind an instrumenting driver (otelsql, for
// instance) gets PostgreSQL's statements all the same.
package query

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// State of a call as the status lookup reports it.
type State string

const (
	// NotFound: no call with this key within retention. It was never seen,
	// or its record expired; a retry would run it.
	NotFound State = "not_found"
	// InFlight: an attempt has claimed the call and not committed an outcome.
	InFlight State = "in_flight"
	// Completed: the call's writes, effects and result are committed.
	Completed State = "completed"
	// Failed: the tool returned an error; nothing of its work was kept.
	Failed State = "failed"
	// OutcomeUnknown: the call was forwarded to a process whose work is
	// outside the call's transaction (a tool server behind mcp-outbox
	// proxy) and its outcome was lost. It may or may not have run. It is
	// never run again automatically: a retry gets an "outcome unknown"
	// error until an operator settles it.
	OutcomeUnknown State = "unknown"
	// Erased: the call's principal was forgotten (mcp-outbox outbox
	// forget-principal): its result and arguments are gone for good, and
	// the key stays used, so a retry runs nothing.
	Erased State = "erased"
)

// Status is the answer for one key.
type Status struct {
	Key       string `json:"key"`
	KeySource string `json:"keySource,omitempty"`
	State     State  `json:"state"`
	Message   string `json:"message"`
	Tool      string `json:"tool,omitempty"`
	CallID    string `json:"callId,omitempty"`
	// ToolCallID is the model's id for the tool call (Claude Code's
	// claudecode/toolUseId), as sent by the attempt that ran the call;
	// empty when its host sent none. It finds a call from a transcript; it
	// is not a key.
	ToolCallID string `json:"toolCallId,omitempty"`
	// TaskID is the id of the task the call runs as (MCP Tasks,
	// 2026-07-28), empty for a call that is no task; TaskStatus is the
	// task's status as tasks/get of the 2026-07-28 extension reports it:
	// working, completed (a tool result, isError or not), failed or
	// cancelled. The 2025-11-25 revision calls a task whose result has
	// isError failed: the status tool says so to a session of that
	// revision.
	TaskID      string          `json:"taskId,omitempty"`
	TaskStatus  string          `json:"taskStatus,omitempty"`
	Attempts    int             `json:"attempts,omitempty"`
	CreatedAt   *time.Time      `json:"createdAt,omitempty"`
	CompletedAt *time.Time      `json:"completedAt,omitempty"`
	ExpiresAt   *time.Time      `json:"expiresAt,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	Effects     []EffectStatus  `json:"effects"`
}

// EffectStatus is the delivery state of one outbox effect of a call (the
// effect itself, as a handler enqueues it, is outbox.Effect).
type EffectStatus struct {
	Seq            int        `json:"seq"`
	Destination    string     `json:"destination"`
	Method         string     `json:"method"`
	Path           string     `json:"path"`
	IdempotencyKey string     `json:"idempotencyKey"`
	State          string     `json:"state"`
	Attempts       int        `json:"attempts"`
	LastStatus     int        `json:"lastStatus,omitempty"`
	LastError      string     `json:"lastError,omitempty"`
	NextAttemptAt  *time.Time `json:"nextAttemptAt,omitempty"`
	DeliveredAt    *time.Time `json:"deliveredAt,omitempty"`
}

const selectCall = `
SELECT id, uid, key_source, tool, state, attempts, result, created_at, completed_at, expires_at, tool_call_id,
       coalesce(task_id, ''), task_end, erased_at
FROM calls WHERE principal = $1 AND key = $2`

const selectEffects = `
SELECT seq, destination, method, path, idempotency_key, state, attempts, last_status, last_error,
       next_attempt_at, delivered_at
FROM effects WHERE call_id = $1 ORDER BY seq`

// Lookup reports the status of principal's call with key at time now. A
// principal sees only its own calls: another principal's key is not found.
func Lookup(ctx context.Context, db *schema.DB, principal, key string, now time.Time) (*Status, error) {
	return LookupSealed(ctx, db, nil, principal, key, now)
}

// LookupSealed is Lookup on a database whose results were sealed under
// keys (nil: no key file); a result keys cannot open is left out and the
// message says why.
func LookupSealed(ctx context.Context, db *schema.DB, keys seal.KeyRing, principal, key string, now time.Time) (*Status, error) {
	s := sealing.Of(keys)
	if err := callkey.Validate(key); err != nil {
		return nil, err
	}
	st := &Status{Key: key, Effects: []EffectStatus{}}
	var (
		id                int64
		result            sql.NullString
		created, expires  int64
		completed         sql.NullInt64
		state, source, tl string
		taskEnd           string
		erased            sql.NullInt64
	)
	err := db.Read.QueryRowContext(ctx, selectCall, principal, key).Scan(
		&id, &st.CallID, &source, &tl, &state, &st.Attempts, &result, &created, &completed, &expires, &st.ToolCallID,
		&st.TaskID, &taskEnd, &erased)
	// An in_flight or unknown call is reported whatever its expiry: the
	// first is running, the second waits for an operator, and a retry of
	// neither would run it.
	if errors.Is(err, sql.ErrNoRows) || (err == nil && State(state) != InFlight && State(state) != OutcomeUnknown && expires <= now.UnixMilli()) {
		return &Status{Key: key, State: NotFound, Effects: []EffectStatus{},
			Message: "No call with this key within the retention window: it expired, was never seen, failed without being recorded (a fault the server logged), " +
				"or was a task cancelled before its commit (whose taskId tasks/get still answers). A retry would run it."}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up call: %w", err)
	}
	st.State, st.KeySource, st.Tool = State(state), source, tl
	if st.TaskID != "" {
		st.TaskStatus = taskStatus(state, taskEnd)
	}
	st.CreatedAt = ms(created)
	if completed.Valid {
		st.CompletedAt = ms(completed.Int64)
	}
	st.ExpiresAt = ms(expires)
	var unreadable error
	if result.Valid {
		plain, err := s.OpenString(ctx, db.Read, sealing.Ref{Row: fmt.Sprint(id), Column: "result", Principal: principal}, result.String)
		switch {
		case errors.Is(err, sealing.ErrErased):
			erased.Valid = true
		case err != nil:
			unreadable = err
		default:
			st.Result = json.RawMessage(plain)
		}
	}
	if erased.Valid {
		st.State = Erased
	}
	if st.Effects, err = effects(ctx, db, id); err != nil {
		return nil, err
	}
	st.Message = message(st)
	if unreadable != nil {
		st.Message += " The recorded result cannot be read: " + unreadable.Error()
	}
	return st, nil
}

// LookupArgs finds the call a client made without a key, by the fingerprint
// of principal, tool and arguments. On a database used with a key file it
// fails with [ErrKeyedFingerprints]: use LookupArgsSealed.
func LookupArgs(ctx context.Context, db *schema.DB, principal, tool string, args json.RawMessage, now time.Time) (*Status, error) {
	return LookupArgsSealed(ctx, db, nil, principal, tool, args, now)
}

// LookupArgsSealed is LookupArgs with keys' keyed fingerprints and sealed
// results (see [LookupSealed]).
func LookupArgsSealed(ctx context.Context, db *schema.DB, keys seal.KeyRing, principal, tool string, args json.RawMessage, now time.Time) (*Status, error) {
	s := sealing.Of(keys)
	canonical, err := callkey.Canonical(args)
	if err != nil {
		return nil, err
	}
	if err := loadHashKey(ctx, db, s); err != nil {
		return nil, err
	}
	st, err := LookupSealed(ctx, db, keys, principal, callkey.SealedFingerprint(s, principal, tool, canonical), now)
	if err == nil && st.State == NotFound && s.Keyed() {
		// Made before encryption was turned on: under its plain fingerprint.
		st, err = LookupSealed(ctx, db, keys, principal, callkey.Fingerprint(principal, tool, canonical), now)
	}
	if err == nil && st.State == NotFound {
		// The client sent no key: speak of what it sent.
		st.KeySource = string(callkey.SourceFingerprint)
		st.Message = "No identical call (same tool and arguments, without a key) within the fingerprint window: " +
			"it expired, was never seen, failed without being recorded (a fault the server logged), or was a task cancelled before its commit. " +
			"Making the call would run it."
	}
	return st, err
}

func effects(ctx context.Context, db *schema.DB, callID int64) ([]EffectStatus, error) {
	rows, err := db.Read.QueryContext(ctx, selectEffects, callID)
	if err != nil {
		return nil, fmt.Errorf("look up effects: %w", err)
	}
	defer rows.Close()
	out := []EffectStatus{}
	for rows.Next() {
		var (
			e         EffectStatus
			next      int64
			delivered sql.NullInt64
		)
		if err := rows.Scan(&e.Seq, &e.Destination, &e.Method, &e.Path, &e.IdempotencyKey, &e.State,
			&e.Attempts, &e.LastStatus, &e.LastError, &next, &delivered); err != nil {
			return nil, fmt.Errorf("look up effects: %w", err)
		}
		if e.State == "pending" {
			e.NextAttemptAt = ms(next)
		}
		if delivered.Valid {
			e.DeliveredAt = ms(delivered.Int64)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up effects: %w", err)
	}
	return out, nil
}

// Running is the status of a call an attempt in this process is running
// but whose claim is not committed yet (it rides in an open group-commit
// batch), so the table does not show it.
func Running(key, keySource, tool string) *Status {
	st := &Status{Key: key, KeySource: keySource, State: InFlight, Tool: tool, Effects: []EffectStatus{}}
	st.Message = message(st)
	return st
}

func message(st *Status) string {
	// A call made without a key is known by a fingerprint of its tool and
	// arguments that the client never saw: its retry is an identical call,
	// within the window the fingerprint lasts (ExpiresAt).
	retry, retryCap := "a retry with the same key", "A retry with the same key"
	if st.KeySource == "fingerprint" {
		retry = "an identical call (same tool and arguments, without a key) made before expiresAt"
		retryCap = "An identical call (same tool and arguments, without a key) made before expiresAt"
	}
	switch st.State {
	case InFlight:
		if st.KeySource == "fingerprint" {
			retry = "an identical call (same tool and arguments, without a key)"
		}
		return "An attempt is running this call and has not committed an outcome. If it dies, " + retry + " takes over and runs the call."
	case Completed:
		pending := 0
		for _, e := range st.Effects {
			if e.State != "delivered" {
				pending++
			}
		}
		m := "The call completed and its result is recorded; " + retry + " replays it without running the tool."
		if pending > 0 {
			m += fmt.Sprintf(" %d of its %d effects are not delivered yet.", pending, len(st.Effects))
		}
		return m
	case Erased:
		return "The call's principal was forgotten: its arguments and result were erased for good. The key stays used: " + retry + " runs nothing."
	case Failed:
		switch st.TaskStatus {
		case "cancelled":
			// Its row holds an error the layer wrote, not the tool's: the
			// tool's work rolled back when the cancel won over its commit.
			// The layer now sets such a row aside under a key of its own
			// (the next identical call runs anew), so a lookup by its
			// call's key finds one only if an older version wrote it.
			again := "To run it, make a new call with a new key."
			if st.KeySource == "fingerprint" {
				again = "After expiresAt an identical call runs as a new one."
			}
			return "The call ran as a task that was cancelled (tasks/cancel) before its commit: nothing of its work was kept, " +
				"and it will not run again. " + retryCap + " gets the cancelled task, or its cancellation as an error, and runs nothing. " + again
		case "failed":
			return "The call ran as a task that ended with an error (a fault or a protocol error of its tool, not a tool result); " +
				"nothing of its work was kept. " + retryCap + " replays the error."
		}
		return "The tool returned an error; nothing of its work was kept. " + retryCap + " replays the error."
	case OutcomeUnknown:
		m := "The call was forwarded to the tool server but its outcome was lost: it may or may not have run. " +
			"It will not run again automatically; " + retry + " gets an \"outcome unknown\" error until it is settled. "
		if st.KeySource == "fingerprint" {
			// outbox's claim sets such a call aside once its window passed.
			m = "The call was forwarded to the tool server but its outcome was lost: it may or may not have run. " +
				"It will not run again automatically; " + retry + " gets an \"outcome unknown\" error, " +
				"and after that runs as a new call. "
		}
		return m + "An operator settles it with `mcp-outbox outbox resolve-call`."
	}
	return ""
}

func ms(v int64) *time.Time {
	t := time.UnixMilli(v).UTC()
	return &t
}

// taskStatus is a task's status from its call's state and how the task
// ended (calls.task_end), as tasks/get reports it.
func taskStatus(state, end string) string {
	switch {
	case state == string(InFlight):
		return "working"
	case end != "":
		return end // cancelled or failed
	case state == string(OutcomeUnknown):
		return "failed"
	}
	return "completed" // a tool result, isError or not
}

// ErrKeyedFingerprints is LookupArgs on a database used with a key file: its
// fingerprints are keyed (HMAC under a key wrapped in data_keys), and a plain
// one would find nothing, answering that a call made there never was.
var ErrKeyedFingerprints = errors.New("the calls of this database are fingerprinted under a key of its key file " +
	"(it is used with encryption on): look them up with LookupArgsSealed and a Sealer of that key file")

// loadHashKey loads s's hash key from db when db has one: a Sealer made for
// reads alone (sealing.New, without the layer, which loads it in outbox.New)
// would otherwise compute plain fingerprints, find nothing, and tell the
// client that a call which is recorded would run. It only reads: a database
// without a hash key has no keyed fingerprints to find.
func loadHashKey(ctx context.Context, db *schema.DB, s *sealing.Sealer) error {
	if s.Keyed() {
		return nil
	}
	var one int
	err := db.Read.QueryRowContext(ctx, `SELECT 1 FROM data_keys WHERE purpose = 'hash' AND erased_at IS NULL LIMIT 1`).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look for the hash key: %w", err)
	}
	if s == nil {
		return ErrKeyedFingerprints
	}
	if err := s.LoadHashKey(ctx, db.Read); err != nil {
		return fmt.Errorf("fingerprints of this database are keyed: %w", err)
	}
	return nil
}
