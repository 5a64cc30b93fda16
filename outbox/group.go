package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Group commit.
//
// SQLite has one writer, and a commit with synchronous=FULL costs an fsync
// (about 210 µs here), which would cap recorded calls at the fsync rate. So
// the layer shares one transaction of the writer connection among the calls
// that want it at the same time:
//
//   - Calls take turns: one unit of work at a time holds the batch's
//     transaction, inside its own SAVEPOINT. A unit that fails rolls back to
//     its savepoint, which undoes its work and nobody else's.
//   - A unit that ends releases its savepoint. If another unit is waiting
//     for its turn, and the batch is under its limits, the transaction stays
//     open and the turn passes on; otherwise the unit commits the batch. So a
//     lone call commits at once: nothing ever waits for others to arrive.
//   - A unit that needs its work durable (a call's outcome) waits for the
//     batch's commit before its call answers: no response is released
//     before its commit is durable. If the commit fails, every call of the
//     batch is told so, and none of them is recorded.
//   - A unit that does not need durability (a claim, the release of a
//     claim) leaves its work in the open batch and goes on; it commits with
//     the batch. Such work may be lost with the batch (a crash, a failed
//     commit), which loses only claims of calls that had committed nothing:
//     an attempt whose claim vanished fails its fence and records nothing.
//
// SQLite refuses to change synchronous inside a transaction, so a batch has
// one level, chosen when it opens: FULL if its first unit needs durability,
// NORMAL otherwise. A durable unit that finds a NORMAL batch open commits it
// first (no fsync) and opens a FULL one; the FULL commit then makes the
// frames of the NORMAL one durable too, since WAL frames become durable in
// order.

// groupCommit shares transactions of the writer connection among units of
// work; see above.
type groupCommit struct {
	db       *schema.DB
	maxCalls int
	maxWait  time.Duration
	now      func() time.Time
	onCommit func(calls int) // after each commit of a batch that holds calls
	stmts    *stmtCache

	// busyMS is the writer connection's busy_timeout in milliseconds,
	// read once (busyKnown) by the first begin that has a deadline; only
	// the goroutine holding the turn touches them.
	busyMS    int64
	busyKnown bool

	// own: every unit gets a transaction of its own (PostgreSQL); see
	// enterOwn.
	own bool

	// handlerTurn: a tool handler holds the turn, so no commit of the
	// writer connection is the layer's (see vetoCommit).
	handlerTurn atomic.Bool

	mu    sync.Mutex
	held  bool          // some goroutine has the turn
	queue []*turnWaiter // waiting for the turn, first come first served
	open  *batch        // the open transaction, nil between batches
}

type turnWaiter struct {
	ch      chan struct{} // closed when the turn is granted
	granted bool
}

// batch is one transaction of the writer connection shared by units.
type batch struct {
	conn    *sql.Conn
	tx      *sql.Tx
	durable bool // synchronous=FULL for this commit
	opened  time.Time
	calls   int   // call outcomes kept in it
	broken  error // the transaction can no longer commit

	own bool // the transaction of one unit alone (PostgreSQL)
	// piped: the transaction is begun and ended by statements sent
	// together with others (pipe_postgres.go); tx is then nil.
	piped *pipedTx

	done chan struct{} // closed after the commit or rollback
	err  error         // nil if the batch committed; valid once done is closed

	// stmts holds the cache's statements bound to tx (Tx.StmtContext),
	// each made once per batch rather than once per statement run: a
	// batch runs the same few statements for each of its calls, and each
	// binding costs database/sql several allocations and its locks.
	stmts map[*sql.Stmt]*sql.Stmt
}

// unit is one turn in a batch: the statements of one step of one call.
type unit struct {
	g       *groupCommit
	b       *batch
	durable bool
	outcome bool // the unit records a call's outcome: it counts toward MaxBatchCalls
	ended   bool
	// redo, when not nil, marks a unit of its own transaction (PostgreSQL)
	// that has no savepoint: undo rolls the whole transaction back, begins
	// another and runs redo in it (see enterRedo).
	redo func(*unit) error
}

func newGroupCommit(db *schema.DB, maxCalls int, maxWait time.Duration, now func() time.Time) *groupCommit {
	own := db.Dialect == schema.Postgres
	return &groupCommit{db: db, maxCalls: maxCalls, maxWait: maxWait, now: now, stmts: newStmtCache(db.Write, !own), own: own}
}

