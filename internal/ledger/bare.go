package ledger

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
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

func (b bareTx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return b.db.Write.ExecContext(ctx, q, args...)
}

func (b bareTx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return b.db.Read.QueryContext(ctx, q, args...)
}

func (b bareTx) QueryRow(ctx context.Context, q string, args ...any) outbox.Row {
	return b.db.Write.QueryRowContext(ctx, q, args...)
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
type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, q, args...)
}

func (t sqlTx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, q, args...)
}

func (t sqlTx) QueryRow(ctx context.Context, q string, args ...any) outbox.Row {
	return t.tx.QueryRowContext(ctx, q, args...)
}

func (t sqlTx) Enqueue(ctx context.Context, e outbox.Effect) (string, error) {
	return insertBareEffect(ctx, t.tx, e)
}

// RegisterNothingKept adds the charge tool to s with nothing persisted: the
// same handler validates the input, takes an id from a counter, builds the
// effect's body and returns the same result, but no statement reaches a
// database. It is the limit of the outside-in benchmarks: what the go-sdk
// and the tool's own work cost, so that any store's figure can be read as a
// fraction of it.
func RegisterNothingKept(s *mcp.Server, opts *Options) {
	h := handlers{opts: optsOf(opts)}
	mcp.AddTool(s, ChargeTool, bare(&keptNothing{}, h.charge))
}

// keptNothing is an outbox.Tx that stores nothing. Only the statements of
// charge are answered: its INSERT … RETURNING id gets the next id.
type keptNothing struct{ lastID atomic.Int64 }

var errNothingKept = errors.New("ledger: this server keeps nothing")

func (k *keptNothing) Exec(context.Context, string, ...any) (sql.Result, error) {
	return nil, errNothingKept
}

func (k *keptNothing) Query(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errNothingKept
}

func (k *keptNothing) QueryRow(context.Context, string, ...any) outbox.Row {
	return keptRow{id: k.lastID.Add(1)}
}

func (k *keptNothing) Enqueue(_ context.Context, e outbox.Effect) (string, error) {
	// Marshal the headers as insertBareEffect does, so that the limit does
	// the same work short of the statement.
	_, _ = json.Marshal(e.Header)
	var r [12]byte
	_, _ = rand.Read(r[:])
	return "bare_" + hex.EncodeToString(r[:]), nil
}

type keptRow struct{ id int64 }

func (r keptRow) Scan(dest ...any) error {
	if len(dest) != 1 {
		return errNothingKept
	}
	p, ok := dest[0].(*int64)
	if !ok {
		return errNothingKept
	}
	*p = r.id
	return nil
}

func (keptRow) Err() error { return nil }
