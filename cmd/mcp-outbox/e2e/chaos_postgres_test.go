package e2e

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestChaosSoakPostgres is TestChaosSoak on PostgreSQL: the same workload,
// faults and checks, with every serve process and the final drain on one
// database of a cluster of the test's own, which the monkey also kills
// (pg_ctl stop -m immediate, as a crash) and starts again. While it is
// down the calls fail with not_recorded, which says nothing was executed,
// and the clients retry them until they get their real result; the serve
// processes come back by themselves (/readyz 503, then 200).
//
// CHAOS_CALLS defaults to 300 here; `make chaos` runs it at full size.
func TestChaosSoakPostgres(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster and kills it")
	}
	n := chaosEnvInt(t, "CHAOS_CALLS", 300)
	// A cluster of its own, not the shared one: the monkey kills it.
	srv, err := pgtest.Start()
	if err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Logf("stop PostgreSQL: %v", err)
		}
	})
	runChaosSoak(t, n, chaosStore{db: chaosCreateDB(t, srv.URL), pg: srv})
}

// chaosCreateDB creates the database "chaos" on the server at url and
// returns its URL.
func chaosCreateDB(t *testing.T, url string) string {
	t.Helper()
	admin, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE chaos`); err != nil {
		t.Fatalf("create database: %v", err)
	}
	return pgtest.WithDatabase(url, "chaos")
}
