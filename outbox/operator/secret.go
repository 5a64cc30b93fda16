package operator

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// minSessionKey is the shortest Options.SessionKey accepted: HMAC-SHA256
// gains nothing from a longer key, and loses from a shorter one.
const minSessionKey = 32

// The key kept in the database when none is configured. Replicas behind a
// round-robin balancer must all verify what any of them signed, and the
// database is the one thing they share, so the key is kept there (table
// operator_secret, one row) rather than in a file of one host. The first
// process to need it inserts a random key; a concurrent first start of
// another replica loses the insert (ON CONFLICT DO NOTHING) and reads the
// winner's, so both end up with the same key. Anyone who can read the
// database can forge a session; they can also change the outbox directly,
// so the key adds no exposure the database does not already have.
const (
	selectOperatorSecret = `SELECT secret FROM operator_secret WHERE id = 1`
	insertOperatorSecret = `
INSERT INTO operator_secret (id, secret, created_at) VALUES (1, $1, $2)
ON CONFLICT (id) DO NOTHING`
)

// sessionKeyWhere says where the key came from, for the start-up log.
const (
	keyConfigured = "Options.SessionKey"
	keyInDatabase = "database table operator_secret"
)

// loadSessionKey returns the configured key, or the database's, creating
// it there if there is none yet, and says where it is kept and whether
// this call created it.
func loadSessionKey(ctx context.Context, db *schema.DB, configured []byte) (key []byte, where string, created bool, err error) {
	if configured != nil {
		return configured, keyConfigured, false, nil
	}
	// Through the writer, as the insert below: the read pool's SQLite
	// connections may hold a snapshot from before another replica's insert.
	err = db.Write.QueryRowContext(ctx, selectOperatorSecret).Scan(&key)
	if err == nil {
		return key, keyInDatabase, false, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, "", false, fmt.Errorf("read operator session key: %w", err)
	}
	fresh := make([]byte, 32)
	rand.Read(fresh) // never fails (crypto/rand panics rather than return an error)
	res, err := db.Write.ExecContext(ctx, insertOperatorSecret, fresh, time.Now().UnixMilli())
	if err != nil {
		return nil, "", false, fmt.Errorf("store operator session key: %w", err)
	}
	n, _ := res.RowsAffected()
	if err := db.Write.QueryRowContext(ctx, selectOperatorSecret).Scan(&key); err != nil {
		return nil, "", false, fmt.Errorf("read operator session key: %w", err)
	}
	return key, keyInDatabase, n == 1, nil
}

// subkey derives a key for one use from the session key, so that a
// signature made for one thing (a flash message) can never pass for
// another (a session).
func subkey(key []byte, use string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("mcp-outbox operator " + use))
	return m.Sum(nil)
}
