package faultdb

import (
	"context"
	"database/sql/driver"
	"errors"
)

// The wrappers pass every call to the base driver's (modernc's or pgx's)
// connection, statement and transaction, asking the injector first. Both
// drivers' conns implement the context interfaces below; the wrappers
// implement the same ones, so database/sql takes the same paths through
// them as through the real driver (a wrapper lacking ExecerContext, say,
// would make database/sql prepare every Exec instead, and one lacking
// NamedValueChecker would convert arguments that pgx takes as they are).

type drv struct {
	base driver.Driver
	inj  *Injector
	pg   bool // base is pgx: faults are PostgreSQL's (see raise)
}

func (d *drv) Open(name string) (driver.Conn, error) {
	c, err := d.base.Open(name)
	if err != nil {
		return nil, err
	}
	return &conn{inner: c, inj: d.inj, pg: d.pg}, nil
}

// conn is one connection. database/sql uses a connection from one
// goroutine at a time, so its fields need no lock.
type conn struct {
	inner driver.Conn
	inj   *Injector
	pg    bool
	// stmts are the statements run since BEGIN, for commit rules; nil
	// outside a transaction.
	stmts []string
	inTx  bool
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
)

// before asks the injector about a statement about to run.
func (c *conn) before(ctx context.Context, op Op, query string) error {
	if c.inTx {
		c.stmts = append(c.stmts, query)
	}
	r := c.inj.decide(op, query, nil)
	if r == nil {
		return nil
	}
	if c.pg {
		// Every failed statement aborts PostgreSQL's transaction;
		// Rollback adds nothing.
		return c.raise(ctx, r.Kind)
	}
	if r.Rollback && c.inTx {
		// SQLite ended the transaction: the statements that follow run
		// outside one until the owner notices (its COMMIT fails).
		if e, ok := c.inner.(driver.ExecerContext); ok {
			_, _ = e.ExecContext(ctx, "ROLLBACK", nil)
		}
	}
	return Err(r.Kind)
}

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &stmt{inner: s, c: c, query: query}, nil
}

func (c *conn) Close() error { return c.inner.Close() }

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if r := c.inj.decide(Begin, "", nil); r != nil {
		if c.pg {
			return nil, c.raise(ctx, r.Kind) // outside a transaction: changes nothing
		}
		return nil, Err(r.Kind)
	}
	t, err := c.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.inTx, c.stmts = true, []string{}
	return &tx{inner: t, c: c}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.before(ctx, Exec, query); err != nil {
		return nil, err
	}
	return c.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.before(ctx, Query, query); err != nil {
		return nil, err
	}
	return c.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
}

// Ping, ResetSession and IsValid do what database/sql does for a driver
// without them when the base driver lacks them (pgx has no Validator).

func (c *conn) Ping(ctx context.Context) error {
	if p, ok := c.inner.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *conn) ResetSession(ctx context.Context) error {
	if r, ok := c.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *conn) IsValid() bool {
	if v, ok := c.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *conn) CheckNamedValue(v *driver.NamedValue) error {
	if nc, ok := c.inner.(driver.NamedValueChecker); ok {
		return nc.CheckNamedValue(v)
	}
	return driver.ErrSkip // database/sql's default conversion, as without the wrapper
}

type tx struct {
	inner driver.Tx
	c     *conn
}

func (t *tx) Commit() error {
	stmts := t.c.stmts
	t.c.inTx, t.c.stmts = false, nil
	if r := t.c.inj.decide(Commit, "", stmts); r != nil {
		// A commit that fails leaves nothing of the transaction.
		err := Err(r.Kind)
		if t.c.pg {
			// The server's error, raised in the transaction it ends.
			err = t.c.raise(context.Background(), r.Kind)
		}
		_ = t.inner.Rollback()
		return err
	}
	return t.inner.Commit()
}

func (t *tx) Rollback() error {
	t.c.inTx, t.c.stmts = false, nil
	return t.inner.Rollback()
}

type stmt struct {
	inner driver.Stmt
	c     *conn
	query string
}

var (
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
)

func (s *stmt) Close() error  { return s.inner.Close() }
func (s *stmt) NumInput() int { return s.inner.NumInput() }

func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := s.c.before(ctx, Exec, s.query); err != nil {
		return nil, err
	}
	return s.inner.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.c.before(ctx, Query, s.query); err != nil {
		return nil, err
	}
	return s.inner.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func named(args []driver.Value) []driver.NamedValue {
	out := make([]driver.NamedValue, len(args))
	for i, v := range args {
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return out
}

// errNoKind is returned for a Kind Err does not know; a test bug.
var errNoKind = errors.New("faultdb: unknown kind")