// enter waits for the turn (as long as ctx allows), joins the open batch or
// opens one, and begins the unit's savepoint. A durable unit's work is
// committed with synchronous=FULL; the others' may commit with NORMAL.
func (g *groupCommit) enter(ctx context.Context, durable bool) (*unit, error) {
	return g.enterBy(ctx, durable, time.Time{})
}

// enterRedo is enter for a unit that can restore, by redo, what it holds
// at its start. On PostgreSQL such a unit sets no savepoint, which saves a
// round trip (a durable unit without a deadline then sends nothing before
// its first statement but BEGIN): undo rolls the whole transaction back
// and begins another, in which redo runs. SQLite's units share a batch,
// where only a savepoint undoes one unit's work, so there it is enter.
func (g *groupCommit) enterRedo(ctx context.Context, durable bool, redo func(*unit) error) (*unit, error) {
	if !g.own {
		return g.enter(ctx, durable)
	}
	return g.enterOwnWith(ctx, durable, time.Time{}, redo)
}

// enterBy is enter for a unit that waits for another connection's write
// lock (SQLITE_BUSY) no later than deadline, when it is not zero; see
// capBusyWait.
func (g *groupCommit) enterBy(ctx context.Context, durable bool, deadline time.Time) (*unit, error) {
	if g.own {
		return g.enterOwn(ctx, durable, deadline)
	}
	if err := g.takeTurn(ctx); err != nil {
		return nil, err
	}
	u, err := g.join(ctx, durable, deadline)
	if err != nil {
		g.yieldTurn()
		return nil, err
	}
	return u, nil
}

func (g *groupCommit) takeTurn(ctx context.Context) error {
	g.mu.Lock()
	if !g.held && len(g.queue) == 0 {
		g.held = true
		g.mu.Unlock()
		return nil
	}
	w := &turnWaiter{ch: make(chan struct{})}
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if w.granted {
		// Granted while giving up: the open batch is now this goroutine's
		// to pass on or commit, or its units would wait for ever.
		g.mu.Unlock()
		g.yieldTurn()
		return ctx.Err()
	}
	for i, q := range g.queue {
		if q == w {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			break
		}
	}
	g.mu.Unlock()
	return ctx.Err()
}

// join runs with the turn held.
func (g *groupCommit) join(ctx context.Context, durable bool, deadline time.Time) (*unit, error) {
	if b := g.open; b != nil && durable && !b.durable {
		g.finish(b)
	}
	if g.open == nil {
		b, err := g.begin(ctx, durable, deadline)
		if err != nil {
			return nil, err
		}
		g.open = b
	}
	u := &unit{g: g, b: g.open, durable: durable}
	if _, err := u.exec(`SAVEPOINT unit`); err != nil {
		u.b.broken = fmt.Errorf("savepoint: %w", err)
		g.finish(u.b)
		return nil, u.b.err
	}
	return u, nil
}

// leave ends the unit: keep releases its work into the batch, otherwise it
// is rolled back. The turn passes on, or the batch commits. The returned
// batch tells, once its done channel is closed, whether the work committed.
func (u *unit) leave(keep bool) *batch {
	if u.ended {
		panic("outbox: unit left twice")
	}
	u.ended = true
	u.g.handlerTurn.Store(false)
	b := u.b
	if b.broken == nil {
		// A statement of the unit with ON CONFLICT ROLLBACK, or an I/O
		// error, can end the whole transaction; the savepoint is then gone
		// and this fails, which is how the batch learns it is broken.
		var err error
		switch {
		case !keep && u.redo != nil:
			// No savepoint: the whole transaction, the unit's own, rolls back.
			b.broken = errUnitDiscarded
		case !keep:
			_, err = u.exec(`ROLLBACK TO unit`)
		}
		// A transaction of its own (PostgreSQL) commits next: COMMIT
		// releases the savepoint and answers for a transaction an error
		// ended (pgx: ErrTxCommitRollback), so RELEASE would only cost a
		// round trip, one of the five of a call's outcome.
		if err == nil && !b.own {
			_, err = u.exec(`RELEASE unit`)
		}
		if err != nil {
			b.broken = savepointFailed("release savepoint", err)
		}
	}
	if keep && u.outcome {
		b.calls++
	}
	g := u.g
	if b.own {
		g.finish(b)
		return b
	}
	g.mu.Lock()
	if b.broken == nil && len(g.queue) > 0 && b.calls < g.maxCalls && g.now().Sub(b.opened) < g.maxWait {
		g.grantLocked()
		g.mu.Unlock()
		return b
	}
	g.mu.Unlock()
	g.finish(b)
	g.passTurn()
	return b
}

