package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A recorded call's transaction on PostgreSQL, pipelined (issue 28).
//
// Across a network a call costs its round trips. database/sql sends each
// statement alone and waits for its answer: BEGIN, the fence, the
// handler's statements, the outcome and COMMIT each cost one. None of
// BEGIN, the outcome or COMMIT needs an answer before the next goes, so
// when the pool's connection is pgx's own (schema.DB.CanPipe), the unit
// sends them together with the statement next to them (schema.DB.Pipe):
//
//	BEGIN + the fence (SELECT … FOR UPDATE)   one round trip
//	the handler's statements                  one each, as before
//	the outcome (+ effects) + COMMIT          one round trip
//
// The transaction is then one database/sql does not know of: pgx's
// database/sql driver sends BEGIN at once in BeginTx and COMMIT alone in
// Commit, and a COMMIT sent beside a *sql.Tx would leave it believing
// itself open. So a piped unit has no *sql.Tx: its statements, and the
// handler's, run on the unit's *sql.Conn, inside the transaction the
// pipeline began, and the pipeline ends it. A pool whose driver wraps
// pgx's (a tracing or fault-injecting driver, schema.Options.Driver) sees
// every statement alone through today's path: BeginTx, then one statement
// a round trip.
//
// Every fence stays. The fence is the first thing the transaction runs,
// and holds the row locked to the commit. The COMMIT goes out before the
// outcome's answer is back, so the outcome must not be able to match no
// row and commit the rest anyway: its piped form fails, with an error
// that ends the transaction, unless its compare-and-set matched exactly
// one row (outcomeMissed). After a statement fails the server runs
// nothing more of the pipeline, COMMIT included: the attempt that lost
// its claim commits nothing.
//
// What database/sql does for a *sql.Tx at its end the unit does for its
// *sql.Conn: the statements the handler prepared are closed, and the
// handler's statements ran with a context that the unit cancels when it
// ends, which makes database/sql close rows the handler left open (an
// unscanned *sql.Row), and the unit waits for that before COMMIT. Should
// pgx drop the connection instead (it was in the middle of reading them),
// the commit fails, certainly: nothing is recorded.
type pipedTx struct {
	// begun: BEGIN was sent; the transaction is open or failed.
	begun bool
	// ctx is the context of every statement on the unit's connection;
	// cancel, at the unit's end, closes what the handler left open.
	ctx    context.Context
	cancel context.CancelFunc
	// last is the outcome's statement, sent with COMMIT.
	last *schema.Piped
	// settledClaim: the transaction inserted its call's claim in the
	// outcome's form (claim_tx_postgres.go), so it must not commit
	// without the outcome.
	settledClaim bool

	mu    sync.Mutex
	stmts []*sql.Stmt // the handler's, closed at the end

	keep keepAlive
}

// keepAlive keeps a claim's transaction from looking idle to PostgreSQL
// while its handler works outside the database (issue 29).
//
// A claim that rides in the call's transaction (claim_tx_postgres.go)
// bounds it with idle_in_transaction_session_timeout = the lease, so that
// a replica that stops talking (SIGSTOP, a GC or VM freeze, a link that
// swallows packets: its kernel, or a proxy's, keeps acking TCP, so only
// the server's own timer notices) frees the key a lease later. A live
// handler that awaits a slow API for longer than the lease between two
// statements would lose its call the same way, and its retry would too,
// for ever. So the layer's renewal loop (renew.go), every third of the
// lease, sends SELECT 1 in the transaction of each such unit that has
// been quiet for half of that: any statement resets the server's timer.
// A paused process sends nothing and still loses its session a lease
// after it last spoke; a short call is never touched (no round trip).
//
// The touch shares the connection with the handler. database/sql
// serialises the two (conn.Raw holds the driver connection's lock, as a
// statement does), but rows the handler is still reading leave pgx's
// connection busy between its calls: the touch then sends nothing
// (schema.ErrPipeBusy) and the next tick tries again, so the handler's
// rows are never disturbed. endHandler turns touching off, waiting for a
// touch under way, before the outcome goes with COMMIT or the
// transaction rolls back: no SELECT 1 lands after the transaction ends.
type keepAlive struct {
	conn *sql.Conn // the unit's
	// since is the monotonic origin of used.
	since time.Time
	// used: when a statement last went on the connection, as a duration
	// from since.
	used atomic.Int64
	// busy: a touch is under way, or queued behind the handler's
	// statement; the loop does not start another.
	busy atomic.Bool

	mu sync.Mutex
	on bool // the claim's transaction is open and bounded: touch it
}

