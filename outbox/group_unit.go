package outbox

import (
	"context"
	"database/sql"
	"fmt"
)

// tx is where the unit's statements run: its transaction, or for a piped
// unit its connection, inside the transaction the pipeline began.
func (u *unit) tx() handlerTx {
	if u.b.piped != nil {
		return u.b.conn
	}
	return u.b.tx
}

// exec runs a statement in the unit, prepared once it has been seen. Unit
// statements never take a call's context: SQLite's interrupt would roll back
// the whole shared transaction.
func (u *unit) exec(query string, args ...any) (sql.Result, error) {
	ctx := context.Background()
	if u.b.piped != nil {
		conn, err := u.pipedConn()
		if err != nil {
			return nil, err
		}
		return conn.ExecContext(u.b.piped.ctx, query, args...)
	}
	if st := u.g.stmts.lookup(query); st != nil {
		return u.b.txStmt(st).ExecContext(ctx, args...)
	}
	return u.b.tx.ExecContext(ctx, query, args...)
}

// query runs a query in the unit, like exec.
func (u *unit) query(query string, args ...any) (*sql.Rows, error) {
	ctx := context.Background()
	if u.b.piped != nil {
		conn, err := u.pipedConn()
		if err != nil {
			return nil, err
		}
		return conn.QueryContext(u.b.piped.ctx, query, args...)
	}
	if st := u.g.stmts.lookup(query); st != nil {
		return u.b.txStmt(st).QueryContext(ctx, args...)
	}
	return u.b.tx.QueryContext(ctx, query, args...)
}

// queryRow runs a query for one row in the unit, like exec.
func (u *unit) queryRow(query string, args ...any) *sql.Row {
	ctx := context.Background()
	if u.b.piped != nil {
		conn, err := u.pipedConn()
		if err != nil {
			return u.g.db.Read.QueryRowContext(failedContext{err}, "")
		}
		return conn.QueryRowContext(u.b.piped.ctx, query, args...)
	}
	if st := u.g.stmts.lookup(query); st != nil {
		return u.b.txStmt(st).QueryRowContext(ctx, args...)
	}
	return u.b.tx.QueryRowContext(ctx, query, args...)
}

// txStmt returns st bound to the batch's transaction.
func (b *batch) txStmt(st *sql.Stmt) *sql.Stmt {
	if ts := b.stmts[st]; ts != nil {
		return ts
	}
	ts := b.tx.StmtContext(context.Background(), st)
	if b.stmts == nil {
		b.stmts = make(map[*sql.Stmt]*sql.Stmt, 8)
	}
	b.stmts[st] = ts
	return ts
}

// undo rolls the unit's work back to its savepoint and keeps the unit.
func (u *unit) undo() error {
	if u.redo != nil {
		return u.again(u.redo)
	}
	return u.rollbackToSavepoint()
}

// undoAll is undo for a unit whose next statements need nothing of what it
// held at its start: a unit without a savepoint begins anew without redo.
// (abandon's release of the claim is a compare-and-set of its own, and
// must not depend on the fence that made the attempt give up.)
func (u *unit) undoAll() error {
	if u.redo != nil {
		return u.again(nil)
	}
	return u.rollbackToSavepoint()
}

func (u *unit) rollbackToSavepoint() error {
	if _, err := u.exec(`ROLLBACK TO unit`); err != nil {
		u.b.broken = savepointFailed("roll back to savepoint", err)
		return u.b.broken
	}
	return nil
}

// again is undo for a unit without a savepoint: its transaction is its
// own, so rolling all of it back undoes the unit's work and nobody else's.
// The new transaction has lost what the unit held (the fence's row lock),
// which redo takes again; the unit's SET LOCALs need nothing, as enterRedo
// sets none.
func (u *unit) again(redo func(*unit) error) error {
	b := u.b
	if b.piped != nil {
		// The handler's open rows and statements go with the
		// transaction; a redo's statements need a context of their own.
		u.g.rollbackPiped(b)
		b.piped.ctx, b.piped.cancel = context.WithCancel(context.Background())
		if redo == nil {
			return nil
		}
		if err := redo(u); err != nil {
			b.broken = err
			return err
		}
		return nil
	}
	_ = b.tx.Rollback()
	tx, err := b.conn.BeginTx(context.Background(), nil)
	if err != nil {
		b.broken = fmt.Errorf("begin again: %w", err)
		return b.broken
	}
	b.tx, b.stmts = tx, nil
	if redo == nil {
		return nil
	}
	if err := redo(u); err != nil {
		b.broken = err
		return err
	}
	return nil
}
