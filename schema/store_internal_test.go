package schema

import (
	"context"
	"strings"
	"testing"
)

// A postgres:// URL in a program that did not link the PostgreSQL store
// fails at Open, naming the import that links it. The test binary links
// it (pgtest does), so the registry is emptied for the test; it runs
// before the parallel tests resume, which never see it empty.
func TestOpen_PostgresNotLinked(t *testing.T) {
	storesMu.Lock()
	saved := stores
	stores = map[Dialect]Store{}
	storesMu.Unlock()
	t.Cleanup(func() {
		storesMu.Lock()
		stores = saved
		storesMu.Unlock()
	})
	db, err := Open(context.Background(), "postgres://app:secret@127.0.0.1:1/app", nil)
	if err == nil {
		db.Close()
		t.Fatal("opened a PostgreSQL URL without the store")
	}
	for _, want := range []string{`import _ "github.com/mcp-outbox/mcp-outbox/schema/postgres"`, "postgres://app:xxxxx@127.0.0.1:1/app"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error %q shows the password", err)
	}
}

// An SQLite DB has no store: nothing is unavailable by PostgreSQL's
// reading, and there is nothing to listen to.
func TestDB_SQLiteHasNoStore(t *testing.T) {
	db, err := Open(context.Background(), t.TempDir()+"/s.db", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Listen(context.Background(), "mcp_outbox_effects"); err == nil || !strings.Contains(err.Error(), ErrNoListen.Error()) {
		t.Errorf("listen on SQLite: %v, want %v", err, ErrNoListen)
	}
	if db.Unavailable(context.DeadlineExceeded) || db.CommitRolledBack(context.Canceled) {
		t.Error("SQLite classified an error by PostgreSQL's rules")
	}
}
