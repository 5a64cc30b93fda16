package sqlcexample_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/examples/sqlc/postgresql/ticketpg"
	"github.com/mcp-outbox/mcp-outbox/examples/sqlc/sqlite/ticketsqlite"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// tickets is what the test needs of one engine's generated package.
type tickets interface {
	// create runs CreateTicket (QueryRowContext), CloseTicket
	// (ExecContext) and ListTickets (QueryContext) in tx, and returns the
	// new ticket's id and the customer's ticket count.
	create(ctx context.Context, tx outbox.Tx, title, customer string) (id int64, n int, err error)
}

type sqliteTickets struct{ prepared bool }

func (s sqliteTickets) create(ctx context.Context, tx outbox.Tx, title, customer string) (int64, int, error) {
	q := ticketsqlite.New(tx)
	if s.prepared {
		var err error
		if q, err = ticketsqlite.Prepare(ctx, tx); err != nil {
			return 0, 0, err
		}
		defer q.Close()
	}
	t, err := q.CreateTicket(ctx, ticketsqlite.CreateTicketParams{Title: title, Customer: customer})
	if err != nil {
		return 0, 0, err
	}
	if err := q.CloseTicket(ctx, t.ID); err != nil {
		return 0, 0, err
	}
	if got, err := q.GetTicket(ctx, t.ID); err != nil || got.Status != "closed" {
		return 0, 0, fmt.Errorf("get ticket: %+v, %v", got, err)
	}
	list, err := q.ListTickets(ctx, customer)
	return t.ID, len(list), err
}

type pgTickets struct{}

func (pgTickets) create(ctx context.Context, tx outbox.Tx, title, customer string) (int64, int, error) {
	q := ticketpg.New(tx)
	t, err := q.CreateTicket(ctx, ticketpg.CreateTicketParams{Title: title, Customer: customer})
	if err != nil {
		return 0, 0, err
	}
	if err := q.CloseTicket(ctx, t.ID); err != nil {
		return 0, 0, err
	}
	if got, err := q.GetTicket(ctx, t.ID); err != nil || got.Status != "closed" {
		return 0, 0, fmt.Errorf("get ticket: %+v, %v", got, err)
	}
	list, err := q.ListTickets(ctx, customer)
	return t.ID, len(list), err
}

type ticketIn struct {
	Title    string `json:"title"`
	Customer string `json:"customer"`
	Decline  bool   `json:"decline,omitempty"`
}

type ticketOut struct {
	ID    int64 `json:"id"`
	Count int   `json:"count"`
}

// sqlc's generated code runs inside tool handlers on both stores: its
// rows commit with the call's recorded outcome, a retry replays that
// outcome without running the queries again, and a call that fails after
// writing keeps none of its rows.
func TestGeneratedQueriesInHandlers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		target func(testing.TB) string
		schema string
		q      tickets
	}{
		{"SQLite", sqliteTarget, "sqlite/schema.sql", sqliteTickets{}},
		{"SQLitePrepared", sqliteTarget, "sqlite/schema.sql", sqliteTickets{prepared: true}},
		{"PostgreSQL", pgtest.Database, "postgresql/schema.sql", pgTickets{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, err := schema.Open(ctx, tc.target(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			ddl, err := os.ReadFile(tc.schema)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Write.ExecContext(ctx, string(ddl)); err != nil {
				t.Fatal(err)
			}
			l, err := outbox.New(db, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := l.NewServer(&mcp.Implementation{Name: "tickets", Version: "v0"}, nil)
			runs := 0
			outbox.AddTool(l, s, &mcp.Tool{Name: "create_ticket"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in ticketIn) (*mcp.CallToolResult, ticketOut, error) {
				runs++
				id, n, err := tc.q.create(ctx, tx, in.Title, in.Customer)
				if err != nil {
					return nil, ticketOut{}, err
				}
				if in.Decline {
					// A business refusal after the writes: recorded as the
					// call's failed outcome, and its rows roll back.
					return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "declined"}}}, ticketOut{}, nil
				}
				return nil, ticketOut{ID: id, Count: n}, nil
			}, nil)
			cs := connect(t, s)

			call := func(key string, in ticketIn) *mcp.CallToolResult {
				t.Helper()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: in, Meta: mcp.Meta{"idempotencyKey": key}})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			rows := func() int {
				t.Helper()
				var n int
				if err := db.Read.QueryRowContext(ctx, `SELECT count(*) FROM tickets`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}

			first := call("t1", ticketIn{Title: "printer on fire", Customer: "acme"})
			if first.IsError {
				t.Fatalf("create_ticket failed: %v", first.Content)
			}
			if got := rows(); got != 1 {
				t.Fatalf("tickets after the call = %d, want 1", got)
			}
			retry := call("t1", ticketIn{Title: "printer on fire", Customer: "acme"})
			replayed, _ := retry.StructuredContent.(map[string]any)
			if _, ok := replayed[outbox.ReplayNoteProperty]; !ok {
				t.Errorf("retry's structured content %v has no replay note", replayed)
			}
			delete(replayed, outbox.ReplayNoteProperty)
			if fmt.Sprint(replayed) != fmt.Sprint(first.StructuredContent) || runs != 1 || rows() != 1 {
				t.Fatalf("retry: %v (first %v), handler runs %d, tickets %d; want a replay", retry.StructuredContent, first.StructuredContent, runs, rows())
			}

			declined := call("t2", ticketIn{Title: "second", Customer: "acme", Decline: true})
			if !declined.IsError {
				t.Fatal("want the declined call's error")
			}
			if got := rows(); got != 1 {
				t.Fatalf("tickets after a declined call = %d, want 1", got)
			}
			var state string
			if err := db.Read.QueryRowContext(ctx, `SELECT state FROM calls WHERE key = $1`, "t2").Scan(&state); err != nil || state != "failed" {
				t.Fatalf("declined call: state %q, %v; want failed", state, err)
			}
		})
	}
}

func sqliteTarget(tb testing.TB) string { return filepath.Join(tb.TempDir(), "tickets.db") }

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
