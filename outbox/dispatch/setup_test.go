package dispatch_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The dispatcher's effects come from real tool calls: a layer of package
// outbox with the ledger's tools (internal/ledger) commits them, as in a
// server. These helpers are the few of package outbox's tests that the
// dispatcher's tests need; they pick the store the same way.

// TestMain stops the PostgreSQL server the tests started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// envTestStore selects the store, as in package outbox's tests: SQLite by
// default, PostgreSQL when MCP_OUTBOX_TEST_STORE=postgres.
const envTestStore = "MCP_OUTBOX_TEST_STORE"

func onPostgres() bool { return os.Getenv(envTestStore) == "postgres" }

// postgresOnly skips a test of something only the PostgreSQL store has.
func postgresOnly(tb testing.TB) {
	tb.Helper()
	if !onPostgres() {
		tb.Skip("PostgreSQL only (" + envTestStore + "=postgres)")
	}
}

// testTarget is a file in tb.TempDir, or a database of its own on the
// tests' PostgreSQL server.
func testTarget(tb testing.TB) string {
	tb.Helper()
	if onPostgres() {
		return pgtest.Database(tb)
	}
	return filepath.Join(tb.TempDir(), "test.db")
}

func openDB(tb testing.TB) *schema.DB {
	tb.Helper()
	db, err := schema.Open(context.Background(), testTarget(tb), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return mustLedger(tb, db)
}

func mustLedger(tb testing.TB, db *schema.DB) *schema.DB {
	tb.Helper()
	if err := ledger.Migrate(context.Background(), db); err != nil {
		tb.Fatal(err)
	}
	return db
}

// bundle is a database, a layer, a server with the ledger's tools, and a
// connected client session.
type bundle struct {
	db      *schema.DB
	layer   *outbox.Layer
	server  *mcp.Server
	session *mcp.ClientSession
}

func setup(tb testing.TB, opts *outbox.Options, lopts *ledger.Options) *bundle {
	tb.Helper()
	return setupOn(tb, openDB(tb), opts, lopts)
}

func setupOn(tb testing.TB, db *schema.DB, opts *outbox.Options, lopts *ledger.Options) *bundle {
	tb.Helper()
	l, err := outbox.New(db, opts)
	if err != nil {
		tb.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	ledger.Register(l, s, lopts)
	return &bundle{db: db, layer: l, server: s, session: connect(tb, s)}
}

func connect(tb testing.TB, s *mcp.Server) *mcp.ClientSession {
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

func count(tb testing.TB, db *sql.DB, query string, args ...any) int {
	tb.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

func call(t *testing.T, cs *mcp.ClientSession, name, key string, args any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{"idempotencyKey": key}
	}
	res, err := cs.CallTool(context.Background(), p)
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func callCharge(t *testing.T, cs *mcp.ClientSession, key string, amount int) *mcp.CallToolResult {
	t.Helper()
	return call(t, cs, "charge", key, map[string]any{"amount": amount})
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// status asks the layer's call_status tool.
func status(t *testing.T, cs *mcp.ClientSession, args map[string]any) query.Status {
	t.Helper()
	res := call(t, cs, outbox.StatusToolName, "", args)
	if res.IsError {
		t.Fatalf("status %v: %s", args, text(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	var st query.Status
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// clock is an injectable time source.
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

// deadOwner names an owner on this host whose process has exited.
func deadOwner(t *testing.T) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no hostname")
	}
	// pid 2^22+1 is above Linux's pid_max default, so no process has it;
	// a recorded start time that cannot match marks it as gone.
	return host + "/4194305/1/deadbeef#1"
}

// faultCalls is how many logical calls each fault case makes;
// MCP_OUTBOX_FAULT_CALLS raises it for a longer soak.
func faultCalls(t *testing.T) int {
	if v := os.Getenv("MCP_OUTBOX_FAULT_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("MCP_OUTBOX_FAULT_CALLS=%q: want a number of calls, at least 2", v)
		}
		return n
	}
	return 10
}

// faultBundle is a layer whose SQLite database runs through a fault
// injector, with several client sessions.
type faultBundle struct {
	*bundle
	inj      *faultdb.Injector
	sessions []*mcp.ClientSession
}

func faultSetup(t *testing.T, seed uint64, clients int, opts *outbox.Options) *faultBundle {
	t.Helper()
	in := faultdb.New(seed)
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "fault.db"),
		&schema.Options{Driver: in.DriverName(), Durability: schema.DurabilityNormal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := setupOn(t, mustLedger(t, db), opts, nil)
	fb := &faultBundle{bundle: b, inj: in, sessions: []*mcp.ClientSession{b.session}}
	for len(fb.sessions) < clients {
		fb.sessions = append(fb.sessions, connect(t, b.server))
	}
	return fb
}
