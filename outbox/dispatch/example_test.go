package dispatch_test

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
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A dispatcher delivers committed effects. In a server, outbox.Layer.Start
// runs one for the server's lifetime; a process that only delivers, as
// mcp-outbox drain does, calls Drain, which delivers what is due and
// returns.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	layer, err := outbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	// An effect, as a tool's handler enqueues it with tx.Enqueue, or other
	// code in its own transaction with EnqueueTx.
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	key, err := layer.EnqueueTx(ctx, tx, outbox.Effect{Destination: "mailer", Path: "/v1/send", Body: []byte(`{"invoice":1}`)})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	mailer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(r.Method, r.URL.Path, "Idempotency-Key is the effect's:", r.Header.Get("Idempotency-Key") == `"`+key+`"`, "Authorization:", r.Header.Get("Authorization"))
	}))
	defer mailer.Close()
	base, _ := url.Parse(mailer.URL)

	d, err := dispatch.New(db, &dispatch.Options{Destinations: []dispatch.Destination{{
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
	// POST /v1/send Idempotency-Key is the effect's: true Authorization: Bearer xxxx
	// delivered 1, pending 0
}