// errTxEnded is why a batch whose savepoints are gone did not commit: an
// error in one of its units ended the whole transaction (SQLite rolls it
// back after some I/O errors and a full disk, and on ON CONFLICT ROLLBACK).
// Every call of the batch is told this, in place of SQLite's "no such
// savepoint", which says nothing to a client; the unit whose statement
// failed reports that statement's own error.
var errTxEnded = errors.New("the database ended the transaction this call shared with others, after an error in one of them")

// savepointFailed is the batch's error when a savepoint operation fails.
func savepointFailed(op string, err error) error {
	if strings.Contains(err.Error(), "no such savepoint") {
		return errTxEnded
	}
	return fmt.Errorf("%s: %w", op, err)
}

// errUnitDiscarded: the unit of a transaction of its own was left without
// keeping its work, so the transaction rolls back.
var errUnitDiscarded = errors.New("the unit's work was discarded")

// errOwnTxEnded is why a unit's own transaction (PostgreSQL) did not
// commit although no statement of the unit reported an error: one did
// end the transaction, and COMMIT rolled it back.
var errOwnTxEnded = errors.New("the database rolled the transaction back after an error in it")

// errCommitUnknown: the answer to COMMIT was lost with its connection
// (PostgreSQL). The server may have committed or not; only reading the
// row again tells.
var errCommitUnknown = errors.New("the database did not confirm the commit")

// wait waits for the batch to commit or roll back and returns its error.
func (b *batch) wait() error {
	<-b.done
	return b.err
}

// finish commits the open batch (or rolls it back if broken); the caller
// holds the turn.
func (g *groupCommit) finish(b *batch) {
	if b.calls > 1 {
		if err := failpoint.Inject(failpoint.BatchBeforeCommit); err != nil && b.broken == nil {
			b.broken = err
		}
	}
	if b.piped != nil {
		if b.broken != nil {
			g.rollbackPiped(b)
			b.err = fmt.Errorf("batch not committed: %w", b.broken)
		} else {
			b.err = g.commitPiped(b)
		}
	} else if b.broken != nil {
		_ = b.tx.Rollback()
		b.err = fmt.Errorf("batch not committed: %w", b.broken)
	} else if err := b.tx.Commit(); err != nil {
		b.err = fmt.Errorf("commit: %w", err)
		if g.own && g.db.CommitRolledBack(err) {
			// An error ended the transaction earlier; COMMIT rolled it
			// back, which is certain.
			b.err = fmt.Errorf("commit: %w", errOwnTxEnded)
		} else if g.own && pgcode.Of(err) == "" {
			// PostgreSQL refused nothing: the connection failed while
			// COMMIT was under way, and the server may have committed
			// before it went (see errCommitUnknown).
			b.err = fmt.Errorf("commit: %w: %w", errCommitUnknown, err)
		}
	}
	g.release(b.conn, !b.durable)
	if !b.own {
		g.open = nil
	}
	if b.err == nil && b.calls > 1 {
		_ = failpoint.Inject(failpoint.BatchAfterCommit)
	}
	if b.err == nil && b.calls > 0 && g.onCommit != nil {
		g.onCommit(b.calls)
	}
	close(b.done)
}

// yieldTurn gives up the turn without a unit: to the first waiter, who
// takes over the open batch, or, with nobody waiting, after committing the
// open batch, which nobody else would.
func (g *groupCommit) yieldTurn() {
	g.mu.Lock()
	if len(g.queue) > 0 {
		g.grantLocked()
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	if g.open != nil {
		g.finish(g.open)
	}
	g.passTurn()
}

// passTurn gives the turn to the first waiter, or frees it.
func (g *groupCommit) passTurn() {
	g.mu.Lock()
	if len(g.queue) > 0 {
		g.grantLocked()
	} else {
		g.held = false
	}
	g.mu.Unlock()
}

func (g *groupCommit) grantLocked() {
	w := g.queue[0]
	g.queue = g.queue[1:]
	w.granted = true
	close(w.ch)
}

// waiting reports how many units wait for the turn; tests use it to know a
// batch will form.
func (g *groupCommit) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}
