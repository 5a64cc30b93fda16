package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // the "sqlite" driver

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema/sqlite"
)

// The layer on the program's own SQLite handle: the file's one writer,
// shared by the program's tables and the layer's, with the settings the
// layer checks in its DSN.
func ExampleFromDB() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	sqlDB, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()      // the program's: after the layer's DB
	sqlDB.SetMaxOpenConns(1) // one writer

	db, err := sqlite.FromDB(ctx, sqlDB) // checks the settings, applies the outbox migrations
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // closes the layer's read pool, not sqlDB
	if _, err := outbox.New(db, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println(db.Dialect, db.Durability)

	// Output:
	// sqlite full
}
