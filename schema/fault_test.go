package schema_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A database at its size limit takes the readiness write (an update in
// place) but no insert: it is not ready until it has room again.
func TestCheckReady_Full(t *testing.T) {
	t.Parallel()
	db := open(t, filepath.Join(t.TempDir(), "full.db"), nil)
	ctx := context.Background()
	if _, err := db.Write.Exec(`CREATE TABLE fill (x)`); err != nil {
		t.Fatal(err)
	}
	var pages int
	if err := db.Write.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write.Exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
		t.Fatal(err)
	}
	// Inserts fail, as every call's claim would.
	if _, err := db.Write.Exec(`INSERT INTO fill VALUES (zeroblob(100000))`); err == nil ||
		!strings.Contains(err.Error(), "full") {
		t.Fatalf("insert at the limit: %v, want SQLITE_FULL", err)
	}
	if err := db.CheckReady(ctx); err == nil || !strings.Contains(err.Error(), "database is full") {
		t.Errorf("full database: err = %v, want not ready, saying it is full", err)
	}
	if _, err := db.Write.Exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, pages+100)); err != nil {
		t.Fatal(err)
	}
	if err := db.CheckReady(ctx); err != nil {
		t.Errorf("room again: %v", err)
	}
}

// A file that is not a database, or a database cut short, is refused at
// once with an error naming the file, and is left as it was.
func TestOpen_Damaged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	db := open(t, good, nil)
	if _, err := db.Write.Exec(`CREATE TABLE big (x); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
INSERT INTO big SELECT randomblob(1000) FROM n`); err != nil {
		t.Fatal(err)
	}
	db.Close() // checkpoints: the file holds everything, and no -wal is left
	whole, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{
		"garbage":       bytes.Repeat([]byte("not a database "), 500),
		"truncated":     whole[:len(whole)/2],
		"header only":   whole[:100],
		"last page cut": whole[:len(whole)-4096],
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".db")
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		// A busy timeout far longer than the test: the open must not
		// wait for a lock that is not the problem.
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		db, err := schema.Open(ctx, path, &schema.Options{BusyTimeout: time.Hour})
		cancel()
		if err == nil {
			db.Close()
			t.Errorf("%s: opened", name)
			continue
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%s: refused after %s", name, took)
		}
		if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not an SQLite database or is damaged") {
			t.Errorf("%s: %v; want the file named and the problem said", name, err)
		}
		after, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(after, content) {
			t.Errorf("%s: the file changed (%v)", name, err)
		}
	}
}
