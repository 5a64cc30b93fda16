package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/mcp-outbox/mcp-outbox/schema"
	// --db takes an SQLite file or a PostgreSQL URL, so this program links
	// both stores; a program of SQLite alone leaves this import out and
	// links no pgx.
	_ "github.com/mcp-outbox/mcp-outbox/schema/postgres"
)

// openExisting opens the database of an operator command. Opening would
// create a missing file, and a mistyped path would then look like an empty
// outbox instead of saying what is wrong.
//
// A PostgreSQL URL names a database that exists or fails to connect.
func openExisting(ctx context.Context, path string) (*schema.DB, error) {
	if schema.IsPostgresURL(path) {
		return schema.Open(ctx, path, nil)
	}
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("database %s does not exist; give the database serve or proxy uses with --db or MCP_OUTBOX_DB", path)
		}
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	return schema.Open(ctx, path, nil)
}
