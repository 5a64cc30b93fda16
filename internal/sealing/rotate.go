package sealing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
)

// ErrKeyRequired: the database is encrypted and a process was started
// without a key it cannot do without. Starting anyway would store new
// values in plaintext behind the operator's back, and would hash
// arguments without the database's secret, so that a retry without an
// idempotency key no longer matches its first call and runs again.
var ErrKeyRequired = errors.New("the database is encrypted and a key it needs was not given")

// RequireKeyFile fails with ErrKeyRequired when s is nil and db holds live
// data keys: encryption is turned off by 'mcp-outbox outbox decrypt'
// ([github.com/mcp-outbox/mcp-outbox/outbox.Decrypt]), never by a start
// without the key file.
func RequireKeyFile(ctx context.Context, db *sql.DB, s *Sealer) error {
	if s != nil {
		return nil
	}
	ids, err := MissingKeys(ctx, db, nil)
	if err != nil || len(ids) == 0 {
		return err
	}
	return fmt.Errorf("%w: its data keys are wrapped by key %s and no key file was given: give it with --encryption-key-file "+
		"(MCP_OUTBOX_ENCRYPTION_KEY_FILE; Options.Keys in the library). Without it new values would be stored in plaintext, "+
		"recorded results could not be read, and a retry without an idempotency key would run the call again. "+
		"To turn encryption off, run 'mcp-outbox outbox decrypt' with the key file first",
		ErrKeyRequired, quoteIDs(ids))
}

// HashKeyMissing is the error of a start whose key file lacks the key that
// wraps the hash key (err, from LoadHashKey): every keyed hash would be
// computed anew without it, so no keyless retry would match.
func HashKeyMissing(err *seal.MissingKeyError) error {
	return fmt.Errorf("%w: key %q, which wraps the database's hash key, is not in the key file: without it arguments would be hashed "+
		"without the database's secret, and a retry without an idempotency key would not match its first call and would run again. "+
		"Put %q back in the key file (keep it there until 'mcp-outbox outbox reencrypt' has run with the new key first): %w",
		ErrKeyRequired, err.KeyID, err.KeyID, err)
}

func quoteIDs(ids []string) string {
	q := make([]string, len(ids))
	for i, id := range ids {
		q[i] = fmt.Sprintf("%q", id)
	}
	return strings.Join(q, ", ")
}

// MissingKeys returns the ids of the key-encryption keys that wrap live
// data keys in db and that ring lacks (all of them when ring is nil):
// values under them cannot be read until the key is back.
func MissingKeys(ctx context.Context, db *sql.DB, ring seal.KeyRing) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT DISTINCT key_id FROM data_keys WHERE erased_at IS NULL ORDER BY key_id`)
	if err != nil {
		return nil, fmt.Errorf("list key ids: %w", err)
	}
	defer rows.Close()
	var missing []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if ring == nil || !ring.Has(id) {
			missing = append(missing, id)
		}
	}
	return missing, rows.Err()
}

const (
	selectStaleDEKs = `
SELECT id, principal, purpose, key_id, wrapped FROM data_keys
WHERE erased_at IS NULL AND key_id <> $1 ORDER BY id LIMIT $2`
	rewrapDEK = `UPDATE data_keys SET key_id = $1, wrapped = $2 WHERE id = $3 AND key_id = $4 AND erased_at IS NULL`
)

type staleDEK struct {
	id, principal, purpose, keyID string
	wrapped                       []byte
}

// Rewrap wraps up to batch data keys that another key wraps under the
// ring's current key, in one transaction of db, and returns how many it
// rewrapped (0: none left). The data keys themselves, and so every sealed
// value, stay as they are.
func (s *Sealer) Rewrap(ctx context.Context, db *sql.DB, batch int) (int, error) {
	cur := s.ring.Current()
	rows, err := db.QueryContext(ctx, selectStaleDEKs, cur, batch)
	if err != nil {
		return 0, fmt.Errorf("list data keys: %w", err)
	}
	var stale []staleDEK
	for rows.Next() {
		var d staleDEK
		if err := rows.Scan(&d.id, &d.principal, &d.purpose, &d.keyID, &d.wrapped); err != nil {
			rows.Close()
			return 0, err
		}
		stale = append(stale, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(stale) == 0 {
		return 0, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	for _, d := range stale {
		ad := dekAD(d.id, d.principal, d.purpose)
		dek, err := s.ring.Unwrap(ctx, d.keyID, d.wrapped, ad)
		if err != nil {
			return 0, fmt.Errorf("data key %s: %w", d.id, err)
		}
		w, err := s.ring.Wrap(ctx, cur, dek, ad)
		if err != nil {
			return 0, fmt.Errorf("data key %s: %w", d.id, err)
		}
		if _, err := tx.ExecContext(ctx, rewrapDEK, cur, w, d.id, d.keyID); err != nil {
			return 0, fmt.Errorf("rewrap data key %s: %w", d.id, err)
		}
	}
	return len(stale), tx.Commit()
}
