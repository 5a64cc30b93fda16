package outboxtest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Noter is a layer serving a tool "note" that writes a row of handle_notes
// and enqueues an effect to the destination "sink", with the layer's
// dispatcher delivering to an HTTP server of the test's own.
type Noter struct {
	Layer   *outbox.Layer
	Session *mcp.ClientSession
	// Delivered receives the body of each request the sink gets.
	Delivered chan string
}

// StartNoter builds a Noter on db and starts its layer, dispatcher and
// reaper, stopped when the test ends. poll is the dispatcher's
// PollInterval (zero: its default).
func StartNoter(tb testing.TB, db *schema.DB, poll time.Duration) *Noter {
	tb.Helper()
	return startNoter(tb, db, poll, false)
}

// StartNoterNoDispatcher is StartNoter with no dispatcher: another
// process delivers.
func StartNoterNoDispatcher(tb testing.TB, db *schema.DB) *Noter {
	tb.Helper()
	return startNoter(tb, db, 0, true)
}

func startNoter(tb testing.TB, db *schema.DB, poll time.Duration, noDispatcher bool) *Noter {
	tb.Helper()
	ctx := context.Background()
	if _, err := db.Write.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS handle_notes (note TEXT NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	n := &Noter{Delivered: make(chan string, 16)}
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n.Delivered <- string(b)
	}))
	tb.Cleanup(sink.Close)
	u, err := url.Parse(sink.URL)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := outbox.New(db, nil)
	if err != nil {
		tb.Fatal(err)
	}
	n.Layer = l
	s := l.NewServer(&mcp.Implementation{Name: "noter", Version: "v0"}, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "note"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct {
		Note string `json:"note"`
	}) (*mcp.CallToolResult, struct{}, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO handle_notes (note) VALUES ($1)`, in.Note); err != nil {
			return nil, struct{}{}, err
		}
		_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "sink", Path: "/", Body: []byte(`"` + in.Note + `"`)})
		return nil, struct{}{}, err
	}, nil)
	so := &outbox.StartOptions{Dispatcher: &dispatch.Options{
		PollInterval: poll,
		Destinations: []dispatch.Destination{{Name: "sink", URL: u}},
	}}
	if noDispatcher {
		so = &outbox.StartOptions{NoDispatcher: true, KnownDestinations: []string{"sink"}}
	}
	r, err := l.Start(ctx, so)
	if err != nil {
		tb.Fatal(err)
	}
	n.Session = Connect(tb, s)
	// Registered after Connect's: runs before it, as a server stops
	// serving before its layer stops.
	tb.Cleanup(func() {
		if err := r.Stop(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return n
}

// EndToEnd runs a call of the Noter's tool and its retry on db, and fails
// tb unless the tool ran once, the retry was replayed, and its effect was
// delivered once.
func EndToEnd(tb testing.TB, db *schema.DB) {
	tb.Helper()
	n := StartNoter(tb, db, 0)
	for i := range 2 {
		res := Call(tb, n.Session, "note", "end-to-end", map[string]any{"note": "hello"})
		if res.IsError {
			tb.Fatalf("call %d: %s", i, Text(res))
		}
		if replayed, _ := CallMeta(res)["replayed"].(bool); replayed != (i == 1) {
			tb.Fatalf("call %d: replayed = %v", i, replayed)
		}
	}
	if got := Count(tb, db.Read, `SELECT count(*) FROM handle_notes`); got != 1 {
		tb.Fatalf("notes = %d, want 1", got)
	}
	select {
	case b := <-n.Delivered:
		if b != `"hello"` {
			tb.Fatalf("delivered %s", b)
		}
	case <-time.After(30 * time.Second):
		tb.Fatal("the effect was not delivered within 30s")
	}
}
