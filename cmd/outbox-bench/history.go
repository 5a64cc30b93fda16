package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// history is a database filled with completed charge calls, each with its
// effect: delivered, except for the newest calls' ones, which are pending
// (a backlog left by a stopped server). It is made once per run, in the
// run's directory, for targets 5, 6 and 7.
type history struct {
	path    string
	calls   int
	pending int
	// firstPending is the id of the first pending effect: ids from it on
	// are the backlog, set pending again before every start.
	firstPending int64
}

// historyKey is call i's idempotency key (principal callkey.LocalPrincipal).
func historyKey(i int) string { return fmt.Sprintf("h-%d", i) }

// The seeding statements make their rows inside SQLite, a range of ids at a
// time (?1 to ?2): building and binding each row in Go took three times as
// long. ?3 is the unix ms of the last call (calls are one millisecond
// apart), ?4 the id of the first pending effect.
const (
	insertHistoryCalls = `
WITH RECURSIVE n(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM n WHERE i < $2)
INSERT INTO calls (id, uid, principal, key, key_source, tool, args_hash, state, result, created_at, completed_at, expires_at)
SELECT i, printf('call_%012d', i), $5, 'h-' || i, 'meta', 'charge', printf('%064x', i), 'completed',
    printf('{"content":[{"type":"text","text":"{\"charge_id\":%d,\"amount\":100,\"currency\":\"usd\"}"}],"structuredContent":{"charge_id":%d,"amount":100,"currency":"usd"}}', i, i),
    $3 - ($6 - i), $3 - ($6 - i), $3 + 2592000000
FROM n`
	insertHistoryEffects = `
WITH RECURSIVE n(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM n WHERE i < $2)
INSERT INTO effects (id, call_id, seq, destination, method, path, headers, body, idempotency_key, state, attempts,
    next_attempt_at, last_status, response, created_at, updated_at, delivered_at)
SELECT i, i, 1, 'payments', 'POST', '/v1/charges', '{"Content-Type":"application/json"}',
    printf('{"charge_id":%d,"amount":100,"currency":"usd"}', i), printf('call_%012d-1', i),
    iif(i >= $4, 'pending', 'delivered'), iif(i >= $4, 0, 1), $3 - ($6 - i), iif(i >= $4, 0, 200),
    iif(i >= $4, NULL, '{"id":"ch_1","object":"charge"}'), $3 - ($6 - i), $3 - ($6 - i), iif(i >= $4, NULL, $3 - ($6 - i))
FROM n`
)

// seedChunk is how many calls one execution of the seeding statements
// writes, between two progress reports.
const seedChunk = 100_000

// seedHistory writes calls calls, the last pending of them with a pending
// effect, to a new database at path: one transaction, prepared inserts,
// and synchronous=OFF, which only the seeding uses (a crash would merely
// spoil this scratch file).
func (e *env) seedHistory(ctx context.Context, name string, calls, pending int) (*history, error) {
	path := filepath.Join(e.dir, name)
	start := time.Now()
	db, err := openLedger(ctx, path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	// The writer is one connection, so these settings stay with it; it is
	// closed after the seeding.
	for _, p := range []string{"PRAGMA synchronous=OFF", "PRAGMA cache_size=-65536"} {
		if _, err := db.Write.ExecContext(ctx, p); err != nil {
			return nil, fmt.Errorf("seed history: %w", err)
		}
	}
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("seed history: %w", err)
	}
	defer tx.Rollback()
	h := &history{path: path, calls: calls, pending: pending, firstPending: int64(calls-pending) + 1}
	now := time.Now().UnixMilli()
	for _, q := range []struct{ what, stmt string }{{"calls", insertHistoryCalls}, {"effects", insertHistoryEffects}} {
		stmt, err := tx.PrepareContext(ctx, q.stmt)
		if err != nil {
			return nil, fmt.Errorf("seed history: %w", err)
		}
		for from := 1; from <= calls; from += seedChunk {
			to := min(from+seedChunk-1, calls)
			if _, err := stmt.ExecContext(ctx, from, to, now, h.firstPending, callkey.LocalPrincipal, calls); err != nil {
				stmt.Close()
				return nil, fmt.Errorf("seed history: %s %d to %d: %w", q.what, from, to, err)
			}
			if calls > seedChunk {
				e.logf("seeding %s: %s of %s %s", name, group(int64(to)), group(int64(calls)), q.what)
			}
		}
		stmt.Close()
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("seed history: %w", err)
	}
	// Leave no WAL behind: the first start would pay for checkpointing it.
	if _, err := db.Write.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return nil, fmt.Errorf("seed history: %w", err)
	}
	if calls > seedChunk {
		e.logf("seeded %s calls and %s pending effects in %s", group(int64(calls)), group(int64(pending)), time.Since(start).Round(time.Millisecond))
	}
	return h, nil
}
