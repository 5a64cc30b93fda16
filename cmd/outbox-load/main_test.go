package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestMain lets the test binary stand in for outbox-load when measure
// re-runs its own executable as the baseline server.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == serveBareCommand {
		os.Exit(serveBare(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// The load tool runs end to end at a tiny size and prints a row per side
// with calls and no errors. The figures mean nothing at this size.
func TestRunQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mcp-outbox and starts PostgreSQL")
	}
	if err := pgtest.Available(); err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if err := os.Chdir("../.."); err != nil { // go build ./cmd/mcp-outbox runs from the module root
		t.Fatal(err)
	}
	var out, log bytes.Buffer
	code := run(context.Background(), []string{"--clients", "4", "--duration", "300ms", "--warmup", "100ms", "--rounds", "1", "--replicas", "2"}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log.String())
	}
	for _, side := range []string{"bare go-sdk server", "layer, 1 replica", "layer, 2 replicas"} {
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, side) {
				line = l
			}
		}
		f := strings.Fields(strings.TrimPrefix(line, side))
		if line == "" || len(f) < 2 || f[len(f)-1] != "0" {
			t.Errorf("side %q: row %q (want calls and 0 errors)\n%s", side, line, out.String())
		}
	}
}
