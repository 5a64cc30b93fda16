package query_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/XSAM/otelsql"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// openInstrumented opens a fresh PostgreSQL database through pgx wrapped
// by otelsql, as a user who traces their SQL does, and returns it with the
// spans the wrapper recorded. The wrapper's driver is not pgx's type, so
// code that sniffed the driver to choose its SQL sent SQLite's to
// PostgreSQL here.
func openInstrumented(t *testing.T) (*schema.DB, *tracetest.SpanRecorder) {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	driver, err := otelsql.Register("pgx", otelsql.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	db, err := schema.Open(context.Background(), pgtest.Database(t), &schema.Options{Driver: driver})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if db.Dialect != schema.Postgres {
		t.Fatalf("dialect %q through an instrumented driver, want %q", db.Dialect, schema.Postgres)
	}
	return db, spans
}

// Every read of this package on PostgreSQL behind an instrumenting driver.
func TestQuery_InstrumentedPostgres(t *testing.T) {
	t.Parallel()
	db, spans := openInstrumented(t)
	testReads(t, db)
	if len(spans.Ended()) == 0 {
		t.Fatal("the wrapper recorded no span: the reads did not go through it")
	}
}

// A call through the layer, its status, and the operator's page and admin
// API, all on PostgreSQL behind an instrumenting driver: the statements
// the page needs differ between the stores (the page answered 500 when
// they were chosen by the driver's type).
func TestQuery_InstrumentedPostgresLayer(t *testing.T) {
	t.Parallel()
	db, spans := openInstrumented(t)
	ctx := context.Background()
	if _, err := db.Write.ExecContext(ctx, `CREATE TABLE tickets (id BIGSERIAL PRIMARY KEY, title TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	layer, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	server := layer.NewServer(&mcp.Implementation{Name: "tickets", Version: "v1"}, nil)
	type in struct {
		Title string `json:"title"`
	}
	type out struct {
		ID int64 `json:"id"`
	}
	outbox.AddTool(layer, server, &mcp.Tool{Name: "create_ticket", Description: "Open a ticket."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, out, error) {
			var id int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO tickets (title) VALUES ($1) RETURNING id`, a.Title).Scan(&id); err != nil {
				return nil, out{}, err
			}
			_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "tracker", Method: "POST", Path: "/v1/tickets",
				Body: fmt.Appendf(nil, `{"id":%d}`, id)})
			return nil, out{ID: id}, err
		}, nil)
	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, mcpstdio.NewTransport(st, nil), nil); err != nil {
		t.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	res, err := client.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: in{Title: "printer on fire"},
		Meta: mcp.Meta{"idempotencyKey": "ticket-1"}})
	if err != nil || res.IsError {
		t.Fatalf("call: %v, %+v", err, res)
	}

	status, err := query.Lookup(ctx, db, callkey.LocalPrincipal, "ticket-1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if status.State != query.Completed || status.Tool != "create_ticket" || len(status.Effects) != 1 {
		t.Fatalf("status: %+v", status)
	}

	h, err := operator.NewHandler(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path, form, want string }{
		// The page: counts by destination, stuck effects, recent calls,
		// the delivery chart.
		{http.MethodGet, "/", "", "create_ticket"},
		// Its lookup of one call: Lookup and EffectIDs.
		{http.MethodPost, "/lookup", "principal=local&key=ticket-1", "/v1/tickets"},
		{http.MethodGet, "/admin/effects", "", `"tracker"`},
		{http.MethodGet, "/admin/summary", "", `"pending"`},
		{http.MethodGet, "/admin/calls/unknown", "", `[]`},
		{http.MethodGet, "/readyz", "", ""},
	} {
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.form))
		req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
		if c.form != "" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), c.want) {
			t.Errorf("%s %s: %d, want 200 with %q:\n%.2000s", c.method, c.path, rec.Code, c.want, rec.Body.String())
		}
	}
	if len(spans.Ended()) == 0 {
		t.Fatal("the wrapper recorded no span: the layer's statements did not go through it")
	}
}
