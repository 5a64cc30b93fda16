package ledger

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// RegisterBare adds the same tools to s without the outbox layer, the way a
// server is typically written: every statement commits on its own, nothing
// is recorded, every call runs. It exists to show what the layer prevents
// (`mcp-outbox demo`) and as the baseline of benchmarks.
func RegisterBare(db *schema.DB, s *mcp.Server, opts *Options) {
	h := handlers{opts: optsOf(opts)}
	b := bareTx{db: db}
	mcp.AddTool(s, ChargeTool, bare(b, h.charge))
	mcp.AddTool(s, RefundTool, bare(b, h.refund))
	mcp.AddTool(s, BalanceTool, bare(b, h.balance))
}

func bare[In, Out any](b outbox.Tx, h outbox.HandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		return h(ctx, b, req, in)
	}
}

// bareTx runs each statement in autocommit mode.
type bareTx struct{ db *schema.DB }

func (b bareTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return b.db.Write.ExecContext(ctx, q, args...)
}

func (b bareTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return b.db.Read.QueryContext(ctx, q, args...)
}

func (b bareTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return b.db.Write.QueryRowContext(ctx, q, args...)
}

func (b bareTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return b.db.Write.PrepareContext(ctx, q)
}

func (b bareTx) Enqueue(ctx context.Context, e outbox.Effect) (string, error) {
	return insertBareEffect(ctx, b.db.Write, e)
}

// insertBareEffect queues an effect with a random key, as a server without
// the layer would: nothing ties it to the call.
func insertBareEffect(ctx context.Context, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, e outbox.Effect) (string, error) {
	var r [12]byte
	_, _ = rand.Read(r[:])
	key := "bare_" + hex.EncodeToString(r[:])
	headers, _ := json.Marshal(e.Header)
	now := time.Now().UnixMilli()
	_, err := db.ExecContext(ctx, `
INSERT INTO effects (seq, destination, method, path, headers, body, idempotency_key, next_attempt_at, created_at, updated_at)
VALUES (1, $1, $2, $3, $4, $5, $6, $7, $8, $9)`, e.Destination, e.Method, e.Path, string(headers), e.Body, key, now, now, now)
	return key, err
}

// RegisterBareTransactional adds the same tools to s without the layer,
// each call in one transaction of its own on the writer connection: how a
// careful server is written. One commit, and so one fsync, per call; nothing
// is recorded, every call runs. It is the stricter baseline of benchmarks.
func RegisterBareTransactional(db *schema.DB, s *mcp.Server, opts *Options) {
	h := handlers{opts: optsOf(opts)}
	mcp.AddTool(s, ChargeTool, inTx(db, h.charge))
	mcp.AddTool(s, RefundTool, inTx(db, h.refund))
	mcp.AddTool(s, BalanceTool, inTx(db, h.balance))
}

func inTx[In, Out any](db *schema.DB, h outbox.HandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		tx, err := db.Write.BeginTx(ctx, nil)
		if err != nil {
			return nil, zero, err
		}
		res, out, err := h(ctx, sqlTx{tx}, req, in)
		if err != nil || (res != nil && res.IsError) {
			_ = tx.Rollback()
			return res, out, err
		}
		if err := tx.Commit(); err != nil {
			return nil, zero, err
		}
		return res, out, nil
	}
}

// sqlTx is an outbox.Tx over a plain *sql.Tx.
// ExecContext, QueryContext, QueryRowContext and PrepareContext are
// *sql.Tx's own.
type sqlTx struct{ *sql.Tx }

func (t sqlTx) Enqueue(ctx context.Context, e outbox.Effect) (string, error) {
	return insertBareEffect(ctx, t.Tx, e)
}

// RegisterNothingKept adds the charge tool to s with nothing persisted: the
// same handler validates the input, takes an id from a counter, builds the
// effect's body and returns the same result, but no statement reaches a
// database. It is the limit of the outside-in benchmarks: what the go-sdk
// and the tool's own work cost, so that any store's figure can be read as a
// fraction of it.
func RegisterNothingKept(s *mcp.Server, opts *Options) {
	h := handlers{opts: optsOf(opts)}
	mcp.AddTool(s, ChargeTool, bare(&keptNothing{ids: sql.OpenDB(counter{new(atomic.Int64)})}, h.charge))
}

// keptNothing is an outbox.Tx that stores nothing. Only the statements of
// charge are answered: its INSERT … RETURNING id gets the next id from
// counter, a driver that keeps nothing (*sql.Row, which QueryRowContext
// returns, comes only from a driver).
type keptNothing struct{ ids *sql.DB }

var errNothingKept = errors.New("ledger: this server keeps nothing")

func (k *keptNothing) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, errNothingKept
}

func (k *keptNothing) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errNothingKept
}

func (k *keptNothing) QueryRowContext(ctx context.Context, q string, _ ...any) *sql.Row {
	return k.ids.QueryRowContext(ctx, q)
}

func (k *keptNothing) PrepareContext(context.Context, string) (*sql.Stmt, error) {
	return nil, errNothingKept
}

func (k *keptNothing) Enqueue(_ context.Context, e outbox.Effect) (string, error) {
	// Marshal the headers as insertBareEffect does, so that the limit does
	// the same work short of the statement.
	_, _ = json.Marshal(e.Header)
	var r [12]byte
	_, _ = rand.Read(r[:])
	return "bare_" + hex.EncodeToString(r[:]), nil
}

// counter is a database/sql driver whose every query answers one row: the
// next number.
type counter struct{ n *atomic.Int64 }

func (c counter) Connect(context.Context) (driver.Conn, error) { return c, nil }
func (c counter) Driver() driver.Driver                        { return c }
func (c counter) Open(string) (driver.Conn, error)             { return c, nil }
func (counter) Prepare(string) (driver.Stmt, error)            { return nil, errNothingKept }
func (counter) Close() error                                   { return nil }
func (counter) Begin() (driver.Tx, error)                      { return nil, errNothingKept }

func (c counter) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	return &counterRow{id: c.n.Add(1)}, nil
}

type counterRow struct {
	id   int64
	done bool
}

func (*counterRow) Columns() []string { return []string{"id"} }
func (*counterRow) Close() error      { return nil }

func (r *counterRow) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = r.id
	return nil
}
