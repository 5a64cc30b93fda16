package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"
	"time"

	"modernc.org/sqlite"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// begin opens a batch. It waits for the writer connection as long as ctx
// allows (the dispatcher and operator commands use it between batches), then
// begins under a context that cancellation does not reach: whether a batch
// commits is decided by its units, not by one caller going away. A BEGIN
// that finds another connection (another process) holding the write lock
// waits for it up to busy_timeout, or until deadline if that comes first,
// then fails with SQLITE_BUSY.
func (g *groupCommit) begin(ctx context.Context, durable bool, deadline time.Time) (*batch, error) {
	g.stmts.prepare(ctx)
	conn, err := g.db.Write.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("take writer connection: %w", err)
	}
	relax := !durable && g.db.Durability != schema.DurabilityNormal
	if relax {
		if _, err := conn.ExecContext(context.Background(), `PRAGMA synchronous=NORMAL`); err != nil {
			conn.Close()
			return nil, fmt.Errorf("relax synchronous: %w", err)
		}
	}
	restore, err := g.capBusyWait(conn, deadline)
	if err != nil {
		g.release(conn, relax)
		return nil, err
	}
	g.hookCommits(conn)
	tx, err := conn.BeginTx(context.Background(), nil)
	if restore > 0 {
		if _, rerr := conn.ExecContext(context.Background(), setBusyTimeout(restore)); rerr != nil {
			// A connection left with the short wait would give up early on
			// every later transaction: discard it, once the transaction no
			// longer holds it (database/sql would wait for that forever).
			if err == nil {
				_ = tx.Rollback()
				err = fmt.Errorf("restore busy timeout: %w", rerr)
			}
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	if err != nil {
		g.release(conn, relax)
		return nil, fmt.Errorf("begin: %w", err)
	}
	return &batch{conn: conn, tx: tx, durable: !relax, opened: g.now(), done: make(chan struct{})}, nil
}

// hookCommits has SQLite refuse any commit of the writer connection while
// a tool handler holds the turn. The layer commits a batch only between
// units, so such a commit is the handler's: a COMMIT the statement guard
// did not see, or a statement run in autocommit mode after SQLite ended
// the shared transaction on an error (a statement the handler prepared,
// whose errors the layer does not see). SQLite turns the commit into a
// rollback, the statement fails, and the batch, its savepoints gone,
// records none of its calls: never a call's writes without its outcome.
// A driver that is not modernc's (a test's fault injector) gets no hook.
func (g *groupCommit) hookCommits(conn *sql.Conn) {
	_ = conn.Raw(func(dc any) error {
		if h, ok := dc.(interface{ RegisterCommitHook(sqlite.CommitHookFn) }); ok {
			h.RegisterCommitHook(g.vetoCommit)
		}
		return nil
	})
}

// vetoCommit is the writer connection's commit hook: non-zero refuses.
func (g *groupCommit) vetoCommit() int32 {
	if g.handlerTurn.Load() {
		return 1
	}
	return 0
}

// capBusyWait shortens the busy_timeout of the writer connection so that a
// BEGIN waiting for another connection's write lock gives up by deadline. It
// returns the busy_timeout to restore after the BEGIN, or 0 if it changed
// nothing, which is the case of every BEGIN whose deadline is further away
// than busy_timeout (the claims of the default configuration: a 30 s
// in-flight wait against a 5 s busy timeout). The BEGIN cannot take a
// context with the deadline instead: database/sql rolls a transaction back
// when its context ends, and the batch outlives the deadline of the unit
// that opened it.
func (g *groupCommit) capBusyWait(conn *sql.Conn, deadline time.Time) (restore int64, err error) {
	if deadline.IsZero() {
		return 0, nil
	}
	if !g.busyKnown {
		if err := conn.QueryRowContext(context.Background(), `PRAGMA busy_timeout`).Scan(&g.busyMS); err != nil {
			return 0, fmt.Errorf("read busy timeout: %w", err)
		}
		g.busyKnown = true
	}
	left := max(time.Until(deadline).Milliseconds(), 0)
	if left >= g.busyMS {
		return 0, nil
	}
	if _, err := conn.ExecContext(context.Background(), setBusyTimeout(left)); err != nil {
		return 0, fmt.Errorf("shorten busy timeout: %w", err)
	}
	return g.busyMS, nil
}

// setBusyTimeout is the pragma that sets busy_timeout to ms milliseconds.
// A pragma takes no bound parameters; ms is an integer of ours.
func setBusyTimeout(ms int64) string {
	return "PRAGMA busy_timeout = " + strconv.FormatInt(ms, 10)
}

// release hands the writer connection back, at the database's level. A
// connection whose level cannot be restored is discarded, so that no later
// transaction runs with less durability than configured. (PostgreSQL's
// SET LOCAL ends with the transaction: nothing to restore.)
func (g *groupCommit) release(conn *sql.Conn, relaxed bool) {
	if relaxed && !g.own {
		if _, err := conn.ExecContext(context.Background(), `PRAGMA synchronous=FULL`); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	conn.Close()
}
