package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/netfault"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
	"github.com/mcp-outbox/mcp-outbox/schema/postgres"
)

// userPool is the pool a program configures, closed when the test ends
// (after any DB made of it).
func userPool(t *testing.T, u string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A layer on the program's own pgx pool runs a call, replays its retry and
// delivers its effect; DB.Close leaves the pool open.
func TestFromPool_EndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := userPool(t, pgtest.Database(t), nil)
	db, err := postgres.FromPool(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if db.Dialect != schema.Postgres || db.Durability != schema.DurabilityFull || !strings.HasPrefix(db.Path, "postgres://postgres@127.0.0.1:") {
		t.Errorf("DB = %s %s %s", db.Dialect, db.Durability, db.Path)
	}
	t.Run("Call", func(t *testing.T) { outboxtest.EndToEnd(t, db) })
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM handle_notes`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("after DB.Close the user's pool: %d notes, %v", n, err)
	}
}

// The same on a *sql.DB of pgx's driver, opened from a URL or on a pool.
func TestFromDB_EndToEnd(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		open func(t *testing.T, u string) *sql.DB
	}{
		{"SQLOpen", func(t *testing.T, u string) *sql.DB {
			db, err := sql.Open("pgx", u)
			if err != nil {
				t.Fatal(err)
			}
			return db
		}},
		// The fewest connections FromDB accepts: the listener holds one.
		{"ThreeConns", func(t *testing.T, u string) *sql.DB {
			db, err := sql.Open("pgx", u)
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(3)
			return db
		}},
		{"OpenDBFromPool", func(t *testing.T, u string) *sql.DB { return stdlib.OpenDBFromPool(userPool(t, u, nil)) }},
		// A driver that wraps pgx's: no pipeline and no LISTEN, the
		// dispatcher polls.
		{"WrappedDriver", func(t *testing.T, u string) *sql.DB {
			db, err := sql.Open(faultdb.NewPostgres(1).DriverName(), u)
			if err != nil {
				t.Fatal(err)
			}
			return db
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			user := c.open(t, pgtest.Database(t))
			t.Cleanup(func() { user.Close() })
			db, err := postgres.FromDB(ctx, user)
			if err != nil {
				t.Fatal(err)
			}
			outboxtest.EndToEnd(t, db)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			if err := user.PingContext(ctx); err != nil {
				t.Fatalf("after DB.Close the user's *sql.DB: %v", err)
			}
		})
	}
}

// The dispatcher on a pool-made DB listens: an effect that another
// replica commits is delivered at once, though this dispatcher polls only
// once an hour. Without the LISTEN it would wait for that hour.
func TestFromPool_ListenWakesTheDispatcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.Database(t)
	// The fewest connections FromPool accepts: the listener is not one.
	pool := userPool(t, u, func(c *pgxpool.Config) { c.MaxConns = 2 })
	db, err := postgres.FromPool(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := outboxtest.StartNoter(t, db, time.Hour)
	// The listener is in place, on a connection the pool made and let go.
	deadline := time.Now().Add(30 * time.Second)
	for outboxtest.Count(t, db.Read, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN%'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no connection listens after 30s")
		}
		time.Sleep(10 * time.Millisecond) // polls a condition, not a result
	}
	// Another replica, which runs no dispatcher, commits an effect.
	other, err := schema.Open(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	o := outboxtest.StartNoterNoDispatcher(t, other)
	if res := outboxtest.Call(t, o.Session, "note", "from-the-other", map[string]any{"note": "woken"}); res.IsError {
		t.Fatal(outboxtest.Text(res))
	}
	select {
	case b := <-n.Delivered:
		if b != `"woken"` {
			t.Fatalf("delivered %s", b)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the effect was not delivered within 30s: the dispatcher was not woken")
	}
}

// A pool too small for the layer is refused by the setting's name.
func TestFromPool_TooSmall(t *testing.T) {
	t.Parallel()
	pool := userPool(t, pgtest.Database(t), func(c *pgxpool.Config) { c.MaxConns = 1 })
	_, err := postgres.FromPool(context.Background(), pool)
	if err == nil || !strings.Contains(err.Error(), "MaxConns") {
		t.Fatalf("FromPool: %v, want an error naming MaxConns", err)
	}
	user, err := sql.Open("pgx", pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	user.SetMaxOpenConns(2) // the listener holds one: 3 are needed
	_, err = postgres.FromDB(context.Background(), user)
	if err == nil || !strings.Contains(err.Error(), "SetMaxOpenConns") {
		t.Fatalf("FromDB: %v, want an error naming SetMaxOpenConns", err)
	}
}

// Relaxed gives the connection back at the level it had, which on the
// user's pool may be their own (set by AfterConnect), not the server's
// default that RESET would restore.
func TestFromPool_RelaxedRestoresTheConnectionsLevel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := userPool(t, pgtest.Database(t), func(c *pgxpool.Config) {
		c.MaxConns = 2
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, `SET synchronous_commit = remote_write`)
			return err
		}
	})
	db, err := postgres.FromPool(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Relaxed(ctx, func(c *sql.Conn) error {
		var level string
		if err := c.QueryRowContext(ctx, `SHOW synchronous_commit`).Scan(&level); err != nil {
			return err
		}
		if level != "off" {
			t.Errorf("inside Relaxed: synchronous_commit = %s, want off", level)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	conns := pool.AcquireAllIdle(ctx)
	if len(conns) == 0 {
		t.Fatal("no idle connections")
	}
	for _, c := range conns {
		var level string
		if err := c.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&level); err != nil {
			t.Fatal(err)
		}
		if level != "remote_write" {
			t.Errorf("a connection of the pool is at synchronous_commit = %s after Relaxed, want its own remote_write", level)
		}
		c.Release()
	}
}

// Durability is the pool's: synchronous_commit = off on its connections
// is DurabilityNormal; local, which flushes the commit on this server
// before it returns, is full.
func TestFromPool_DurabilityIsThePools(t *testing.T) {
	t.Parallel()
	for level, want := range map[string]schema.Durability{"off": schema.DurabilityNormal, "local": schema.DurabilityFull} {
		pool := userPool(t, pgtest.Database(t), func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["synchronous_commit"] = level
		})
		db, err := postgres.FromPool(context.Background(), pool)
		if err != nil {
			t.Fatal(err)
		}
		if db.Durability != want {
			t.Errorf("synchronous_commit = %s: Durability = %s, want %s", level, db.Durability, want)
		}
		db.Close()
	}
}

// A fresh call on the program's pool costs the 3 round trips it costs on
// schema.Open's (outbox/postgres_roundtrips_test.go): the pool's
// connections are pgx's under database/sql, so the layer pipelines. That
// holds in every query exec mode of pgx's but describe_exec, which
// describes each statement before it sends it: the layer allows it, at
// twice the round trips.
func TestFromPool_RoundTripsPerCall(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode  string
		trips int64
	}{{"cache_statement", 3}, {"cache_describe", 3}, {"exec", 3}, {"simple_protocol", 3}, {"describe_exec", 6}} {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			got := freshCallTrips(t, "default_query_exec_mode="+c.mode)
			t.Logf("%s: %d round trips per fresh call", c.mode, got)
			if got != c.trips {
				t.Errorf("a fresh key's call on the user's pool (%s) took %d round trips, want %d", c.mode, got, c.trips)
			}
		})
	}
}

// freshCallTrips counts the round trips of a fresh key's call on a pool
// whose URL has query, through a proxy.
func freshCallTrips(t *testing.T, query string) int64 {
	direct := pgtest.Database(t)
	// Migrated first without the proxy's delay, which would make each of
	// the migrations' statements cost it.
	if db, err := postgres.FromPool(context.Background(), userPool(t, direct, nil)); err != nil {
		t.Fatal(err)
	} else {
		db.Close()
	}
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	p.SetDelay(20*time.Millisecond, 0)
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	pool := userPool(t, withQuery(u.String(), query), nil)
	db, err := postgres.FromPool(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	// No dispatcher: its rounds would count.
	n := outboxtest.StartNoterNoDispatcher(t, db)
	idle := func() {
		deadline := time.Now().Add(30 * time.Second)
		for db.Write.Stats().InUse != 0 || pool.Stat().AcquiredConns() != 0 {
			if time.Now().After(deadline) {
				t.Fatal("connections still in use after 30s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	trips := func(key string) int64 {
		idle()
		before := p.RoundTrips()
		if res := outboxtest.Call(t, n.Session, "note", key, map[string]any{"note": key}); res.IsError {
			t.Fatalf("%s: %s", key, outboxtest.Text(res))
		}
		idle()
		return p.RoundTrips() - before
	}
	trips("warm-1")
	trips("warm-2")
	return trips("fresh")
}

// TestPgBouncer: behind PgBouncer in transaction or statement pooling
// mode the layer is refused at start, by name; in session mode it works
// end to end. A real PgBouncer, started for the test (skipped where none
// is installed).
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	server := pgtest.Database(t)
	for _, c := range []struct {
		mode   string
		refuse bool
	}{{"transaction", true}, {"statement", true}, {"session", false}} {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			u := startPgBouncer(t, server, c.mode)
			ctx := context.Background()
			for _, via := range []string{"FromPool", "FromDB"} {
				var db *schema.DB
				var err error
				if via == "FromPool" {
					db, err = postgres.FromPool(ctx, userPool(t, u, nil))
				} else {
					user, oerr := sql.Open("pgx", u)
					if oerr != nil {
						t.Fatal(oerr)
					}
					t.Cleanup(func() { user.Close() })
					db, err = postgres.FromDB(ctx, user)
				}
				if c.refuse {
					if !errors.Is(err, postgres.ErrPooledSessions) || !strings.Contains(err.Error(), "pool_mode = session") {
						t.Fatalf("%s: %v, want ErrPooledSessions", via, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", via, err)
				}
				if via == "FromPool" {
					t.Run("Call", func(t *testing.T) { outboxtest.EndToEnd(t, db) })
				}
				db.Close()
			}
		})
	}
}

// On a *sql.DB whose driver wraps pgx's there is no connection to listen
// on: the dispatcher says once that it polls, and does not warn and retry
// for ever.
func TestFromDB_WrappedDriverPollsQuietly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	user, err := sql.Open(faultdb.NewPostgres(1).DriverName(), pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { user.Close() })
	db, err := postgres.FromDB(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var logs outboxtest.LogBuffer
	l, err := outbox.New(db, &outbox.Options{Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(logs.Records(t, "no notifications of new effects: polling")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no record that the dispatcher polls after 30s; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond) // polls a condition, not a result
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if w := logs.Records(t, "listen for new effects; polling meanwhile"); len(w) != 0 {
		t.Errorf("the dispatcher warned %d times that it will listen again: %v", len(w), w)
	}
}

// An SQLite handle given to FromDB is told where it belongs.
func TestFromDB_NotPostgreSQL(t *testing.T) {
	t.Parallel()
	lite, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	_, err = postgres.FromDB(context.Background(), lite)
	if err == nil || !strings.Contains(err.Error(), "not a PostgreSQL database (for SQLite use sqlite.FromDB)") {
		t.Fatalf("FromDB(an SQLite handle): %v", err)
	}
}

// The layer reads the errors of the user's pool as it reads schema.Open's:
// a connection gone is Unavailable, and a COMMIT that PostgreSQL answered
// with ROLLBACK is CommitRolledBack; and its connections are pgx's own,
// which the layer pipelines on, through a pool or a *sql.DB, while a
// wrapping driver's are not.
func TestFromPool_ReadsErrorsAndPipes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := pgtest.Database(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	pool := userPool(t, u.String(), nil)
	db, err := postgres.FromPool(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT 1/0`); err == nil {
		t.Fatal("1/0 succeeded")
	}
	if err := tx.Commit(); !db.CommitRolledBack(err) {
		t.Errorf("a COMMIT after a failed statement: %v, CommitRolledBack false", err)
	}

	conn, err := db.Write.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !db.CanPipe(conn) {
		t.Error("CanPipe is false on a connection of the user's pool")
	}
	p.Reset()
	_, err = conn.ExecContext(ctx, `SELECT 1`)
	if err == nil || !db.Unavailable(err) {
		t.Errorf("a statement on a connection reset under it: %v, Unavailable false", err)
	}
	conn.Close()

	for name, driverName := range map[string]string{"pgx": "pgx", "wrapped": faultdb.NewPostgres(1).DriverName()} {
		user, err := sql.Open(driverName, direct)
		if err != nil {
			t.Fatal(err)
		}
		defer user.Close()
		db, err := postgres.FromDB(ctx, user)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		c, err := db.Write.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := db.CanPipe(c); got != (name == "pgx") {
			t.Errorf("FromDB on %s's driver: CanPipe = %v", name, got)
		}
		c.Close()
	}
}
