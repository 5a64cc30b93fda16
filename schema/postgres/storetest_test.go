package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/internal/storetest"
	"github.com/mcp-outbox/mcp-outbox/schema"
	"github.com/mcp-outbox/mcp-outbox/schema/postgres"
)

// TestContract: the layer's contract holds on PostgreSQL opened by
// schema.Open from a URL, and on the program's own pgx pool and pgx
// *sql.DB. A replica is another pool on the same database.
func TestContract(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T, u string) *schema.DB{
		"Open": func(t *testing.T, u string) *schema.DB {
			db, err := schema.Open(context.Background(), u, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		},
		"FromPool": func(t *testing.T, u string) *schema.DB {
			pool, err := pgxpool.New(context.Background(), u)
			if err != nil {
				t.Fatal(err)
			}
			db, err := postgres.FromPool(context.Background(), pool)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close(); pool.Close() })
			return db
		},
		"FromDB": func(t *testing.T, u string) *schema.DB {
			h, err := sql.Open("pgx", u)
			if err != nil {
				t.Fatal(err)
			}
			db, err := postgres.FromDB(context.Background(), h)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close(); h.Close() })
			return db
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, storetest.Store{Open: func(t *testing.T) (*schema.DB, func(*testing.T) *schema.DB) {
				u := pgtest.Database(t)
				return open(t, u), func(t *testing.T) *schema.DB { return open(t, u) }
			}})
		})
	}
}
