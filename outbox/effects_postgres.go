package outbox

import "github.com/mcp-outbox/mcp-outbox/schema"

// On PostgreSQL a recorded call's effects are not inserted when the handler
// enqueues them but with its outcome, in the outcome's statement: each
// effect would otherwise cost a round trip of its own, which across a
// network is most of what a call costs. Nothing is lost by waiting: an
// effect is invisible to the dispatcher until the outcome commits, and
// gone if it does not; its Idempotency-Key is the call's uid and its
// number, known when Enqueue returns. What changes is where a failure of
// the insert shows: at the commit (the call is not recorded, and a retry
// runs it) instead of at Enqueue. SQLite has no INSERT inside a WITH, and
// no network: there Enqueue inserts at once.

// pendingEffect is an effect enqueued and not yet written.
type pendingEffect struct {
	seq                                     int
	destination, method, path, headers, key string
	body                                    []byte
	traceparent                             string
	at                                      int64
}

// defersEffects reports whether the attempt's effects go with its outcome.
func (a *attempt) defersEffects() bool {
	return a.layer.db.Dialect == schema.Postgres && a.recorded()
}

// recordOutcomeWithEffects is recordOutcome (its parameters $1 to $6) with
// the call's effects inserted by the same statement. The insert runs
// whether or not the update matches; when it does not, the attempt does
// not commit, and the transaction rolls back with the effects.
const recordOutcomeWithEffects = `
WITH effects_in AS (
  INSERT INTO effects (call_id, principal, seq, destination, method, path, headers, body, idempotency_key,
                       next_attempt_at, created_at, updated_at, traceparent)
  SELECT $5, $16::text, e.seq, e.destination, e.method, e.path, e.headers, e.body, e.key, e.at, e.at, e.at, e.traceparent
  FROM unnest($7::integer[], $8::text[], $9::text[], $10::text[], $11::text[], $12::bytea[], $13::text[], $14::bigint[], $15::text[])
       AS e(seq, destination, method, path, headers, body, key, at, traceparent))
UPDATE calls SET state = $1, result = $2, completed_at = $3, expires_at = $4, owner = '', lease_until = 0, task_params = NULL
WHERE id = $5 AND owner = $6 AND state = 'in_flight' AND task_cancel = 0`

// effectColumns lays the pending effects out as the arrays of
// recordOutcomeWithEffects ($7 to $15), and their call's principal ($16).
func effectColumns(principal string, effects []pendingEffect) []any {
	n := len(effects)
	var (
		seq                                            = make([]int32, n)
		destination, method, path, headers, key, trace = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		body                                           = make([][]byte, n)
		at                                             = make([]int64, n)
	)
	for i, e := range effects {
		seq[i], destination[i], method[i], path[i], headers[i] = int32(e.seq), e.destination, e.method, e.path, e.headers
		body[i], key[i], at[i], trace[i] = e.body, e.key, e.at, e.traceparent
	}
	return []any{seq, destination, method, path, headers, body, key, at, trace, principal}
}
