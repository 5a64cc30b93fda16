package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/mcp-outbox/mcp-outbox/schema"
	"github.com/mcp-outbox/mcp-outbox/schema/internal/handle"
)

// minConns is the fewest connections a pool handed to [FromPool] or
// [FromDB] may allow: a call holds one from its claim to its commit, and
// the layer needs another meanwhile (a lease renewal, the dispatcher, a
// readiness check) that must not wait for the call's handler to finish.
// Size a pool to the calls it serves at once, plus one.
const minConns = 2

// ErrPooledSessions is returned by [FromPool] and [FromDB] when the
// connections do not keep their server session between transactions:
// PgBouncer, or another pooler, in transaction or statement pooling mode.
// The layer needs a session per connection: it LISTENs for new effects,
// relaxes synchronous_commit for a session (claims, dispatch, purge) and
// restores it, and pgx's default statement cache prepares statements on
// the session. Behind a pooler in transaction mode a LISTEN is lost, a
// relaxed level leaks to another client's transactions, and a prepared
// statement is missing on the next server. Use pool_mode = session for
// the layer's database (a [databases] entry of its own in pgbouncer.ini),
// or connect to PostgreSQL directly.
var ErrPooledSessions = errors.New("connections do not keep their session between transactions " +
	"(PgBouncer in transaction or statement pooling mode?): give the layer pool_mode = session, or connect to PostgreSQL directly")

// FromPool makes a [schema.DB] of the caller's pgx pool, checks that the
// layer can use it, and applies the outbox migrations, as [schema.Open]
// does for a URL. The pool stays the caller's: DB.Close leaves it open,
// and the caller closes it after the DB. Everything else the layer does
// goes through the pool's connections, with the pool's own settings
// (TLS, authentication, BeforeConnect and AfterConnect, tracer, sizes):
//
//   - Statements run through a *sql.DB on the pool
//     (stdlib.OpenDBFromPool), which DB.Close closes; a call's statements
//     are pipelined on pgx's connection as with [schema.Open].
//   - The dispatcher's LISTEN holds one connection of its own, made by the
//     pool and then taken out of it (pgxpool.Conn.Hijack), so it runs
//     through the pool's connect path and does not count against its
//     MaxConns: the database sees up to MaxConns + 1 connections.
//   - Durability is the pool's: synchronous_commit as its connections have
//     it (a RuntimeParams entry, or the role's or server's setting). Off
//     is [schema.DurabilityNormal]; any other level is full, which the
//     layer relaxes for its own claims and restores to the connection's
//     level.
//   - The network bounds that [schema.Open] adds (connect timeout, TCP
//     keepalive, TCP_USER_TIMEOUT) are the pool's to set: without them a
//     partition that drops packets can hang a call for the kernel's
//     retransmission time (about 15 minutes on Linux). Set ConnectTimeout,
//     and keepalives and tcp_user_timeout through DialFunc.
//
// It fails with an error naming the setting when the pool allows fewer
// than 2 connections, or its connections do not keep their
// session ([ErrPooledSessions]).
func FromPool(ctx context.Context, pool *pgxpool.Pool) (*schema.DB, error) {
	if pool == nil {
		return nil, errors.New("open database: the pool is nil")
	}
	cfg := pool.Config()
	name := nameOf(*cfg.ConnConfig)
	if cfg.MaxConns < minConns {
		return nil, fmt.Errorf("open database %s: the pool allows %d connection(s), the layer needs at least %d: "+
			"set pgxpool.Config.MaxConns (pool_max_conns in the URL) to the calls served at once plus one",
			name, cfg.MaxConns, minConns)
	}
	db := stdlib.OpenDBFromPool(pool)
	return adopt(ctx, db, name, poolStore{pool: pool}, true, db.Close)
}