// keepOn starts keeping the transaction alive: its claim is in it.
func (p *pipedTx) keepOn() {
	p.keep.mu.Lock()
	p.keep.on = true
	p.keep.mu.Unlock()
	p.markUsed()
}

// keepOff stops touching, and waits for a touch under way to end.
func (p *pipedTx) keepOff() {
	p.keep.mu.Lock()
	p.keep.on = false
	p.keep.mu.Unlock()
}

// markUsed notes that a statement goes on the connection now.
func (p *pipedTx) markUsed() {
	p.keep.used.Store(int64(time.Since(p.keep.since)))
}

// quietFor is how long no statement has gone on the connection.
func (p *pipedTx) quietFor() time.Duration {
	return time.Since(p.keep.since) - time.Duration(p.keep.used.Load())
}

// touch sends SELECT 1 in the transaction if it is still to be kept and
// has been quiet for at least quiet. It runs on a goroutine of its own
// (the loop must not wait behind a handler's long statement, which holds
// the connection) and reports whether it sent anything. No deadline of
// its own, as for COMMIT: pgx drops a connection whose statement's
// context ends mid-flight, which would lose a live call; a link that
// stops answering is bounded by the connection's own timeouts.
func (p *pipedTx) touch(db *schema.DB, quiet time.Duration) (bool, error) {
	defer p.keep.busy.Store(false)
	p.keep.mu.Lock()
	defer p.keep.mu.Unlock()
	if !p.keep.on || p.quietFor() < quiet {
		return false, nil
	}
	_, err := db.Pipe(context.Background(), p.keep.conn, schema.Piped{SQL: "SELECT 1"})
	if errors.Is(err, schema.ErrPipeBusy) {
		// The handler is reading rows: leave them be; next tick.
		return false, nil
	}
	p.markUsed()
	return true, err
}

// outcomeMissed marks the error that the piped outcome raises when its
// compare-and-set matched no row. PostgreSQL has no RAISE outside
// PL/pgSQL, so the statement casts a text that says so to an integer:
// the cast fails at run time only, since the text holds the row count
// (a constant would be folded, and fail, when the statement is planned).
const outcomeMissed = "outbox outcome matched rows: "

// recordOutcomePiped is recordOutcome, failing unless it matched one row;
// keep the two in step (TestPipedOutcome_InStep).
const recordOutcomePiped = `
WITH outcome AS (
  UPDATE calls SET state = $1, result = $2, completed_at = $3, expires_at = $4, owner = '', lease_until = 0, task_params = NULL
  WHERE id = $5 AND owner = $6 AND state = 'in_flight' AND task_cancel = 0
  RETURNING 1)
SELECT CASE count(*) WHEN 1 THEN 1 ELSE ('outbox outcome matched rows: ' || count(*))::integer END FROM outcome`

// recordOutcomeWithEffectsPiped is recordOutcomeWithEffects, failing
// unless the outcome matched one row; keep the two in step.
const recordOutcomeWithEffectsPiped = `
WITH effects_in AS (
  INSERT INTO effects (call_id, principal, seq, destination, method, path, headers, body, idempotency_key,
                       next_attempt_at, created_at, updated_at, traceparent)
  SELECT $5, $16::text, e.seq, e.destination, e.method, e.path, e.headers, e.body, e.key, e.at, e.at, e.at, e.traceparent
  FROM unnest($7::integer[], $8::text[], $9::text[], $10::text[], $11::text[], $12::bytea[], $13::text[], $14::bigint[], $15::text[])
       AS e(seq, destination, method, path, headers, body, key, at, traceparent)),
outcome AS (
  UPDATE calls SET state = $1, result = $2, completed_at = $3, expires_at = $4, owner = '', lease_until = 0, task_params = NULL
  WHERE id = $5 AND owner = $6 AND state = 'in_flight' AND task_cancel = 0
  RETURNING 1)
SELECT CASE count(*) WHEN 1 THEN 1 ELSE ('outbox outcome matched rows: ' || count(*))::integer END FROM outcome`

