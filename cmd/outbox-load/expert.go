package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
)

// The two servers an expert writes by hand, each the best of its store
// without the layer: the same charge tool, the same rows (a charge and its
// effect), no exactly-once machinery. They are what the layer's figures
// are held against (issue 28).

// checkCharge validates charge's input as the ledger's handler does.
func checkCharge(in ledger.ChargeIn) (currency string, err error) {
	if in.Amount <= 0 {
		return "", fmt.Errorf("amount must be greater than 0, got %d", in.Amount)
	}
	cur := strings.ToLower(in.Currency)
	if cur == "" {
		cur = "usd"
	}
	if len(cur) != 3 || strings.Trim(cur, "abcdefghijklmnopqrstuvwxyz") != "" {
		return "", fmt.Errorf("currency %q is not a three-letter code", in.Currency)
	}
	return cur, nil
}

const (
	expertInsertCharge = `INSERT INTO charges (amount, currency, created_at) VALUES ($1, $2, $3) RETURNING id`
	expertInsertEffect = `
INSERT INTO effects (seq, destination, method, path, headers, body, idempotency_key, next_attempt_at, created_at, updated_at)
VALUES (1, $1, 'POST', '/v1/charges', '{"Content-Type":"application/json"}', $2, $3, $4, $4, $4)`
)

// chargeBody is the effect's body: the charge as the tool returns it.
func chargeBody(out ledger.ChargeOut) []byte {
	b, _ := json.Marshal(out)
	return b
}

// groupCharge is one call waiting for the writer.
type groupCharge struct {
	amount   int64
	currency string
	done     chan groupDone
}

type groupDone struct {
	out ledger.ChargeOut
	err error
}

// registerGroupCommit adds charge to s as an expert writes it for SQLite:
// one writer goroutine takes every call waiting, inserts them all in one
// transaction with prepared statements, commits (WAL, synchronous=FULL, so
// one fsync for the lot) and only then answers each. A call whose insert
// fails fails alone; a failed commit fails every call of the batch.
func registerGroupCommit(ctx context.Context, db *sql.DB, s *mcp.Server) error {
	insCharge, err := db.PrepareContext(ctx, expertInsertCharge)
	if err != nil {
		return err
	}
	insEffect, err := db.PrepareContext(ctx, expertInsertEffect)
	if err != nil {
		return err
	}
	queue := make(chan *groupCharge, 1024)
	go func() {
		var batch []*groupCharge
		for {
			select {
			case c := <-queue:
				batch = append(batch[:0], c)
			case <-ctx.Done():
				return
			}
		drain:
			for len(batch) < cap(queue) {
				select {
				case c := <-queue:
					batch = append(batch, c)
				default:
					break drain
				}
			}
			writeBatch(db, insCharge, insEffect, batch)
		}
	}()
	mcp.AddTool(s, ledger.ChargeTool, func(ctx context.Context, _ *mcp.CallToolRequest, in ledger.ChargeIn) (*mcp.CallToolResult, ledger.ChargeOut, error) {
		cur, err := checkCharge(in)
		if err != nil {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, ledger.ChargeOut{}, nil
		}
		c := &groupCharge{amount: in.Amount, currency: cur, done: make(chan groupDone, 1)}
		select {
		case queue <- c:
		case <-ctx.Done():
			return nil, ledger.ChargeOut{}, ctx.Err()
		}
		// Once queued, the call's fate is the batch's: wait for it even if
		// the client goes, so that no answer ever precedes its commit.
		d := <-c.done
		return nil, d.out, d.err
	})
	return nil
}

func writeBatch(db *sql.DB, insCharge, insEffect *sql.Stmt, batch []*groupCharge) {
	ctx := context.Background()
	fail := func(err error) {
		for _, c := range batch {
			c.done <- groupDone{err: err}
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fail(err)
		return
	}
	chargeTx, effectTx := tx.StmtContext(ctx, insCharge), tx.StmtContext(ctx, insEffect)
	outs := make([]groupDone, len(batch))
	now := time.Now().UnixMilli()
	for i, c := range batch {
		var id int64
		if err := chargeTx.QueryRowContext(ctx, c.amount, c.currency, now).Scan(&id); err != nil {
			// On SQLite a failed insert undoes only itself (ABORT).
			outs[i].err = err
			continue
		}
		out := ledger.ChargeOut{ChargeID: id, Amount: c.amount, Currency: c.currency}
		if _, err := effectTx.ExecContext(ctx, ledger.Destination, chargeBody(out), fmt.Sprintf("expert_%d", id), now); err != nil {
			outs[i].err = err
			continue
		}
		outs[i].out = out
	}
	if err := tx.Commit(); err != nil {
		fail(err)
		return
	}
	for i, c := range batch {
		c.done <- outs[i]
	}
}

// registerPgx adds charge to s as a careful user writes it with pgx
// natively on PostgreSQL: per call BEGIN, the charge's INSERT … RETURNING,
// then the effect's INSERT and COMMIT sent together as one batch. Three
// round trips, the fewest an interactive transaction that needs the
// charge's id before writing its effect can take.
func registerPgx(pool *pgxpool.Pool, s *mcp.Server) {
	mcp.AddTool(s, ledger.ChargeTool, func(ctx context.Context, _ *mcp.CallToolRequest, in ledger.ChargeIn) (*mcp.CallToolResult, ledger.ChargeOut, error) {
		cur, err := checkCharge(in)
		if err != nil {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, ledger.ChargeOut{}, nil
		}
		ctx = context.WithoutCancel(ctx)
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, ledger.ChargeOut{}, err
		}
		out, err := pgxCharge(ctx, c.Conn(), in.Amount, cur)
		if err != nil {
			// The connection may be left inside a transaction: drop it.
			_ = c.Conn().Close(ctx)
		}
		c.Release()
		if err != nil {
			return nil, ledger.ChargeOut{}, err
		}
		return nil, out, nil
	})
}

func pgxCharge(ctx context.Context, c *pgx.Conn, amount int64, cur string) (ledger.ChargeOut, error) {
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		return ledger.ChargeOut{}, err
	}
	now := time.Now().UnixMilli()
	var id int64
	if err := c.QueryRow(ctx, expertInsertCharge, amount, cur, now).Scan(&id); err != nil {
		return ledger.ChargeOut{}, err
	}
	out := ledger.ChargeOut{ChargeID: id, Amount: amount, Currency: cur}
	b := &pgx.Batch{}
	b.Queue(expertInsertEffect, ledger.Destination, chargeBody(out), fmt.Sprintf("pgx_%d", id), now)
	b.Queue("COMMIT")
	br := c.SendBatch(ctx, b)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("commit answered %q", tag)
	}
	return out, err
}
