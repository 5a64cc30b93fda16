package schema

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// CheckReady reports whether the database can serve: every outbox
// migration this binary knows is applied, a write succeeds, and the file
// has room to grow. The write is relaxed (no fsync of its own), so probing
// every few seconds costs next to nothing.
func (db *DB) CheckReady(ctx context.Context) error {
	set := outboxMigrations
	if db.Dialect == Postgres {
		set = postgresMigrations
	}
	ms, err := ReadMigrations(set)
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
INSERT INTO readiness (id, checked_at) VALUES (1, $1)
ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at`, time.Now().UnixMilli())
		if err != nil || db.Dialect == Postgres {
			return err
		}
		return roomToGrow(ctx, c)
	})
	if err != nil {
		return fmt.Errorf("write to database: %w", err)
	}
	return nil
}

// roomToGrow fails when the database is at its size limit. The readiness
// write above updates a row in place and needs no new page, so it goes on
// succeeding in a database at max_page_count while every call's claim,
// which inserts, fails with SQLITE_FULL. The limit is a setting of the
// connection, so the writer's own is read. (A full disk, by contrast,
// fails the write itself once the log must grow.)
func roomToGrow(ctx context.Context, c *sql.Conn) error {
	var pages, limit, free int64
	for _, p := range []struct {
		pragma string
		v      *int64
	}{{"page_count", &pages}, {"max_page_count", &limit}, {"freelist_count", &free}} {
		if err := c.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(p.v); err != nil {
			return fmt.Errorf("read %s: %w", p.pragma, err)
		}
	}
	if free == 0 && pages >= limit {
		return fmt.Errorf("database is full: %d pages, its limit (max_page_count), and none free", pages)
	}
	return nil
}
