package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func init() { schema.Register(store{}) }

// store is PostgreSQL through pgx.
type store struct{}

func (store) Dialect() schema.Dialect { return schema.Postgres }

func (store) DriverName() string { return "pgx" }

// Bounds on waiting for the network, each overridden by the URL setting
// of libpq's name. Without them a connection whose packets are dropped (a
// partition, a host gone without a reset) hangs a call, a claim, a
// dispatcher's round or a readiness check for as long as the kernel keeps
// retransmitting: about 15 minutes on Linux.
const (
	// DefaultConnectTimeout bounds one connection attempt
	// (connect_timeout, in seconds).
	DefaultConnectTimeout = 5 * time.Second
	// DefaultKeepAliveIdle, DefaultKeepAliveInterval and
	// DefaultKeepAliveCount are TCP keepalive's (keepalives_idle and
	// keepalives_interval in seconds, keepalives_count; keepalives=0
	// turns them off): a connection idle, or waiting for a slow answer,
	// whose peer stopped answering is closed after about
	// idle + interval × count.
	DefaultKeepAliveIdle     = 10 * time.Second
	DefaultKeepAliveInterval = 5 * time.Second
	DefaultKeepAliveCount    = 3
	// DefaultTCPUserTimeout is TCP_USER_TIMEOUT (tcp_user_timeout, in
	// milliseconds; 0 leaves the kernel's): a connection with data sent
	// and not acknowledged for this long is closed, so a statement or a
	// COMMIT written into a partition fails within it (Linux only).
	DefaultTCPUserTimeout = 20 * time.Second
)

// netSettings are the URL settings of the network bounds: libpq's names,
// which pgx does not know and would send to the server as run-time
// parameters, so they are taken out of the URL.
var netSettings = []string{"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout"}

// registered maps the names DSN registered with pgx's database/sql driver
// to their configurations, for Listen, which connects outside the pool.
var registered sync.Map // string -> *pgx.ConnConfig

// DSN adds to the URL what the layer relies on, unless the URL sets it,
// and returns the name of a pgx configuration registered with pgx's
// database/sql driver (stdlib.RegisterConnConfig): the network bounds need
// a dialer of their own, which a URL cannot carry. A driver that wraps
// "pgx" passes the name through to it.
func (store) DSN(target string, d schema.Durability) (string, error) {
	cfg, err := url.Parse(target)
	if err != nil {
		return "", err
	}
	q := cfg.Query()
	bounds, err := netBoundsOf(q)
	if err != nil {
		return "", err
	}
	for _, k := range netSettings {
		q.Del(k)
	}
	if q.Get("application_name") == "" {
		q.Set("application_name", "mcp-outbox")
	}
	if q.Get("connect_timeout") == "" {
		// pgx waits for ever by default; an unreachable store must fail a
		// call with an error, not hang it.
		q.Set("connect_timeout", strconv.Itoa(int(DefaultConnectTimeout/time.Second)))
	}
	if d == schema.DurabilityNormal {
		// The counterpart of synchronous=NORMAL: a commit returns before
		// its WAL is flushed; a crash of the server (not of this process)
		// can lose the last commits, never half of one. pgx sends a URL
		// setting it does not know as a run-time parameter of the session.
		q.Set("synchronous_commit", "off")
	}
	cfg.RawQuery = q.Encode()
	pcfg, err := pgx.ParseConfig(cfg.String())
	if err != nil {
		return "", err
	}
	bounds.connect = pcfg.ConnectTimeout
	pcfg.DialFunc = bounds.dial
	pcfg.AfterConnect = bounds.serverSide
	name := stdlib.RegisterConnConfig(pcfg)
	registered.Store(name, pcfg)
	return name, nil
}

// netBounds are a connection's bounds on the network.
type netBounds struct {
	connect     time.Duration
	keepAlive   net.KeepAliveConfig
	userTimeout time.Duration
}

func netBoundsOf(q url.Values) (netBounds, error) {
	b := netBounds{
		keepAlive:   net.KeepAliveConfig{Enable: true, Idle: DefaultKeepAliveIdle, Interval: DefaultKeepAliveInterval, Count: DefaultKeepAliveCount},
		userTimeout: DefaultTCPUserTimeout,
	}
	num := func(k string, set func(int)) error {
		v := q.Get(k)
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%s=%q: want a number, 0 or more", k, v)
		}
		set(n)
		return nil
	}
	for _, s := range []struct {
		k   string
		set func(int)
	}{
		{"keepalives", func(n int) { b.keepAlive.Enable = n != 0 }},
		{"keepalives_idle", func(n int) { b.keepAlive.Idle = time.Duration(n) * time.Second }},
		{"keepalives_interval", func(n int) { b.keepAlive.Interval = time.Duration(n) * time.Second }},
		{"keepalives_count", func(n int) { b.keepAlive.Count = n }},
		{"tcp_user_timeout", func(n int) { b.userTimeout = time.Duration(n) * time.Millisecond }},
	} {
		if err := num(s.k, s.set); err != nil {
			return b, err
		}
	}
	return b, nil
}

// serverKeepAlive sets the same bounds on the server's end of the
// connection. A partition is silent to both ends: without them the
// server keeps a cut-off replica's session, and the row locks its
// transaction holds (a call's row, from its first statement to its
// commit), until the server's system keepalive notices, two hours by
// default on Linux, and every other replica's attempt at that call
// answers in_progress meanwhile. Set by a statement after connecting, not
// as start-up parameters, which a pooler such as PgBouncer refuses; a
// server or pooler that refuses the statement keeps its own settings.
const serverKeepAlive = `SELECT set_config('tcp_keepalives_idle', $1, false), set_config('tcp_keepalives_interval', $2, false),
    set_config('tcp_keepalives_count', $3, false), set_config('tcp_user_timeout', $4, false)`

func (b netBounds) serverSide(ctx context.Context, c *pgconn.PgConn) error {
	if !b.keepAlive.Enable {
		return nil
	}
	secs := func(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }
	rr := c.ExecParams(ctx, serverKeepAlive, [][]byte{
		[]byte(secs(b.keepAlive.Idle)), []byte(secs(b.keepAlive.Interval)),
		[]byte(strconv.Itoa(b.keepAlive.Count)), []byte(strconv.Itoa(int(b.userTimeout.Milliseconds()))),
	}, nil, nil, nil)
	_, err := rr.Close()
	if err != nil && !c.IsClosed() && pgcode.Of(err) != "" {
		return nil // refused by the server (an old version, a pooler): not fatal
	}
	return err
}

// dial connects with the bounds: keepalive on the socket, and
// TCP_USER_TIMEOUT where the system has it (setUserTimeout).
func (b netBounds) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: b.connect, KeepAliveConfig: b.keepAlive}
	if !b.keepAlive.Enable {
		d.KeepAlive = -1
	}
	if b.userTimeout > 0 && (network == "tcp" || network == "tcp4" || network == "tcp6") {
		d.Control = func(_, _ string, c syscall.RawConn) error { return setUserTimeout(c, b.userTimeout) }
	}
	return d.DialContext(ctx, network, addr)
}

// Unavailable reports whether err says the server could not be reached
// or went away (connection refused or reset, the server shutting down or
// in recovery) or refuses work for want of resources.
func (store) Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if code := pgcode.Of(err); code != "" {
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
	var conn *pgx.Conn
	var err error
	if cfg, ok := registered.Load(dsn); ok {
		conn, err = pgx.ConnectConfig(ctx, cfg.(*pgx.ConnConfig).Copy())
	} else {
		conn, err = pgx.Connect(ctx, dsn)
	}
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
