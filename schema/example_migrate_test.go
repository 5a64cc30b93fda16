package schema_test

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The application's own migrations, one directory per store: numbered
// NNN_name.up.sql files, applied in order, each once.
//
//go:embed testdata/billing/sqlite/*.up.sql testdata/billing/postgres/*.up.sql
var billingMigrations embed.FS

// migrateBilling creates or upgrades the application's own tables in db, in
// db's dialect, as migration set "billing": schema.Open has applied the
// outbox's set already, and the two sets keep their versions apart.
func migrateBilling(ctx context.Context, db *schema.DB) error {
	sqlite, err := fs.Sub(billingMigrations, "testdata/billing/sqlite")
	if err != nil {
		return err
	}
	postgres, err := fs.Sub(billingMigrations, "testdata/billing/postgres")
	if err != nil {
		return err
	}
	m, err := db.MigrationsFor(sqlite, postgres)
	if err != nil {
		return err
	}
	return db.Migrate(ctx, "billing", m)
}

// An application migrates its own tables beside the outbox's, on every
// start: what is applied already is skipped, and a database newer than the
// binary is refused.
func ExampleDB_Migrate() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	// A postgres:// URL works the same (TestMigrateBillingOnPostgres).
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	for range 2 { // the second start finds nothing to do
		if err := migrateBilling(ctx, db); err != nil {
			log.Fatal(err)
		}
	}
	v, err := db.Version(ctx, "billing")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("billing at version", v)
	// Output: billing at version 2
}

func TestMigrateBillingOnPostgres(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	db, err := schema.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for range 2 {
		if err := migrateBilling(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := db.Version(ctx, "billing"); err != nil || v != 2 {
		t.Fatalf("billing version = %d, %v; want 2", v, err)
	}
	if _, err := db.Write.ExecContext(ctx, `INSERT INTO invoices (customer, cents) VALUES ($1, $2)`, "acme", 100); err != nil {
		t.Fatalf("insert into the migrated table: %v", err)
	}
	var currency string
	if err := db.Read.QueryRowContext(ctx, `SELECT currency FROM invoices`).Scan(&currency); err != nil || currency != "EUR" {
		t.Fatalf("currency = %q, %v; want EUR from migration 2", currency, err)
	}
}
