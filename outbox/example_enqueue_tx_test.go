package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Outside any MCP call (an HTTP handler, a job), an effect is enqueued in
// the caller's own transaction: the order and its confirmation commit
// together, or neither does.
func ExampleLayer_EnqueueTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Write.ExecContext(ctx, db.Pick(
		`CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL)`,
		`CREATE TABLE orders (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL)`)); err != nil {
		log.Fatal(err)
	}
	layer, err := outbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}

	type request struct{ method, path, body, key string }
	sent := make(chan request, 1)
	mailer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sent <- request{r.Method, r.URL.Path, string(body), r.Header.Get("Idempotency-Key")}
	}))
	defer mailer.Close()
	base, err := url.Parse(mailer.URL)
	if err != nil {
		log.Fatal(err)
	}
	// The dispatcher, until Stop; from now on an EnqueueTx to any other
	// destination than mailer is an error.
	running, err := layer.Start(ctx, &outbox.StartOptions{Dispatcher: &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "mailer", URL: base}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer running.Stop(context.WithoutCancel(ctx))

	errOutOfStock := errors.New("out of stock")
	placeOrder := func(ctx context.Context, customer string, inStock bool) (key string, err error) {
		tx, err := db.Write.BeginTx(ctx, nil)
		if err != nil {
			return "", err
		}
		defer tx.Rollback() // after Commit, it does nothing
		var id int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO orders (customer) VALUES ($1) RETURNING id`, customer).Scan(&id); err != nil {
			return "", err
		}
		key, err = layer.EnqueueTx(ctx, tx, outbox.Effect{
			Destination: "mailer", Path: "/v1/confirm", Body: fmt.Appendf(nil, `{"order":%d}`, id),
		})
		if err != nil {
			return "", err
		}
		if !inStock {
			return "", errOutOfStock // rolled back: the order and its effect
		}
		return key, tx.Commit()
	}
	key, err := placeOrder(ctx, "acme", true)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := placeOrder(ctx, "globex", false); !errors.Is(err, errOutOfStock) {
		log.Fatal(err)
	}
	// On SQLite the dispatcher would find the effect at its next poll;
	// Notify wakes it now (PostgreSQL wakes it by itself).
	running.Notify()
	r := <-sent
	fmt.Println(r.method, r.path, r.body, "sent with its key:", r.key == `"`+key+`"`)
	var orders int
	if err := db.Read.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("orders: %d\n", orders)
	// Output:
	// POST /v1/confirm {"order":1} sent with its key: true
	// orders: 1
}
