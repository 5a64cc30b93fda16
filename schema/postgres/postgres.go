// Package postgres links PostgreSQL into mcp-outbox: importing it, for its
// side effect, registers the store that lets [schema.Open] open a
// postgres:// or postgresql:// URL, through pgx's database/sql driver
// ("pgx").
//
//	import _ "github.com/mcp-outbox/mcp-outbox/schema/postgres"
//
// Only a program that imports it links pgx: one that uses SQLite alone
// stays without it. The outbox's SQL for PostgreSQL, its migrations
// included, is in package schema with SQLite's and chosen by
// [schema.DB.Dialect]; what is here is what only the client library can
// do: build the connection string, read pgx's errors, and hold the
// connection that LISTENs for new effects.
//
// An instrumented pool works as it is: register a driver that wraps
// "pgx" (otelsql.Register("pgx") returns its name) and give that name as
// [schema.Options].Driver. The dialect comes from the URL, so every
// statement is PostgreSQL's whatever the driver's type.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/mcp-outbox/mcp-outbox/schema"
)

func init() { schema.Register(store{}) }

// store is PostgreSQL through pgx.
type store struct{}

func (store) Dialect() schema.Dialect { return schema.Postgres }

func (store) DriverName() string { return "pgx" }

// DSN adds to the URL what the layer relies on, unless the URL sets it.
func (store) DSN(target string, d schema.Durability) (string, error) {
	cfg, err := url.Parse(target)
	if err != nil {
		return "", err
	}
	q := cfg.Query()
	if q.Get("application_name") == "" {
		q.Set("application_name", "mcp-outbox")
	}
	if q.Get("connect_timeout") == "" {
		// pgx waits for ever by default; an unreachable store must fail a
		// call with an error, not hang it.
		q.Set("connect_timeout", "5")
	}
	if d == schema.DurabilityNormal {
		// The counterpart of synchronous=NORMAL: a commit returns before
		// its WAL is flushed; a crash of the server (not of this process)
		// can lose the last commits, never half of one. pgx sends a URL
		// setting it does not know as a run-time parameter of the session.
		q.Set("synchronous_commit", "off")
	}
	cfg.RawQuery = q.Encode()
	return cfg.String(), nil
}

// Unavailable reports whether err says the server could not be reached
// or went away (connection refused or reset, the server shutting down or
// in recovery) or refuses work for want of resources.
func (store) Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if code := schema.PgCode(err); code != "" {
		// Class 08: connection exception; 57P: operator intervention
		// (admin shutdown, crash shutdown, cannot connect now); 53:
		// insufficient resources (disk full, out of memory, too many
		// connections); 58: system error (I/O).
		return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") ||
			strings.HasPrefix(code, "53") || strings.HasPrefix(code, "58")
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	// Through database/sql some failures arrive as text only (the pool's
	// driver.ErrBadConn, a reset read by the net package).
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "unexpected EOF") ||
		strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset") ||
		strings.Contains(msg, "conn closed") || strings.Contains(msg, "driver: bad connection")
}

// CommitRolledBack: pgx answers a COMMIT that PostgreSQL turned into a
// ROLLBACK with this error, not with a SQLSTATE, so only pgx can tell it.
func (store) CommitRolledBack(err error) bool { return errors.Is(err, pgx.ErrTxCommitRollback) }

// Listen connects with pgx itself, not through database/sql, which has no
// way to wait for a notification.
func (store) Listen(ctx context.Context, dsn, channel string) (schema.Listener, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		_ = listener{conn}.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen: %w", err)
	}
	return listener{conn}, nil
}

type listener struct{ conn *pgx.Conn }

func (l listener) Wait(ctx context.Context) error {
	_, err := l.conn.WaitForNotification(ctx)
	return err
}

// Close says goodbye to the server, bounded to a second past ctx: the
// server may be what failed.
func (l listener) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return l.conn.Close(ctx)
}
