package dispatch_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The dispatcher's effects come from real tool calls: a layer of package
// outbox with the ledger's tools (internal/ledger) commits them, as in a
// server. These helpers are the few of package outbox's tests that the
// dispatcher's tests need; they pick the store the same way.

// TestMain stops the PostgreSQL server the tests started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// The store is SQLite by default, PostgreSQL when
// MCP_OUTBOX_TEST_STORE=postgres (outboxtest.EnvStore), as in package
// outbox's tests.
func onPostgres() bool { return outboxtest.OnPostgres() }

// postgresOnly skips a test of something only the PostgreSQL store has.
func postgresOnly(tb testing.TB) { tb.Helper(); outboxtest.PostgresOnly(tb) }

// testTarget is a file in tb.TempDir, or a database of its own on the
// tests' PostgreSQL server.
func testTarget(tb testing.TB) string { tb.Helper(); return outboxtest.Target(tb) }

func openDB(tb testing.TB) *schema.DB { tb.Helper(); return outboxtest.OpenDB(tb) }

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
	return outboxtest.Connect(tb, s)
}

func count(tb testing.TB, db *sql.DB, query string, args ...any) int {
	tb.Helper()
	return outboxtest.Count(tb, db, query, args...)
}

func call(t *testing.T, cs *mcp.ClientSession, name, key string, args any) *mcp.CallToolResult {
	t.Helper()
	return outboxtest.Call(t, cs, name, key, args)
}

func callCharge(t *testing.T, cs *mcp.ClientSession, key string, amount int) *mcp.CallToolResult {
	t.Helper()
	return outboxtest.CallCharge(t, cs, key, amount)
}

func text(res *mcp.CallToolResult) string { return outboxtest.Text(res) }

// status asks the layer's call_status tool.
func status(t *testing.T, cs *mcp.ClientSession, args map[string]any) query.Status {
	t.Helper()
	return outboxtest.Status(t, cs, args)
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
