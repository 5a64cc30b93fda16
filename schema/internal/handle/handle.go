// Package handle lets a store's package (schema/postgres, schema/sqlite)
// make a *schema.DB of a handle its user keeps, without package schema
// exporting the constructor: a user opens a database with schema.Open or
// with their store package's FromPool/FromDB, never with this.
//
// The types are plain (any, string) because schema imports this package:
// naming schema's types here would be an import cycle.
package handle

import (
	"context"
	"database/sql"
)

// Args describe a database whose connections the layer borrows.
type Args struct {
	// Dialect is "sqlite" or "postgres".
	Dialect string
	// Store is the schema.Store of the handle, nil on SQLite.
	Store any
	// Write and Read are the handles the DB uses (the same on
	// PostgreSQL).
	Write, Read *sql.DB
	// Path names the database in messages.
	Path string
	// Durability is "full" or "normal": what the handle's own settings
	// give, read from it.
	Durability string
	// Close is what DB.Close does: it releases what the store's package
	// made for the layer, never the user's handle. Nil means nothing.
	Close func() error
}

// Adopt is set by package schema: it makes a *schema.DB of a, pings it and
// applies the outbox migrations. On an error it calls a.Close.
var Adopt func(ctx context.Context, a Args) (any, error)
