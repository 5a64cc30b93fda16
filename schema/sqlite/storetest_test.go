package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/storetest"
	"github.com/mcp-outbox/mcp-outbox/schema"
	"github.com/mcp-outbox/mcp-outbox/schema/sqlite"
)

// TestContract: the layer's contract holds on an SQLite file opened by
// schema.Open and on one the program opened itself (sqlite.FromDB). A
// replica is another handle on the same file, as another process is.
func TestContract(t *testing.T) {
	t.Parallel()
	t.Run("Open", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, storetest.Store{Open: func(t *testing.T) (*schema.DB, func(*testing.T) *schema.DB) {
			path := filepath.Join(t.TempDir(), "contract.db")
			open := func(t *testing.T) *schema.DB {
				db, err := schema.Open(context.Background(), path, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				return db
			}
			return open(t), open
		}})
	})
	t.Run("FromDB", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, storetest.Store{Open: func(t *testing.T) (*schema.DB, func(*testing.T) *schema.DB) {
			path := filepath.Join(t.TempDir(), "contract.db")
			open := func(t *testing.T) *schema.DB {
				h, err := sql.Open("sqlite", "file:"+path+
					"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_pragma=busy_timeout(5000)&_txlock=immediate")
				if err != nil {
					t.Fatal(err)
				}
				h.SetMaxOpenConns(1)
				db, err := sqlite.FromDB(context.Background(), h)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close(); h.Close() })
				return db
			}
			return open(t), open
		}})
	})
}
