package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
	"github.com/mcp-outbox/mcp-outbox/schema/sqlite"
)

// good is the DSN query the package doc tells a user to write.
const good = "_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_pragma=busy_timeout(5000)&_txlock=immediate"

// userDB opens path as a user would, with query as its DSN's settings and
// conns as MaxOpenConns, closed when the test ends (after any DB on it).
func userDB(t *testing.T, path, query string, conns int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?"+query)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { db.Close() })
	return db
}

// A layer on the user's own *sql.DB runs a call, replays its retry and
// delivers its effect; Close leaves the handle open.
func TestFromDB_EndToEnd(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	user := userDB(t, path, good, 1)
	db, err := sqlite.FromDB(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	if db.Dialect != schema.SQLite || db.Durability != schema.DurabilityFull || db.Path != path {
		t.Errorf("DB = %s %s %s, want sqlite full %s", db.Dialect, db.Durability, db.Path, path)
	}
	if db.Write != user || db.Read == user {
		t.Error("Write is not the user's handle, or Read is")
	}
	t.Run("Call", func(t *testing.T) { outboxtest.EndToEnd(t, db) })
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// The user's handle is open, and sees what the layer wrote.
	var n int
	if err := user.QueryRowContext(ctx, `SELECT count(*) FROM handle_notes`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("after DB.Close the user's handle: %d notes, %v", n, err)
	}
}

// Durability comes from the handle: synchronous=NORMAL is DurabilityNormal.
func TestFromDB_NormalDurability(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	user := userDB(t, path, strings.Replace(good, "synchronous(FULL)", "synchronous(NORMAL)", 1), 1)
	db, err := sqlite.FromDB(context.Background(), user)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.Durability != schema.DurabilityNormal {
		t.Errorf("Durability = %s, want normal", db.Durability)
	}
}

// Each setting the layer needs, missing, is refused with an error that
// names it and how to set it; nothing is written to the file.
func TestFromDB_Refuses(t *testing.T) {
	for _, c := range []struct {
		name, query string
		conns       int
		memory      bool
		want        string
	}{
		{"NoWAL", strings.Replace(good, "_pragma=journal_mode(WAL)&", "", 1), 1, false, "_pragma=journal_mode(WAL)"},
		{"SynchronousOff", strings.Replace(good, "synchronous(FULL)", "synchronous(OFF)", 1), 1, false, "synchronous is OFF"},
		{"SynchronousExtra", strings.Replace(good, "synchronous(FULL)", "synchronous(EXTRA)", 1), 1, false, "synchronous is EXTRA"},
		{"ForeignKeysOff", strings.Replace(good, "foreign_keys(1)", "foreign_keys(0)", 1), 1, false, "_pragma=foreign_keys(1)"},
		{"NoBusyTimeout", strings.Replace(good, "&_pragma=busy_timeout(5000)", "", 1), 1, false, "_pragma=busy_timeout(5000)"},
		{"Deferred", strings.Replace(good, "&_txlock=immediate", "", 1), 1, false, "_txlock=immediate"},
		{"TwoWriters", good, 2, false, "SetMaxOpenConns(1)"},
		{"NoLimit", good, 0, false, "allows any number of connections"},
		{"Memory", good, 1, true, "in memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.db")
			if c.memory {
				path = ":memory:"
			}
			_, err := sqlite.FromDB(context.Background(), userDB(t, path, c.query, c.conns))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("FromDB: %v, want an error containing %q", err, c.want)
			}
			if !c.memory {
				var n int
				user := userDB(t, path, good, 1)
				if err := user.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'calls'`).Scan(&n); err != nil || n != 0 {
					t.Errorf("the refused handle was migrated: %d, %v", n, err)
				}
			}
		})
	}
}

// A PostgreSQL handle, or any that is not SQLite, is refused by name.
func TestFromDB_NotSQLite(t *testing.T) {
	_, err := sqlite.FromDB(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "nil") {
		t.Fatalf("FromDB(nil): %v", err)
	}
}

// A handle opened with no settings at all hears, in one error, everything
// it lacks and a DSN that has it, rather than one setting per attempt.
func TestFromDB_SaysAllAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	bare, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	bare.SetMaxOpenConns(2)
	_, err = sqlite.FromDB(context.Background(), bare)
	if err == nil {
		t.Fatal("FromDB accepted a bare handle")
	}
	for _, want := range []string{"SetMaxOpenConns(1)", "_pragma=journal_mode(WAL) to", "_pragma=foreign_keys(1) to",
		"_pragma=busy_timeout(5000) to", "_txlock=immediate to", "a DSN with every setting the layer needs: file:" + path + "?" + good} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	// What it says works.
	db, err := sqlite.FromDB(context.Background(), userDB(t, path, good, 1))
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
}
