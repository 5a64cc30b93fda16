package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

type OrderIn struct {
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

type OrderOut struct {
	OrderID int64 `json:"order_id"`
}

// The orders table on each store; everything else below is the same SQL on
// both: $N placeholders, and RETURNING for the id the database assigns
// (LastInsertId does not exist on PostgreSQL).
const (
	createOrdersSQLite   = `CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, cents BIGINT NOT NULL)`
	createOrdersPostgres = `CREATE TABLE orders (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL, cents BIGINT NOT NULL)`
)

// A server's whole life: open the database, build the layer and its tool,
// Start the dispatcher and the reaper, serve, then shut down in order.
// The tool's effect reaches the mail API with its Idempotency-Key, with no
// wiring but Start.
func ExampleLayer_Start() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// A PostgreSQL URL works the same: postgres://user@host/db.
	if err := placeOrders(context.Background(), filepath.Join(dir, "app.db"), os.Stdout); err != nil {
		log.Fatal(err)
	}
	// Output:
	// result map[order_id:1], replayed: false
	// result map[order_id:1], replayed: true
	// mail API got POST /v1/send {"order":1}, with the effect's Idempotency-Key: true
	// effect delivered, orders: 1
}

func placeOrders(ctx context.Context, target string, w io.Writer) (err error) {
	db, err := schema.Open(ctx, target, nil)
	if err != nil {
		return err
	}
	defer db.Close() // deferred first, so it runs last
	if _, err := db.Write.ExecContext(ctx, db.Pick(createOrdersSQLite, createOrdersPostgres)); err != nil {
		return fmt.Errorf("create orders: %w", err)
	}

	// The mail API: in production a URL from configuration.
	type mail struct{ method, path, key, body string }
	mails := make(chan mail, 1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mails <- mail{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), string(body)}
	}))
	defer api.Close()
	apiURL, err := url.Parse(api.URL)
	if err != nil {
		return err
	}

	layer, err := outbox.New(db, nil)
	if err != nil {
		return err
	}
	server := layer.NewServer(&mcp.Implementation{Name: "shop", Version: "v1"}, nil)
	keys := make(chan string, 1) // the Idempotency-Key Enqueue returned, to compare
	outbox.AddTool(layer, server, &mcp.Tool{Name: "place_order", Description: "Place an order and mail a confirmation."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in OrderIn) (*mcp.CallToolResult, OrderOut, error) {
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO orders (customer, cents) VALUES ($1, $2) RETURNING id`, in.Customer, in.Cents).Scan(&id)
			if err != nil {
				return nil, OrderOut{}, err
			}
			body, err := json.Marshal(map[string]int64{"order": id})
			if err != nil {
				return nil, OrderOut{}, err
			}
			// Sent after the commit; an unknown destination is an error here.
			key, err := tx.Enqueue(ctx, outbox.Effect{Destination: "mailer", Path: "/v1/send", Body: body})
			if err != nil {
				return nil, OrderOut{}, err
			}
			keys <- key
			return nil, OrderOut{OrderID: id}, nil
		}, nil)

	// The dispatcher, woken by every commit that enqueues, and the reaper,
	// which purges at once and every 10 minutes what the default
	// Retention no longer keeps.
	running, err := layer.Start(ctx, &outbox.StartOptions{Dispatcher: &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "mailer", URL: apiURL}},
	}})
	if err != nil {
		return err
	}
	// Stopped after serving ends and before the database closes; on the
	// way out of an error too (a second Stop returns at once).
	defer func() { err = errors.Join(err, running.Stop(ctx)) }()

	// Serving: here one in-memory client; stdio and HTTP servers serve the
	// same *mcp.Server.
	st, ct := mcp.NewInMemoryTransports()
	session, err := server.Connect(ctx, mcpstdio.NewTransport(st, nil), nil)
	if err != nil {
		return err
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		return err
	}
	for range 2 { // the second call is a retry, for example after a timeout
		res, err := client.CallTool(ctx, &mcp.CallToolParams{
			Name:      "place_order",
			Arguments: OrderIn{Customer: "acme", Cents: 4200},
			Meta:      mcp.Meta{"idempotencyKey": "order-acme-1"},
		})
		if err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("place_order: %v", res.Content)
		}
		call, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
		out, _ := res.StructuredContent.(map[string]any)
		delete(out, outbox.ReplayNoteProperty) // the replay's note, as in its last content block
		fmt.Fprintf(w, "result %v, replayed: %v\n", out, call["replayed"])
	}
	select {
	case m := <-mails:
		// The key travels as a Structured Field string, in quotes.
		fmt.Fprintf(w, "mail API got %s %s %s, with the effect's Idempotency-Key: %v\n",
			m.method, m.path, m.body, m.key == strconv.Quote(<-keys))
	case <-time.After(30 * time.Second):
		return errors.New("no mail within 30s")
	}

	// Shutting down: stop serving (an HTTP server's graceful shutdown
	// lets the calls in flight finish), then stop the dispatcher, which
	// lets its deliveries finish, and the reaper.
	if err := client.Close(); err != nil {
		return err
	}
	if err := session.Wait(); err != nil {
		return err
	}
	if err := running.Stop(ctx); err != nil {
		return err
	}
	var state string
	var orders int
	if err := db.Read.QueryRowContext(ctx, `SELECT state FROM effects`).Scan(&state); err != nil {
		return err
	}
	if err := db.Read.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		return err
	}
	fmt.Fprintf(w, "effect %s, orders: %d\n", state, orders)
	return nil
}
