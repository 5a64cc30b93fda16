package admin_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// An operator's purge at once, counted first: a dry run deletes nothing.
func ExamplePurge() {
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

	c, err := admin.Purge(ctx, db, &admin.PurgeOptions{
		Retention: outbox.Retention{Delivered: 24 * time.Hour},
		DryRun:    true,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("would purge %d calls and %d effects\n", c.Calls, c.DeliveredEffects+c.CancelledEffects)
	// Output: would purge 0 calls and 0 effects
}

// A call's outcome is settled by naming the call and saying what the
// operator found; a call that is not waiting for a decision is refused.
func ExampleResolveCall() {
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

	err = admin.ResolveCall(ctx, db,
		admin.CallRef{Principal: "user:alice", Key: "order-1234"},
		admin.Resolution{Outcome: admin.CallCompleted, Note: "charge ch_42 found at the processor"})
	fmt.Println(errors.Is(err, admin.ErrNoCall), err)
	// Output: true call "order-1234" of user:alice: no such call
}
