package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// checkSealer readies s for the layer's keyed hashes, or refuses to start
// (ErrKeyRequired) when what the database needs is not there: no key file
// on an encrypted database, or a key file without the key that wraps the
// hash key. Either start would hash arguments without the secret, so a
// keyless retry would not match its first call and would run again.
// Keys missing for other data keys only make their values unreadable
// (their calls answer an error naming the key and never run again), so
// those are logged and the layer serves.
//
// It also returns until when a call without a key made before encryption
// was on may still name an identical call (the latest expiry of a plain
// fingerprint), 0 if none may.
func checkSealer(ctx context.Context, db *schema.DB, s *sealing.Sealer, logger *slog.Logger) (int64, error) {
	if s == nil {
		return 0, sealing.RequireKeyFile(ctx, db.Read, nil)
	}
	if err := s.LoadHashKey(ctx, db.Write); err != nil {
		var missing *seal.MissingKeyError
		if errors.As(err, &missing) {
			return 0, sealing.HashKeyMissing(missing)
		}
		return 0, err
	}
	missing, err := sealing.MissingKeys(ctx, db.Read, s.Ring())
	if err != nil {
		return 0, err
	}
	if len(missing) > 0 {
		logger.Warn("encryption keys named by the database are not in the key file: values under them cannot be read "+
			"(their calls answer an error naming the key, and are never run again)", "key_ids", missing)
	}
	var until sql.NullInt64
	if err := db.Read.QueryRowContext(ctx, selectPlainFingerprints, time.Now().UnixMilli()).Scan(&until); err != nil {
		return 0, fmt.Errorf("read plain fingerprints: %w", err)
	}
	return until.Int64, nil
}

// selectPlainFingerprints finds the latest expiry of a call recorded under
// a plain fingerprint ('fp_'; keyed ones are 'fk_').
const selectPlainFingerprints = `
SELECT max(expires_at) FROM calls
WHERE expires_at > $1 AND key_source = 'fingerprint' AND key LIKE 'fp~_%' ESCAPE '~'`

// callRef names a call's column for sealing: the call's id binds the value
// to its row.
func callRef(callID int64, column, principal string) sealing.Ref {
	return sealing.Ref{Row: strconv.FormatInt(callID, 10), Column: column, Principal: principal}
}

// effectRef names an effect's column: its Idempotency-Key, unique and
// known before the row is inserted, binds the value to the row.
func effectRef(key, column, principal string) sealing.Ref {
	return sealing.Ref{Row: key, Column: column, Principal: principal}
}

// openResult replaces a recorded result read from q by its plaintext; one
// that cannot be opened (erased, tampered, a missing key) keeps r.unreadable
// for the answer, which names the reason and never runs the call again.
func (l *Layer) openResult(ctx context.Context, q sealing.Querier, principal string, r *callRow) {
	if !r.result.Valid {
		if r.state == "completed" || r.state == "failed" {
			// Every outcome is recorded with its result; only
			// Forgetting a principal deletes one (and sets erased_at).
			r.unreadable = sealing.ErrErased
		}
		return
	}
	plain, err := l.sealer.OpenString(ctx, q, callRef(r.id, "result", principal), r.result.String)
	if err != nil {
		r.unreadable = err
		return
	}
	r.result = sql.NullString{String: plain, Valid: true}
}

// sealEffect seals an effect's headers and body with sealFn.
func sealEffect(sealFn func(sealing.Ref, []byte) ([]byte, error), key, principal, headers string, body []byte) (string, []byte, error) {
	h, err := sealFn(effectRef(key, "headers", principal), []byte(headers))
	if err != nil {
		return "", nil, fmt.Errorf("seal effect headers: %w", err)
	}
	if body != nil {
		if body, err = sealFn(effectRef(key, "body", principal), body); err != nil {
			return "", nil, fmt.Errorf("seal effect body: %w", err)
		}
	}
	return string(h), body, nil
}

// seal seals a value of the attempt's call in q, its transaction, looking
// the principal's data key up once per transaction: a call's result and
// its effects' headers and bodies are sealed under one key, found by one
// query. Statements there never take a call's context (group_unit.go).
func (a *attempt) seal(q handlerTx, ref sealing.Ref, plain []byte) ([]byte, error) {
	s := a.layer.sealer
	if s == nil {
		return plain, nil
	}
	if a.sealKey == nil || a.sealKeyTx != q || a.sealKey.Principal() != ref.Principal {
		var sq sealing.Querier = q
		if a.unit != nil && a.unit.tx() == q {
			sq = a.unit.querier()
		}
		k, err := s.Key(context.Background(), sq, ref.Principal)
		if err != nil {
			return nil, err
		}
		a.sealKey, a.sealKeyTx = k, q
	}
	return a.sealKey.Seal(ref, plain)
}

// unitQuerier runs the seal package's statements in a unit's transaction
// through the group's prepared statements, as the unit's own run: SQLite
// would otherwise parse them again for every call. (On PostgreSQL, a
// piped unit's run on its connection: pipe_postgres.go.) The unit's
// statements never take a context (see unit.exec).
type unitQuerier struct{ u *unit }

func (u *unit) querier() unitQuerier { return unitQuerier{u} }

func (q unitQuerier) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	return q.u.exec(query, args...)
}

func (q unitQuerier) QueryContext(_ context.Context, query string, args ...any) (*sql.Rows, error) {
	return q.u.query(query, args...)
}

func (q unitQuerier) QueryRowContext(_ context.Context, query string, args ...any) *sql.Row {
	return q.u.queryRow(query, args...)
}