// FromDB makes a [schema.DB] of the caller's *sql.DB opened with pgx's
// database/sql driver (sql.Open("pgx", url), stdlib.OpenDB or
// stdlib.OpenDBFromPool), checks that the layer can use it, and applies
// the outbox migrations. The *sql.DB stays the caller's: DB.Close leaves it
// open. What [FromPool] says of durability, the network bounds and
// poolers holds here too. The dispatcher's LISTEN holds one of the
// *sql.DB's connections for as long as the layer runs, so a MaxOpenConns
// set must leave room for it: at least 3.
//
// A *sql.DB whose driver wraps pgx's (otelsql and the like) works with
// what a wrapper allows: statements go one round trip each, as through
// [schema.Options].Driver, and the dispatcher polls for new effects
// rather than listening. pgx's own tracer (pgx.ConnConfig.Tracer) keeps
// both.
func FromDB(ctx context.Context, db *sql.DB) (*schema.DB, error) {
	if db == nil {
		return nil, errors.New("open database: the *sql.DB is nil")
	}
	name := "postgres (the caller's *sql.DB)"
	pgxConn := false
	err := withConn(ctx, db, func(c *sql.Conn) error {
		return c.Raw(func(dc any) error {
			if sc, ok := dc.(*stdlib.Conn); ok {
				pgxConn = true
				name = nameOf(*sc.Conn().Config())
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", name, err)
	}
	if !pgxConn {
		// A wrapper of pgx's, or another database altogether: an SQLite
		// handle would otherwise fail later on a function it lacks.
		var v string
		if err := db.QueryRowContext(ctx, `SELECT current_setting('server_version')`).Scan(&v); err != nil {
			return nil, fmt.Errorf("open database: not a PostgreSQL database (for SQLite use sqlite.FromDB): %w", err)
		}
	}
	need := minConns
	if pgxConn {
		need++ // the listener's
	}
	if n := db.Stats().MaxOpenConnections; n > 0 && n < need {
		return nil, fmt.Errorf("open database %s: the *sql.DB allows %d connection(s), the layer needs at least %d: "+
			"SetMaxOpenConns to the calls served at once plus %d, or 0 for no limit", name, n, need, need-1)
	}
	var s schema.Store = wrappedStore{}
	if pgxConn {
		s = dbStore{db: db}
	}
	return adopt(ctx, db, name, s, pgxConn, nil)
}

// adopt checks db's sessions and durability and hands it to package
// schema, which migrates it. closeFn releases what the layer made.
func adopt(ctx context.Context, db *sql.DB, name string, s schema.Store, pgxConn bool, closeFn func() error) (*schema.DB, error) {
	fail := func(err error) (*schema.DB, error) {
		if closeFn != nil {
			err = errors.Join(err, closeFn())
		}
		return nil, err
	}
	if err := checkSessions(ctx, db, pgxConn); err != nil {
		if errors.Is(err, ErrPooledSessions) {
			return fail(fmt.Errorf("open database %s: %w", name, err))
		}
		if s.Unavailable(err) {
			return fail(fmt.Errorf("open database %s: %w: %w", name, schema.ErrUnavailable, err))
		}
		return fail(fmt.Errorf("open database %s: %w", name, err))
	}
	var level string
	if err := db.QueryRowContext(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&level); err != nil {
		return fail(fmt.Errorf("open database %s: read synchronous_commit: %w", name, err))
	}
	// Only off returns before the commit's WAL is flushed on this server;
	// local and the replication levels flush it first.
	d := schema.DurabilityFull
	if level == "off" {
		d = schema.DurabilityNormal
	}
	v, err := handle.Adopt(ctx, handle.Args{Dialect: string(schema.Postgres), Store: s, Write: db, Read: db,
		Path: name, Durability: string(d), Close: closeFn})
	if err != nil {
		return nil, err
	}
	return v.(*schema.DB), nil
}

// checkSessions fails with ErrPooledSessions when db's connections do not
// keep their server session between transactions, which is what a pooler
// in transaction or statement mode does: it hands a server connection to
// a client for a transaction, then to the next client. Asking PgBouncer
// its mode needs its admin console, which the layer's user cannot reach,
// so the property itself is tested. Client connection A asks its backend's
// pid; client connection B, in a transaction, asks its own, which holds
// B's backend; then A asks again. On sessions of their own the two differ
// and A's is the same both times. Behind a pooler in transaction mode B's
// transaction gets the backend A has just released (PgBouncer hands out
// the most recently used server first), or A, asking again, gets another:
// either way it shows. Statement mode refuses B's transaction. The
// statements carry no arguments and run as simple queries, so that a
// pooler that loses prepared statements does not fail the probe before
// it can say why (a driver that wraps pgx's may refuse pgx's argument
// that says so, and gets none).
func checkSessions(ctx context.Context, db *sql.DB, pgxConn bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	pid := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) (int64, error) {
		var p int64
		var args []any
		if pgxConn {
			args = append(args, pgx.QueryExecModeSimpleProtocol)
		}
		err := q.QueryRowContext(ctx, `SELECT pg_backend_pid()`, args...).Scan(&p)
		return p, err
	}
	a1, err := pid(a)
	if err != nil {
		return err
	}
	tx, err := b.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin a transaction: %w (%w)", err, ErrPooledSessions)
	}
	defer tx.Rollback()
	b1, err := pid(tx)
	if err != nil {
		return err
	}
	a2, err := pid(a)
	if err != nil {
		return err
	}
	if b1 == a1 || a2 != a1 {
		return fmt.Errorf("%w (one client connection ran on backends %d and %d, another in a transaction between them on %d)",
			ErrPooledSessions, a1, a2, b1)
	}
	return nil
}

func withConn(ctx context.Context, db *sql.DB, fn func(*sql.Conn) error) error {
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

// nameOf names a database for messages as DB.Path does: a URL without
// password or settings.
func nameOf(c pgx.ConnConfig) string {
	u := url.URL{Scheme: "postgres", Host: c.Host, Path: "/" + c.Database}
	if c.Port != 0 {
		u.Host += ":" + strconv.Itoa(int(c.Port))
	}
	if c.User != "" {
		u.User = url.User(c.User)
	}
	return u.String()
}

// poolStore is the store of a DB made by FromPool: it listens on a
// connection the pool made.
type poolStore struct {
	store
	pool *pgxpool.Pool
}

// Listen takes a connection from the pool and out of it (Hijack): it
// was made as the pool makes every connection (TLS, credentials fresh
// from BeforeConnect, AfterConnect), and the LISTEN it carries never goes
// back to the pool's other users. The pool may open another in its place.
func (s poolStore) Listen(ctx context.Context, _ string, channel string) (schema.Listener, error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		_ = listener{conn}.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen: %w", err)
	}
	return listener{conn}, nil
}

// dbStore is the store of a DB made by FromDB on pgx's driver: it listens
// on one of the *sql.DB's connections, held.
type dbStore struct {
	store
	db *sql.DB
}

// Listen holds a connection of the *sql.DB, made the way the caller
// configured it, and listens on it; Close discards it, LISTEN and all.
// database/sql cannot take a connection out of its pool, so it counts
// against MaxOpenConns while the layer runs.
func (s dbStore) Listen(ctx context.Context, _ string, channel string) (schema.Listener, error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	l := &heldListener{conn: c}
	err = c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("the connection is %T, not pgx's: %w", dc, schema.ErrNoListen)
		}
		_, err := sc.Conn().Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
		return err
	})
	if err != nil {
		_ = l.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen: %w", err)
	}
	return l, nil
}

