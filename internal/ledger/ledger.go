// Package ledger is the example tool server that `mcp-outbox serve` runs: a
// small payments ledger on SQLite with three tools. charge writes a row to
// its table charges and enqueues a POST to destination "payments" at
// /v1/charges; refund marks a charge refunded and enqueues a POST to
// /v1/refunds; balance reads the total.
//
// The same handlers run with the outbox layer ([Register]) or without it
// ([RegisterBare]), which is how `mcp-outbox demo` shows the difference.
package ledger

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

//go:embed migrations/*.up.sql migrations_postgres/*.up.sql
var embedded embed.FS

// Migrate creates the ledger's tables (migration set "ledger"), in the
// dialect of db.
func Migrate(ctx context.Context, db *schema.DB) error {
	sqlite, _ := fs.Sub(embedded, "migrations")
	postgres, _ := fs.Sub(embedded, "migrations_postgres")
	m, err := db.MigrationsFor(sqlite, postgres)
	if err != nil {
		return err
	}
	return db.Migrate(ctx, "ledger", m)
}

// Destination is where the ledger's effects go.
const Destination = "payments"

// Options configure the ledger's tools.
type Options struct {
	// Delay is simulated processing time inside charge, after its ledger
	// write, so that client timeouts can be reproduced. It ends early when
	// the call is cancelled.
	Delay time.Duration
	// Tasks are the task options of each tool, by name (outbox.ToolOptions.Tasks).
	Tasks map[string]outbox.TaskOptions
	// Retention are the retentions of each tool, by name
	// (outbox.ToolOptions.Retention).
	Retention map[string]outbox.ToolRetention
	// Gate, if not nil, runs at the start of charge, before its first
	// statement; an error it returns is charge's. Tests hold a call there.
	Gate func(context.Context) error
}

// MaxAmount is the largest amount charge takes: the largest integer that a
// float64 holds exactly, and with it every integer below (2^53 - 1). The
// go-sdk validates arguments as float64, so a larger amount could reach the
// handler changed; the input schema says so with a maximum, which also
// refuses such amounts where the outbox layer (which refuses them itself)
// is not in front of the tool (serve --bare).
const MaxAmount = 1<<53 - 1

// ChargeIn is the input of charge.
type ChargeIn struct {
	Amount   int64  `json:"amount" jsonschema:"amount in minor units (cents), greater than 0 and at most 9007199254740991"`
	Currency string `json:"currency,omitempty" jsonschema:"ISO 4217 code, default usd"`
}

