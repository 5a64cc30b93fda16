package pgtest_test

import (
	"database/sql"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestDatabaseIsEmptyAndOwn(t *testing.T) {
	a, b := pgtest.Database(t), pgtest.Database(t)
	if a == b {
		t.Fatalf("two tests got the same database %s", a)
	}
	db, err := sql.Open("pgx", a)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("new database has %d tables", n)
	}
}

// A killed server comes back on the same port with what was committed.
func TestKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	srv, err := pgtest.Start()
	if err != nil {
		t.Skip(err)
	}
	defer srv.Stop()
	db, err := sql.Open("pgx", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	port := srv.Port
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err == nil {
		t.Fatal("ping succeeded with the server killed")
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if srv.Port != port {
		t.Fatalf("restarted on port %d, was %d", srv.Port, port)
	}
	var v int
	if err := db.QueryRow(`SELECT v FROM kept`).Scan(&v); err != nil || v != 7 {
		t.Fatalf("after restart: v=%d err=%v", v, err)
	}
}
