package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// errClaimGone: the attempt's claim no longer exists when its handler
// begins.
var errClaimGone = errors.New("the call's claim is gone")

// errLeaseExpired: on PostgreSQL, the attempt's lease passed before its
// handler's first statement; see fence.
var errLeaseExpired = errors.New("the attempt's lease expired before its first statement, so it may not commit")

func (a *attempt) begin(ctx context.Context) error {
	if a.tx != nil {
		return nil
	}
	if a.txErr != nil {
		return a.txErr
	}
	if err := a.openTx(ctx); err != nil {
		a.txErr = &txError{err}
		return a.txErr
	}
	return nil
}

// openTx takes the call's turn in a group-commit batch (waiting while the
// call's context allows), or, for a read-only tool, a read transaction. Once
// in, cancellation no longer reaches the transaction: whether a cancelled
// call commits is decided at its end, not by the driver interrupting a
// statement, which in SQLite would roll back the whole shared transaction.
func (a *attempt) openTx(ctx context.Context) error {
	if a.tool.readOnly {
		conn, err := a.layer.db.Read.Conn(ctx)
		if err != nil {
			return fmt.Errorf("take database connection: %w", err)
		}
		if a.layer.db.Dialect == schema.SQLite {
			// modernc.org/sqlite reads TxOptions.ReadOnly only to send a
			// plain (deferred) BEGIN: a write in the transaction would run,
			// and vanish with its rollback. query_only makes SQLite refuse
			// it (SQLITE_READONLY) at the statement. It is the connection's
			// setting, so closeTx sets it back before the connection goes
			// back to the pool; the guard refuses the PRAGMA to a handler.
			if _, err := conn.ExecContext(background(ctx), "PRAGMA query_only = 1"); err != nil {
				conn.Close()
				return fmt.Errorf("make the connection read-only: %w", err)
			}
		}
		// On PostgreSQL this is BEGIN READ ONLY: a write fails with
		// SQLSTATE 25006.
		tx, err := conn.BeginTx(background(ctx), &sql.TxOptions{ReadOnly: true})
		if err != nil {
			a.layer.releaseReadConn(conn)
			return fmt.Errorf("begin: %w", err)
		}
		a.readConn, a.tx = conn, tx
		return nil
	}
	redo := func(*unit) error { return nil }
	if a.recorded() {
		// Undo takes the fence again when it has to begin anew (enterRedo).
		redo = a.fence
	}
	u, err := a.layer.group.enterRedo(ctx, true, redo)
	if err != nil && isBusy(err) && a.recorded() && a.layer.db.Dialect == schema.SQLite {
		// On SQLite enterRedo is enter, so enterBusy's retries are the same turn.
		u, err = a.enterBusy(ctx, err)
	}
	if err != nil {
		return err
	}
	u.outcome = a.recorded()
	a.unit, a.tx = u, u.tx()
	if !u.b.own {
		u.g.handlerTurn.Store(true) // until the unit leaves; see hookCommits
	}
	if a.recorded() {
		if err := a.fence(u); err != nil {
			return err
		}
		a.fenced.Store(true)
	}
	return nil
}

// enterBusy tries again to take the call's turn in the writer's
// transaction after the first try met SQLITE_BUSY: another process holds
// the file's write lock (its own batch, or a handler of its own inside
// one) past busy_timeout. The call is claimed and nothing of it has run,
// so waiting is safe, and answering not_recorded would only make the
// client retry what this attempt can still do. It waits, with backoff, no
// later than the call's deadline: its context's, and at most half the
// claim's lease from the claim, after which another process may take the
// call over (the fence would then refuse this attempt anyway). first is
// the error of the first try, returned if the deadline passes.
func (a *attempt) enterBusy(ctx context.Context, first error) (*unit, error) {
	deadline := a.claimedAt.Add(a.layer.opts.Lease / 2)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	err := first
	for wait := 5 * time.Millisecond; isBusy(err); wait = min(2*wait, 200*time.Millisecond) {
		if !time.Now().Add(wait).Before(deadline) {
			return nil, err
		}
		a.layer.logger.DebugContext(ctx, "database write lock held by another process; handler's first statement retried", "tool", a.tool.name)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		var u *unit
		if u, err = a.layer.group.enterBy(ctx, true, deadline); err == nil {
			return u, nil
		}
	}
	return nil, err
}

// fenceSQLite and fencePostgres read the call's row at the handler's first
// statement. By uid too: a claim whose batch did not commit gave back its
// row id, which the next insert takes (SQLite's AUTOINCREMENT only skips
// committed ids), so the id alone may name another call now. On
// PostgreSQL the row is locked until the outcome commits: from the
// handler's first statement on, no other attempt can take the call over,
// and one that tries waits for this transaction (and then finds the
// outcome) or gives up as busy. SQLite's single writer gives the same.
const (
	fenceSQLite   = `SELECT owner, state, lease_until FROM calls WHERE id = $1 AND uid = $2`
	fencePostgres = `SELECT owner, state, lease_until FROM calls WHERE id = $1 AND uid = $2 FOR UPDATE`
)

// fence checks, in the unit that will hold the outcome, that the call's
// row still names this attempt as owner.
func (a *attempt) fence(u *unit) error {
	var (
		owner, state string
		leaseUntil   int64
	)
	// A piped unit sends BEGIN with it: one round trip for both.
	err := u.queryFirst(a.layer.db.Pick(fenceSQLite, fencePostgres), []any{a.callID, a.uid}, &owner, &state, &leaseUntil)
	if errors.Is(err, sql.ErrNoRows) {
		// The claim is gone: the batch it rode in did not commit, or an
		// operator cleared it. Nobody else owns the call: a retry runs it.
		return errClaimGone
	}
	if err != nil {
		return fmt.Errorf("check ownership: %w", err)
	}
	if state == "in_flight" && owner != a.owner {
		switch a.layer.liveness(owner) {
		case ownerSelf, ownerDead:
			// The row names an attempt that is not running: one of
			// this layer (a holds the key's place in Layer.local, so
			// no other attempt here runs the call) or of a dead
			// process. So nobody took the call over: this attempt's
			// takeover was lost with the batch it rode in, and the
			// call stands as it was, which a retry takes over again.
			return errClaimGone
		}
	}
	if owner != a.owner || state != "in_flight" {
		return ErrOwnershipLost
	}
	if a.layer.db.Dialect == schema.Postgres && leaseUntil <= a.layer.nowMS() {
		// The lease passed before the handler's first statement (this
		// process was paused, or cut off from the database, longer than
		// the lease): another replica may be about to take the call
		// over, and an owner whose lease expired never commits. The
		// call stays claimed by nobody alive; a retry takes it over.
		return errLeaseExpired
	}
	return nil
}
