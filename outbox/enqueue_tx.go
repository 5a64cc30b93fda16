package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
)

// EnqueueTx adds an effect to the outbox inside tx, a transaction the
// caller began on the layer's database (the Write pool of the *schema.DB
// given to [New]), outside any MCP call: in an HTTP handler or a job, next
// to the rows the effect belongs with. The effect commits or rolls back
// with tx: no dispatcher sees it before tx commits, and it is gone if tx
// rolls back. EnqueueTx neither commits nor rolls back tx.
//
// It returns the effect's Idempotency-Key, which the dispatcher sends on
// every delivery attempt. The key is new on every call: code that runs
// again after its transaction committed enqueues a second effect, so make
// the transaction itself record that the work is done.
//
// Delivery: on PostgreSQL, the commit wakes every dispatcher (a trigger on
// effects notifies them). On SQLite the dispatcher finds the effect at its
// next poll ([dispatch.Options.PollInterval]); the layer cannot see tx
// commit, so the function given to [Layer.OnEnqueue] is not called: call
// [Runner.Notify] (on what [Layer.Start] returned) after Commit to deliver
// at once.
//
// tx must be a transaction of the *schema.DB's Write pool: the layer
// cannot check where a *sql.Tx was begun, and an effect inserted through
// another connection commits apart from the rows it belongs with.
//
// Inside a tool's handler, use [Tx.Enqueue] instead: its effect commits
// with the call's outcome.
func (l *Layer) EnqueueTx(ctx context.Context, tx *sql.Tx, e Effect) (string, error) {
	if tx == nil {
		return "", errors.New("outbox: enqueue effect: nil transaction")
	}
	if attemptFrom(ctx) != nil {
		// Inside a handler the effect would commit apart from the call
		// (on PostgreSQL), or wait forever for the SQLite writer the
		// handler itself holds.
		return "", errors.New("outbox: EnqueueTx inside a tool handler: use the handler's Tx.Enqueue, which commits the effect with the call")
	}
	if err := l.checkEffect(&e); err != nil {
		return "", err
	}
	headers, err := effectHeaders(e)
	if err != nil {
		return "", err
	}
	key := standaloneEffectKey()
	now := l.nowMS()
	// No call: call_id is NULL, and the effect is the first and only of
	// its sequence, so nothing orders it behind another effect.
	// No call, so no principal: the layer's own data key ('') seals it.
	headers, body, err := sealEffect(func(ref sealing.Ref, v []byte) ([]byte, error) {
		return l.sealer.Seal(context.Background(), tx, ref, v)
	}, key, "", headers, e.Body)
	if err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, insertEffect,
		nil, nil, 1, e.Destination, e.Method, e.Path, headers, body, key, now, now, now, traceparentOf(ctx)); err != nil {
		return "", fmt.Errorf("outbox: enqueue effect: %w", err)
	}
	return key, nil
}

// checkEffect validates an effect and fills in its defaults, for
// [Tx.Enqueue] and [Layer.EnqueueTx] alike: whatever an effect must be to
// be enqueued is checked here, once.
func (l *Layer) checkEffect(e *Effect) error {
	if err := validateEffect(e); err != nil {
		return err
	}
	return l.checkDestination(e.Destination)
}

// effectHeaders is the JSON stored in effects.headers.
func effectHeaders(e Effect) (string, error) {
	if e.Header == nil {
		return "{}", nil
	}
	b, err := json.Marshal(e.Header)
	if err != nil {
		return "", fmt.Errorf("outbox: effect headers: %w", err)
	}
	return string(b), nil
}

// standaloneEffectKey is the Idempotency-Key of an effect enqueued outside
// a call: random, so it cannot meet a call's keys (call_…-n) or another's.
func standaloneEffectKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("outbox: read random: %v", err))
	}
	return "effect_" + hex.EncodeToString(b[:])
}
