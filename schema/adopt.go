package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema/internal/handle"
)

func init() { handle.Adopt = adopt }

// adopt makes a DB of a handle the user keeps (handle.Args), for
// schema/postgres's FromPool and FromDB and schema/sqlite's FromDB, which
// have checked it first: pinged and migrated as Open's is, and closed by
// a.Close, which never closes the user's handle.
func adopt(ctx context.Context, a handle.Args) (any, error) {
	closeFn := a.Close
	if closeFn == nil {
		closeFn = func() error { return nil }
	}
	fail := func(err error) (any, error) {
		return nil, errors.Join(err, closeFn())
	}
	db := &DB{Write: a.Write, Read: a.Read, Path: a.Path, Durability: Durability(a.Durability),
		Dialect: Dialect(a.Dialect), close: closeFn}
	if _, err := ParseDurability(a.Durability); err != nil {
		return fail(err)
	}
	set := outboxMigrations
	if db.Dialect == Postgres {
		s, ok := a.Store.(Store)
		if !ok {
			return fail(fmt.Errorf("open database %s: no store for %s", a.Path, a.Dialect))
		}
		db.store, set = s, postgresMigrations
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.Write.PingContext(pctx); err != nil {
		if db.Unavailable(err) {
			return fail(fmt.Errorf("open database %s: %w: %w", a.Path, ErrUnavailable, err))
		}
		return fail(fmt.Errorf("open database %s: %w", a.Path, err))
	}
	if err := db.Migrate(ctx, OutboxSet, set); err != nil {
		if db.Unavailable(err) {
			return fail(fmt.Errorf("%w: %w", ErrUnavailable, err))
		}
		return fail(err)
	}
	return db, nil
}