type heldListener struct{ conn *sql.Conn }

// Wait waits inside Raw: pgx's connection may only be used there.
func (l *heldListener) Wait(ctx context.Context) error {
	return l.conn.Raw(func(dc any) error {
		_, err := dc.(*stdlib.Conn).Conn().WaitForNotification(ctx)
		return err
	})
}

// Close discards the connection rather than giving it back: it is
// listening, and under stdlib.OpenDBFromPool database/sql's discarding
// alone would return it to the pgx pool alive (see Discard).
func (l *heldListener) Close(ctx context.Context) error {
	_ = l.conn.Raw(func(dc any) error {
		closeConn(ctx, dc)
		return driver.ErrBadConn
	})
	return l.conn.Close()
}

// Discard closes pgx's connection under a database/sql one, so that
// whichever pool holds it drops it: database/sql's own discarding (Raw
// returning driver.ErrBadConn) closes the driver connection, which under
// stdlib.OpenDBFromPool only releases it, alive, to the pgx pool.
func (store) Discard(driverConn any) { closeConn(context.Background(), driverConn) }

func closeConn(ctx context.Context, driverConn any) {
	if sc, ok := driverConn.(*stdlib.Conn); ok {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = sc.Conn().Close(ctx)
	}
}

// wrappedStore is the store of a DB made by FromDB on a driver that wraps
// pgx's: there is no pgx connection to listen on, and nothing to connect
// with outside the caller's *sql.DB, so the dispatcher polls.
type wrappedStore struct{ store }

func (wrappedStore) Listen(context.Context, string, string) (schema.Listener, error) {
	return nil, fmt.Errorf("the *sql.DB's driver wraps pgx's: %w", schema.ErrNoListen)
}