// recordOutcomeSettledPiped is recordOutcomePiped for a claim that rode
// in the call's transaction, whose row the claim inserted in its settled
// form (claim_tx_postgres.go): the row is the transaction's own and
// uncommitted, so nothing else can have changed it, and the check is that
// it is still the claim's (its uid, $6, and no outcome yet). On a
// completed call that ended within its expiry's slack it sets no indexed
// column to a new value ($4 is then the claim's expiry), so that the
// update stays on the row's page (HOT).
const recordOutcomeSettledPiped = `
WITH outcome AS (
  UPDATE calls SET state = $1, result = $2, completed_at = $3, expires_at = $4
  WHERE id = $5 AND uid = $6 AND completed_at IS NULL AND owner = ''
  RETURNING 1)
SELECT CASE count(*) WHEN 1 THEN 1 ELSE ('outbox outcome matched rows: ' || count(*))::integer END FROM outcome`

// recordOutcomeSettledWithEffectsPiped is recordOutcomeSettledPiped with
// the call's effects, as recordOutcomeWithEffectsPiped inserts them.
const recordOutcomeSettledWithEffectsPiped = `
WITH effects_in AS (
  INSERT INTO effects (call_id, principal, seq, destination, method, path, headers, body, idempotency_key,
                       next_attempt_at, created_at, updated_at, traceparent)
  SELECT $5, $16::text, e.seq, e.destination, e.method, e.path, e.headers, e.body, e.key, e.at, e.at, e.at, e.traceparent
  FROM unnest($7::integer[], $8::text[], $9::text[], $10::text[], $11::text[], $12::bytea[], $13::text[], $14::bigint[], $15::text[])
       AS e(seq, destination, method, path, headers, body, key, at, traceparent)),
outcome AS (
  UPDATE calls SET state = $1, result = $2, completed_at = $3, expires_at = $4
  WHERE id = $5 AND uid = $6 AND completed_at IS NULL AND owner = ''
  RETURNING 1)
SELECT CASE count(*) WHEN 1 THEN 1 ELSE ('outbox outcome matched rows: ' || count(*))::integer END FROM outcome`

// errSettledClaimNoOutcome: a unit whose claim rode in its transaction
// was to commit without its outcome, which would commit the claim's row
// in its settled form with no result.
var errSettledClaimNoOutcome = errors.New("outbox: a claim made in the call's transaction cannot commit without its outcome")

