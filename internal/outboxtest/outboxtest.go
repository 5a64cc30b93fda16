// Package outboxtest holds the test helpers that the suites of outbox,
// outbox/dispatch and internal/admin share: the store a test runs on, a
// database with the example ledger's tables, an in-memory client session,
// and calls of tools and of the status tool. Each suite runs on SQLite by
// default and on PostgreSQL when MCP_OUTBOX_TEST_STORE=postgres (make test
// runs both).
package outboxtest

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// EnvStore names the store the suites run on: "postgres", or SQLite.
const EnvStore = "MCP_OUTBOX_TEST_STORE"

// OnPostgres reports whether the tests run on PostgreSQL.
func OnPostgres() bool { return os.Getenv(EnvStore) == "postgres" }

// SQLiteOnly skips a test of something only the SQLite store has (one
// file and its WAL, SQLITE_BUSY between processes, /proc liveness).
func SQLiteOnly(tb testing.TB, what string) {
	tb.Helper()
	if OnPostgres() {
		tb.Skip("SQLite only: " + what)
	}
}

// PostgresOnly skips a test of something only the PostgreSQL store has.
func PostgresOnly(tb testing.TB) {
	tb.Helper()
	if !OnPostgres() {
		tb.Skip("PostgreSQL only (" + EnvStore + "=postgres)")
	}
}

// Target is where a test's database lives: a file in tb.TempDir, or a
// database of its own on the tests' PostgreSQL server.
func Target(tb testing.TB) string {
	tb.Helper()
	if OnPostgres() {
		return pgtest.Database(tb)
	}
	return filepath.Join(tb.TempDir(), "test.db")
}

// OpenDB opens a database of the test's own, with the example ledger's
// tables, closed when the test ends.
func OpenDB(tb testing.TB) *schema.DB {
	tb.Helper()
	db, err := schema.Open(context.Background(), Target(tb), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	if err := ledger.Migrate(context.Background(), db); err != nil {
		tb.Fatal(err)
	}
	return db
}

// Connect connects an in-memory client to s, through the hardened stdio
// transport, until the test ends.
func Connect(tb testing.TB, s *mcp.Server) *mcp.ClientSession {
	tb.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, mcpstdio.NewTransport(st, nil), nil)
	if err != nil {
		tb.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cs.Close(); ss.Wait() })
	return cs
}

// Count runs a query of one integer.
func Count(tb testing.TB, db *sql.DB, query string, args ...any) int {
	tb.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// Strings runs a query of one text column and returns its rows' values.
func Strings(tb testing.TB, db *sql.DB, query string, args ...any) []string {
	tb.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			tb.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// CallStates lists the states of the recorded calls, oldest first, comma
// separated ("completed,unknown").
func CallStates(tb testing.TB, db *sql.DB) string {
	tb.Helper()
	return strings.Join(Strings(tb, db, `SELECT state FROM calls ORDER BY id`), ",")
}

// CallErr calls tool name with args, under key in _meta ("" sends none).
func CallErr(ctx context.Context, cs *mcp.ClientSession, name, key string, args any) (*mcp.CallToolResult, error) {
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{"idempotencyKey": key}
	}
	return cs.CallTool(ctx, p)
}

// Call is CallErr that fails the test on a protocol error.
func Call(tb testing.TB, cs *mcp.ClientSession, name, key string, args any) *mcp.CallToolResult {
	tb.Helper()
	res, err := CallErr(context.Background(), cs, name, key, args)
	if err != nil {
		tb.Fatalf("call %s: %v", name, err)
	}
	return res
}

// CallCharge calls the ledger's charge tool.
func CallCharge(tb testing.TB, cs *mcp.ClientSession, key string, amount int) *mcp.CallToolResult {
	tb.Helper()
	return Call(tb, cs, "charge", key, map[string]any{"amount": amount})
}

// CallMeta is what the layer says of a call in its answer's _meta.
func CallMeta(res *mcp.CallToolResult) map[string]any {
	m, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
	return m
}

// Text is an answer's text content, a line per block.
func Text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// Status asks the layer's call_status tool.
func Status(tb testing.TB, cs *mcp.ClientSession, args map[string]any) query.Status {
	tb.Helper()
	res := Call(tb, cs, outbox.StatusToolName, "", args)
	if res.IsError {
		tb.Fatalf("status %v: %s", args, Text(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	var st query.Status
	if err := json.Unmarshal(b, &st); err != nil {
		tb.Fatal(err)
	}
	return st
}
