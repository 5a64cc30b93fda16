package schema

import (
	"context"
	"database/sql"
	"errors"
)

// Piped is one of several statements sent to the store together: all of
// them go out before the first answer is read, so together they cost one
// round trip (PostgreSQL's pipeline, which the layer uses across a
// network, where a call costs its round trips). The server runs them in
// order; after the first that fails it runs none of the others.
type Piped struct {
	SQL  string
	Args []any
	// Dest, when not nil, receives the columns of the statement's first
	// row.
	Dest []any
}

// PipedResult is what one piped statement answered.
type PipedResult struct {
	// Tag is the server's command tag ("COMMIT", "ROLLBACK", "UPDATE 1").
	Tag string
	// Rows is the number of rows the statement affected or returned.
	Rows int64
	// Found: the statement returned a row, which Dest received.
	Found bool
}

// ErrNoPipe is returned by [DB.Pipe] when the statements cannot be sent
// together, before anything is sent: the store has no pipeline (SQLite,
// which has no network to save), or the connection's driver is not the
// store's own but one that wraps it ([Options].Driver: a tracing or
// fault-injecting driver sees statements one by one, so the layer sends
// them that way through it).
var ErrNoPipe = errors.New("the connection cannot send statements together")

// ErrPipeBusy is returned by [DB.Pipe], before anything is sent, when
// the connection is still reading the rows of an earlier statement that
// nobody closed. Pipe with no statements tells whether it is.
var ErrPipeBusy = errors.New("the connection is still reading an earlier statement's rows")

// piper is a Store that can pipeline statements on a connection of its
// own driver.
type piper interface {
	// Pipe sends stmts on driverConn together, or returns ErrNoPipe if
	// driverConn is not its driver's.
	Pipe(ctx context.Context, driverConn any, stmts []Piped) ([]PipedResult, error)
}

// CanPipe reports whether [DB.Pipe] can send statements together on conn.
func (db *DB) CanPipe(conn *sql.Conn) bool {
	p, ok := db.store.(piper)
	if !ok {
		return false
	}
	return conn.Raw(func(dc any) error {
		_, err := p.Pipe(context.Background(), dc, nil)
		return err
	}) == nil
}

// Pipe sends stmts on conn together and reads their answers in order. It
// returns the results of the statements that succeeded; on an error,
// len(results) is the index of the statement that failed, or the number
// of statements when what failed was the connection after the last one.
// A connection that fails midway leaves unknown what the server ran.
func (db *DB) Pipe(ctx context.Context, conn *sql.Conn, stmts ...Piped) (results []PipedResult, err error) {
	p, ok := db.store.(piper)
	if !ok {
		return nil, ErrNoPipe
	}
	rawErr := conn.Raw(func(dc any) error {
		results, err = p.Pipe(ctx, dc, stmts)
		return nil
	})
	if rawErr != nil {
		return nil, rawErr
	}
	return results, err
}
