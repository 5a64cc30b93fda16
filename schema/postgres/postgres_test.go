package postgres_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A program that uses only SQLite links no PostgreSQL client: the core
// packages and the example server do not depend on pgx, and only this
// package brings it. Measured by the go command's own import graph, so a
// new import of pgx anywhere in the core fails here.
func TestLinks_SQLiteProgramHasNoPgx(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	deps := func(pkg string) []string {
		t.Helper()
		out, err := exec.Command(gobin, "list", "-deps", "-test=false", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		return strings.Fields(string(out))
	}
	const mod = "github.com/mcp-outbox/mcp-outbox/"
	for _, pkg := range []string{"schema", "schema/sqlite", "query", "outbox", "outbox/operator", "examples/serve"} {
		for _, d := range deps(mod + pkg) {
			if strings.HasPrefix(d, "github.com/jackc/") || d == mod+"schema/postgres" {
				t.Errorf("%s links %s: a program of SQLite alone would link pgx", pkg, d)
			}
		}
	}
	// The check can see pgx where it is.
	var found bool
	for _, d := range deps(mod + "schema/postgres") {
		found = found || d == "github.com/jackc/pgx/v5"
	}
	if !found {
		t.Error("go list -deps schema/postgres does not list github.com/jackc/pgx/v5")
	}
}
