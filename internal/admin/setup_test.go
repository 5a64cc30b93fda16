package admin_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestMain stops the PostgreSQL server the tests started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// The tests run on SQLite by default and on PostgreSQL when
// MCP_OUTBOX_TEST_STORE=postgres, as package outbox's do (outboxtest).
func sqliteOnly(tb testing.TB, what string) { tb.Helper(); outboxtest.SQLiteOnly(tb, what) }

func openDB(tb testing.TB) *schema.DB { tb.Helper(); return outboxtest.OpenDB(tb) }

// bundle is a database with a layer serving the ledger's tools, and a
// client connected to it: the operator's actions settle what real calls
// left.
type bundle struct {
	db      *schema.DB
	layer   *outbox.Layer
	session *mcp.ClientSession
}

func setup(tb testing.TB, opts *outbox.Options) *bundle {
	tb.Helper()
	db := openDB(tb)
	l, err := outbox.New(db, opts)
	if err != nil {
		tb.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	ledger.Register(l, s, nil)
	ctx := context.Background()
	// The keys travel in _meta, so the transport needs no wrapping.
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		tb.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cs.Close(); ss.Wait() })
	return &bundle{db: db, layer: l, session: cs}
}

func callCharge(t *testing.T, cs *mcp.ClientSession, key string, amount int) *mcp.CallToolResult {
	t.Helper()
	return outboxtest.CallCharge(t, cs, key, amount)
}

func callMeta(res *mcp.CallToolResult) map[string]any { return outboxtest.CallMeta(res) }

func text(res *mcp.CallToolResult) string { return outboxtest.Text(res) }

func status(t *testing.T, cs *mcp.ClientSession, args map[string]any) query.Status {
	t.Helper()
	return outboxtest.Status(t, cs, args)
}

func count(tb testing.TB, db *sql.DB, query string, args ...any) int {
	tb.Helper()
	return outboxtest.Count(tb, db, query, args...)
}

func charges(tb testing.TB, b *bundle) int {
	return count(tb, b.db.Read, `SELECT count(*) FROM charges`)
}

func keysOf(t *testing.T, db *schema.DB, q string) string {
	t.Helper()
	return fmt.Sprint(outboxtest.Strings(t, db.Read, q))
}

// clock is the layer's clock, moved by the test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
