package postgres

import (
	"context"
	"database/sql/driver"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Pipe sends stmts as one pgx batch on the pgx connection under a
// database/sql one (stdlib.Conn.Conn): pgx queues them all and sends a
// single Sync, so the batch costs one round trip once its statements are
// in the connection's statement cache (the first time, their Parse and
// Describe cost one more). Up to the Sync they run as one implicit
// transaction unless one of them is BEGIN; the server skips every
// statement after one that fails.
//
// What pgx's database/sql driver does not allow, and why the layer comes
// here: stdlib.Conn.BeginTx sends BEGIN at once, on its own (there is no
// deferred begin, and sql.TxOptions only carries isolation and read-only),
// and a *sql.Tx's Commit sends COMMIT on its own; database/sql has no way
// to send two statements with arguments together. A transaction begun
// here is one database/sql does not know of: its statements then run on
// the *sql.Conn, never a *sql.Tx, and it must end here too (COMMIT or
// ROLLBACK), since a COMMIT sent under a *sql.Tx would leave that Tx
// believing itself open. The driver's ResetSession discards a connection
// handed back with a transaction still open (TxStatus not idle), so one
// left open by a failure is never reused mid-transaction.
func (store) Pipe(ctx context.Context, driverConn any, stmts []schema.Piped) ([]schema.PipedResult, error) {
	c, ok := driverConn.(*stdlib.Conn)
	if !ok {
		return nil, schema.ErrNoPipe
	}
	conn := c.Conn()
	if conn.IsClosed() {
		return nil, driver.ErrBadConn
	}
	if conn.PgConn().IsBusy() {
		// pgx would answer "conn busy" too, but as an error that could
		// have come after the statements went.
		return nil, schema.ErrPipeBusy
	}
	if len(stmts) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.SQL, s.Args...)
	}
	br := conn.SendBatch(ctx, b)
	results := make([]schema.PipedResult, 0, len(stmts))
	var err error
	for _, s := range stmts {
		var r schema.PipedResult
		r, err = pipedResult(br, s)
		if err != nil {
			break
		}
		results = append(results, r)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return results, err
}

func pipedResult(br pgx.BatchResults, s schema.Piped) (schema.PipedResult, error) {
	if s.Dest == nil {
		tag, err := br.Exec()
		if err != nil {
			return schema.PipedResult{}, err
		}
		return schema.PipedResult{Tag: tag.String(), Rows: tag.RowsAffected()}, nil
	}
	rows, err := br.Query()
	if err != nil {
		return schema.PipedResult{}, err
	}
	var r schema.PipedResult
	if rows.Next() {
		if err := rows.Scan(s.Dest...); err != nil {
			rows.Close()
			return schema.PipedResult{}, err
		}
		r.Found = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return schema.PipedResult{}, err
	}
	tag := rows.CommandTag()
	r.Tag, r.Rows = tag.String(), tag.RowsAffected()
	return r, nil
}