// ChargeOut is the output of charge.
type ChargeOut struct {
	ChargeID int64  `json:"charge_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// RefundIn is the input of refund.
type RefundIn struct {
	ChargeID int64 `json:"charge_id" jsonschema:"the charge to refund"`
}

// RefundOut is the output of refund.
type RefundOut struct {
	ChargeID int64 `json:"charge_id"`
	Refunded int64 `json:"refunded"`
}

// BalanceIn is the (empty) input of balance.
type BalanceIn struct{}

// BalanceOut is the output of balance.
type BalanceOut struct {
	Charges int64            `json:"charges"`
	Total   map[string]int64 `json:"total"`
}

// Tools are the ledger's tool definitions.
var (
	ChargeTool = &mcp.Tool{
		Name:        "charge",
		Description: "Charge a payment: records it in the ledger and sends it to the payments API.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: false},
		InputSchema: chargeSchema(),
	}
	RefundTool = &mcp.Tool{
		Name:        "refund",
		Description: "Refund an earlier charge in full.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: false},
	}
	BalanceTool = &mcp.Tool{
		Name:        "balance",
		Description: "Total of the ledger's charges that are not refunded, by currency.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}
)

func ptr[T any](v T) *T { return &v }

// chargeSchema is ChargeIn's schema with the amount's maximum, as JSON
// text: the bare servers register it with mcp.AddTool as it is, and the
// go-sdk's stateless HTTP handler marshals a *jsonschema.Schema again on
// every call (see inputSchemaAsJSON in outbox), which the baselines should
// not pay when the layer does not.
func chargeSchema() json.RawMessage {
	s, err := jsonschema.For[ChargeIn](nil)
	if err != nil {
		panic(fmt.Sprintf("ledger: charge input schema: %v", err))
	}
	s.Properties["amount"].Maximum = ptr(float64(MaxAmount))
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("ledger: charge input schema: %v", err))
	}
	return b
}

// Register adds the ledger's tools to s through the outbox layer l.
func Register(l *outbox.Layer, s *mcp.Server, opts *Options) {
	h := handlers{opts: optsOf(opts)}
	topts := func(name string) *outbox.ToolOptions {
		return &outbox.ToolOptions{Tasks: h.opts.Tasks[name], Retention: h.opts.Retention[name]}
	}
	outbox.AddTool(l, s, ChargeTool, h.charge, topts(ChargeTool.Name))
	outbox.AddTool(l, s, RefundTool, h.refund, topts(RefundTool.Name))
	outbox.AddTool(l, s, BalanceTool, h.balance, topts(BalanceTool.Name))
}

func optsOf(o *Options) Options {
	if o == nil {
		return Options{}
	}
	return *o
}

type handlers struct{ opts Options }

var currencyCode = regexp.MustCompile(`^[a-z]{3}$`)

func (h handlers) charge(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in ChargeIn) (*mcp.CallToolResult, ChargeOut, error) {
	if h.opts.Gate != nil {
		if err := h.opts.Gate(ctx); err != nil {
			return nil, ChargeOut{}, err
		}
	}
	if in.Amount <= 0 {
		return nil, ChargeOut{}, outbox.Final(fmt.Errorf("amount must be greater than 0, got %d", in.Amount))
	}
	cur := strings.ToLower(in.Currency)
	if cur == "" {
		cur = "usd"
	}
	if !currencyCode.MatchString(cur) {
		return nil, ChargeOut{}, outbox.Final(fmt.Errorf("currency %q is not a three-letter code", in.Currency))
	}
	var id int64
	err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, $2, $3) RETURNING id`,
		in.Amount, cur, time.Now().UnixMilli()).Scan(&id)
	if err != nil {
		return nil, ChargeOut{}, fmt.Errorf("record charge: %w", err)
	}
	out := ChargeOut{ChargeID: id, Amount: in.Amount, Currency: cur}
	body, _ := json.Marshal(out)
	if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: Destination, Method: "POST", Path: "/v1/charges",
		Header: map[string]string{"Content-Type": "application/json"}, Body: body}); err != nil {
		return nil, ChargeOut{}, err
	}
	if h.opts.Delay > 0 {
		t := time.NewTimer(h.opts.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ChargeOut{}, ctx.Err()
		}
	}
	return nil, out, nil
}

func (h handlers) refund(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in RefundIn) (*mcp.CallToolResult, RefundOut, error) {
	var amount int64
	var refunded sql.NullInt64
	err := tx.QueryRowContext(ctx, `SELECT amount, refunded_at FROM charges WHERE id = $1`, in.ChargeID).Scan(&amount, &refunded)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, RefundOut{}, outbox.Final(fmt.Errorf("no charge with id %d", in.ChargeID))
	}
	if err != nil {
		return nil, RefundOut{}, fmt.Errorf("read charge: %w", err)
	}
	if refunded.Valid {
		return nil, RefundOut{}, outbox.Final(fmt.Errorf("charge %d was already refunded at %s", in.ChargeID,
			time.UnixMilli(refunded.Int64).UTC().Format(time.RFC3339)))
	}
	if _, err := tx.ExecContext(ctx, `UPDATE charges SET refunded_at = $1 WHERE id = $2`, time.Now().UnixMilli(), in.ChargeID); err != nil {
		return nil, RefundOut{}, fmt.Errorf("record refund: %w", err)
	}
	out := RefundOut{ChargeID: in.ChargeID, Refunded: amount}
	body, _ := json.Marshal(out)
	if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: Destination, Method: "POST", Path: "/v1/refunds",
		Header: map[string]string{"Content-Type": "application/json"}, Body: body}); err != nil {
		return nil, RefundOut{}, err
	}
	return nil, out, nil
}

func (h handlers) balance(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ BalanceIn) (*mcp.CallToolResult, BalanceOut, error) {
	rows, err := tx.QueryContext(ctx, `SELECT currency, count(*), sum(amount) FROM charges WHERE refunded_at IS NULL GROUP BY currency`)
	if err != nil {
		return nil, BalanceOut{}, fmt.Errorf("read balance: %w", err)
	}
	defer rows.Close()
	out := BalanceOut{Total: map[string]int64{}}
	for rows.Next() {
		var cur string
		var n, sum int64
		if err := rows.Scan(&cur, &n, &sum); err != nil {
			return nil, BalanceOut{}, fmt.Errorf("read balance: %w", err)
		}
		out.Charges += n
		out.Total[cur] = sum
	}
	return nil, out, rows.Err()
}
