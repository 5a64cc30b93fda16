package outbox_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A dispatcher delivers committed effects. In a server, run it for the
// server's lifetime with go d.Run(ctx) and connect it to the layer with
// layer.OnEnqueue(d.Notify); here Drain delivers what is queued and returns.
func ExampleNewDispatcher() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// An effect as a tool's handler would have enqueued it with tx.Enqueue.
	if _, err := db.Write.Exec(`INSERT INTO effects (seq, destination, method, path, body, idempotency_key, next_attempt_at, created_at, updated_at)
		VALUES (1, 'mailer', 'POST', '/v1/send', '{"invoice":1}', 'call_example-1', 0, unixepoch() * 1000, 0)`); err != nil {
		log.Fatal(err)
	}

	mailer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(r.Method, r.URL.Path, "Idempotency-Key:", r.Header.Get("Idempotency-Key"), "Authorization:", r.Header.Get("Authorization"))
	}))
	defer mailer.Close()
	base, _ := url.Parse(mailer.URL)

	d, err := outbox.NewDispatcher(db, &outbox.DispatcherOptions{Destinations: []outbox.Destination{{
		Name: "mailer", URL: base,
		AuthHeader: "Authorization", AuthValue: "Bearer " + strings.Repeat("x", 4), // from the environment
	}}})
	if err != nil {
		log.Fatal(err)
	}
	counts, err := d.Drain(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("delivered %d, pending %d\n", counts.Delivered, counts.Pending)
	// Output:
	// POST /v1/send Idempotency-Key: "call_example-1" Authorization: Bearer xxxx
	// delivered 1, pending 0
}