// pipedUnit returns the unit of a transaction that the pipeline begins,
// or nil if conn's driver cannot pipeline. Only a unit that sends nothing
// before its first statement (durable, no deadline, no savepoint) is
// piped: its first statement then rides with BEGIN.
func (g *groupCommit) pipedUnit(conn *sql.Conn, durable bool, redo func(*unit) error) *unit {
	if !g.db.CanPipe(conn) {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &batch{conn: conn, durable: true, opened: g.now(), own: true, done: make(chan struct{}),
		piped: &pipedTx{ctx: ctx, cancel: cancel, keep: keepAlive{conn: conn, since: time.Now()}}}
	return &unit{g: g, b: b, durable: durable, redo: redo}
}

// pipedConn is where a piped unit's statements run, its transaction
// begun: alone, if no statement has begun it yet (the fence does, but
// abandon's release, after undoAll, runs without it).
func (u *unit) pipedConn() (*sql.Conn, error) {
	p := u.b.piped
	p.markUsed()
	if !p.begun {
		p.begun = true
		if _, err := u.b.conn.ExecContext(p.ctx, "BEGIN"); err != nil {
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	return u.b.conn, nil
}

// queryFirst runs a query of the unit for its first row into dest; it
// returns sql.ErrNoRows if there is none. A piped unit not yet begun
// sends BEGIN with it.
func (u *unit) queryFirst(query string, args []any, dest ...any) error {
	p := u.b.piped
	if p == nil || p.begun {
		return u.queryRow(query, args...).Scan(dest...)
	}
	p.begun = true
	res, err := u.g.db.Pipe(p.ctx, u.b.conn, schema.Piped{SQL: "BEGIN"}, schema.Piped{SQL: query, Args: args, Dest: dest})
	if err != nil {
		return err
	}
	if !res[1].Found {
		return sql.ErrNoRows
	}
	return nil
}

// rollbackPiped ends a piped transaction without keeping it.
func (g *groupCommit) rollbackPiped(b *batch) {
	p := b.piped
	g.endHandler(b)
	if !p.begun {
		return
	}
	p.begun = false
	// A failed connection has nothing to roll back; its ResetSession
	// discards it (the transaction status is not idle).
	_, _ = b.conn.ExecContext(context.Background(), "ROLLBACK")
}

// endHandler closes what the handler left open on the connection. Rows
// left open close when their context ends, in a goroutine of
// database/sql's that nothing signals: until then pgx refuses the
// connection any other statement, so this waits for it, a little.
func (g *groupCommit) endHandler(b *batch) {
	p := b.piped
	// First, so that no touch lands after the transaction ends, nor
	// loses the connection to the cancel below mid-statement.
	p.keepOff()
	p.cancel()
	p.mu.Lock()
	stmts := p.stmts
	p.stmts = nil
	p.mu.Unlock()
	for _, st := range stmts {
		_ = st.Close()
	}
	wait := 50 * time.Microsecond
	for deadline := time.Now().Add(time.Second); ; {
		if _, err := g.db.Pipe(context.Background(), b.conn); !errors.Is(err, schema.ErrPipeBusy) || time.Now().After(deadline) {
			return
		}
		t := time.NewTimer(wait)
		<-t.C
		wait = min(2*wait, 10*time.Millisecond)
	}
}

// commitPiped sends the unit's outcome, if any, with COMMIT.
func (g *groupCommit) commitPiped(b *batch) error {
	p := b.piped
	g.endHandler(b)
	if !p.begun {
		return nil // nothing ran: nothing to commit
	}
	if p.settledClaim && p.last == nil {
		g.rollbackPiped(b)
		return fmt.Errorf("commit: %w", errSettledClaimNoOutcome)
	}
	stmts := make([]schema.Piped, 0, 2)
	if p.last != nil {
		stmts = append(stmts, *p.last)
	}
	stmts = append(stmts, schema.Piped{SQL: "COMMIT"})
	res, err := g.db.Pipe(context.Background(), b.conn, stmts...)
	if err == nil {
		if res[len(res)-1].Tag == "ROLLBACK" {
			// An error ended the transaction earlier (a handler's
			// statement whose error it ignored, with no outcome after it):
			// COMMIT rolled it back, which is certain.
			p.begun = false
			return fmt.Errorf("commit: %w", errOwnTxEnded)
		}
		p.begun = false
		return nil
	}
	if errors.Is(err, schema.ErrPipeBusy) || errors.Is(err, driver.ErrBadConn) {
		// Nothing was sent: the handler's rows held the connection, or
		// it was closed (the server then rolled the transaction back).
		g.rollbackPiped(b)
		return fmt.Errorf("commit: nothing sent: %w", err)
	}
	code := pgcode.Of(err)
	if code == "" {
		// Not the server's refusal: the connection failed or was busy,
		// and whether COMMIT ran is unknown (see errCommitUnknown).
		return fmt.Errorf("commit: %w: %w", errCommitUnknown, err)
	}
	// The server refused a statement: it ran nothing after it, so
	// nothing committed, which is certain.
	g.rollbackPiped(b)
	if len(res) < len(stmts)-1 {
		if code == "22P02" && strings.Contains(err.Error(), outcomeMissed) {
			return fmt.Errorf("record outcome: %w", ErrOwnershipLost)
		}
		return fmt.Errorf("record outcome: %w", err)
	}
	return fmt.Errorf("commit: %w", err)
}

// trackStmt keeps a statement the handler prepared on a piped unit's
// connection, to close at the unit's end.
func (p *pipedTx) trackStmt(st *sql.Stmt) {
	p.mu.Lock()
	p.stmts = append(p.stmts, st)
	p.mu.Unlock()
}

// stmtContext is the context a handler's statement in the unit runs
// with: none that the call's cancellation reaches (see unit.exec), and
// for a piped unit the one its end cancels.
func (u *unit) stmtContext(ctx context.Context) context.Context {
	if u.b.piped != nil {
		u.b.piped.markUsed()
		return u.b.piped.ctx
	}
	return background(ctx)
}
