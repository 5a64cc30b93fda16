package outbox_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
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

func openDB(tb testing.TB) *schema.DB {
	tb.Helper()
	db, err := schema.Open(context.Background(), filepath.Join(tb.TempDir(), "test.db"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	if err := ledger.Migrate(context.Background(), db); err != nil {
		tb.Fatal(err)
	}
	return db
}

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
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, outbox.WrapTransport(st), nil)
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
