package schema

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// CheckReady reports whether the database can serve: every outbox
// migration this binary knows is applied, and a write succeeds. The write
// is relaxed (no fsync of its own), so probing every few seconds costs
// next to nothing.
func (db *DB) CheckReady(ctx context.Context) error {
	ms, err := ReadMigrations(outboxMigrations)
	if err != nil {
		return err
	}
	v, err := db.Version(ctx, OutboxSet)
	if err != nil {
		return err
	}
	if v != len(ms) {
		return fmt.Errorf("outbox schema at version %d, this binary needs %d", v, len(ms))
	}
	err = db.Relaxed(ctx, func(c *sql.Conn) error {
		_, err := c.ExecContext(ctx, `
INSERT INTO readiness (id, checked_at) VALUES (1, ?1)
ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at`, time.Now().UnixMilli())
		return err
	})
	if err != nil {
		return fmt.Errorf("write to database: %w", err)
	}
	return nil
}
