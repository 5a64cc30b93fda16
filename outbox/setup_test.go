package outbox_test

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// bundle is what most tests need: a database in t.TempDir, a layer, a server
// with the ledger's tools, and a connected client session.
type bundle struct {
	db      *schema.DB
	layer   *outbox.Layer
	server  *mcp.Server
	session *mcp.ClientSession
}

// TestMain stops the PostgreSQL server the tests started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// The tests of this package are one suite for both stores: they run on
// SQLite by default and on PostgreSQL when MCP_OUTBOX_TEST_STORE=postgres
// (outboxtest.EnvStore; make test runs both). Tests of what only one store
// has say so with sqliteOnly.
func onPostgres() bool { return outboxtest.OnPostgres() }

// sqliteOnly skips a test of something only the SQLite store has (one
// file and its WAL, SQLITE_BUSY between processes, /proc liveness).
func sqliteOnly(tb testing.TB, what string) { tb.Helper(); outboxtest.SQLiteOnly(tb, what) }

// postgresOnly skips a test of something only the PostgreSQL store has.
func postgresOnly(tb testing.TB) { tb.Helper(); outboxtest.PostgresOnly(tb) }

// testTarget is where a test's database lives: a file in tb.TempDir, or
// a database of its own on the tests' PostgreSQL server.
func testTarget(tb testing.TB) string { tb.Helper(); return outboxtest.Target(tb) }

func openDB(tb testing.TB) *schema.DB { tb.Helper(); return outboxtest.OpenDB(tb) }

func setup(tb testing.TB, opts *outbox.Options, lopts *ledger.Options) *bundle {
	tb.Helper()
	db := openDB(tb)
	return setupOn(tb, db, opts, lopts)
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

func charges(tb testing.TB, b *bundle) int {
	return count(tb, b.db.Read, `SELECT count(*) FROM charges`)
}

func mustLedger(tb testing.TB, db *schema.DB) *schema.DB {
	tb.Helper()
	if err := ledger.Migrate(context.Background(), db); err != nil {
		tb.Fatal(err)
	}
	return db
}

func hostname() (string, error) { return os.Hostname() }
