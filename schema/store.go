package schema

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// A Store is what this package needs from a database whose client library
// it does not link itself. The core (schema, outbox, query) speaks both
// dialects' SQL and chooses by [DB.Dialect]; what only a client library
// can do, a Store does: name the database/sql driver, turn a URL into its
// data source name, read its errors, and hold a connection that listens.
// PostgreSQL's Store is in the package schema/postgres, which registers it
// when a program imports it, so that a program that uses only SQLite links
// no PostgreSQL client.
type Store interface {
	// Dialect is the SQL the store speaks; Register files the store under it.
	Dialect() Dialect
	// DriverName is the database/sql driver the store registered.
	DriverName() string
	// DSN is the data source name for a target URL, with the settings the
	// layer relies on (see [Open]) added at durability d.
	DSN(target string, d Durability) (string, error)
	// Unavailable reports whether err says the store could not be
	// reached, went away or refuses work for want of resources: the store
	// failed, not the statement.
	Unavailable(err error) bool
	// CommitRolledBack reports whether err is a COMMIT that the store
	// answered by rolling back, because an error had ended the
	// transaction before: nothing of it committed, which is certain.
	CommitRolledBack(err error) bool
	// Listen connects to dsn outside any pool and listens on channel.
	Listen(ctx context.Context, dsn, channel string) (Listener, error)
}

// A Listener is a connection that listens for a store's notifications.
type Listener interface {
	// Wait blocks until a notification arrives, and fails when ctx ends
	// or the connection does; a failed Listener is closed and replaced.
	Wait(ctx context.Context) error
	// Close ends the connection; the store may be what failed, so ctx
	// bounds the goodbye.
	Close(ctx context.Context) error
}

var (
	storesMu sync.RWMutex
	stores   = map[Dialect]Store{}
)

// Register makes a store available to [Open] for its dialect. A store's
// package calls it from init, so that a blank import is all a program
// needs; registering a dialect twice panics, as sql.Register does.
func Register(s Store) {
	storesMu.Lock()
	defer storesMu.Unlock()
	if s == nil {
		panic("schema: Register store is nil")
	}
	if s.Dialect() == SQLite {
		panic("schema: Register: SQLite is built in")
	}
	if _, dup := stores[s.Dialect()]; dup {
		panic(fmt.Sprintf("schema: Register called twice for %s", s.Dialect()))
	}
	stores[s.Dialect()] = s
}

// storeFor is the registered store of dialect d, or an error that says
// which package to import.
func storeFor(d Dialect) (Store, error) {
	storesMu.RLock()
	s, ok := stores[d]
	storesMu.RUnlock()
	if !ok {
		pkg := "github.com/mcp-outbox/mcp-outbox/schema/" + string(d)
		return nil, fmt.Errorf("no %s store is linked into this program: import _ %q", d, pkg)
	}
	return s, nil
}

// Unavailable reports whether err says that the database failed rather
// than the statement: on PostgreSQL, the server could not be reached, went
// away or refuses work for want of resources (its Store says, by the
// client library's errors). On SQLite it is always false: the file's
// failures are told by result code where they are met.
func (db *DB) Unavailable(err error) bool {
	return err != nil && db.store != nil && db.store.Unavailable(err)
}

// CommitRolledBack reports whether err is a COMMIT that PostgreSQL
// answered with ROLLBACK: an error had ended the transaction before, so
// nothing of it committed. Always false on SQLite.
func (db *DB) CommitRolledBack(err error) bool {
	return err != nil && db.store != nil && db.store.CommitRolledBack(err)
}

// ErrUnavailable marks an [Open] that failed because the store could not
// be reached, went away while migrating, or refused work for want of
// resources ([DB.Unavailable] of the error): trying again later may
// succeed, as it may not for a wrong URL, a refused password or a newer
// schema. A server started before its database waits on it (mcp-outbox
// serve does).
var ErrUnavailable = errors.New("the database is unavailable")

// ErrNoListen is returned by [DB.Listen] on a store without notifications
// (SQLite, whose writers are all in one process's layer).
var ErrNoListen = errors.New("the store has no notifications")

// Listen opens a connection of its own, outside the pool, that listens on
// channel (a PostgreSQL identifier). It uses the store's own client, not
// Options.Driver: a wrapping driver instruments the pool's statements,
// and a listener runs none after LISTEN.
func (db *DB) Listen(ctx context.Context, channel string) (Listener, error) {
	if db.store == nil {
		return nil, fmt.Errorf("listen on %s: %w", channel, ErrNoListen)
	}
	return db.store.Listen(ctx, db.dsn, channel)
}
