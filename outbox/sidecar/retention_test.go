package sidecar

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestRetention: Options.Retention gives an upstream tool's calls their own
// key window and outcome retention, written into their rows where the
// purge reads them; other tools keep the layer's.
func TestRetention(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := schema.Open(ctx, filepath.Join(t.TempDir(), "proxy.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	layer, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := newUpstream()
	p, err := New(Options{Layer: layer, Upstream: u, Logger: testLogger(t),
		Retention: map[string]outbox.ToolRetention{"work": {Key: time.Hour, Outcome: 2 * time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	ct, pt := mcp.NewInMemoryTransports()
	pconn, err := pt.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, pconn) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, key string }{{"work", "w-1"}, {"gate", "g-1"}} {
		if c.tool == "gate" {
			close(u.release)
		}
		if res, err := call(t, cs, ctx, c.tool, c.key, 1); err != nil || res.IsError {
			t.Fatalf("%s: %v %v", c.tool, err, res)
		}
	}
	for key, want := range map[string]struct {
		window time.Duration
		retain sql.NullInt64
	}{
		"w-1": {time.Hour, sql.NullInt64{Int64: (2 * time.Hour).Milliseconds(), Valid: true}},
		"g-1": {outbox.DefaultKeyRetention, sql.NullInt64{}},
	} {
		var window int64
		var retain sql.NullInt64
		if err := db.Read.QueryRow(`SELECT expires_at - completed_at, retain_ms FROM calls WHERE key = $1`, key).Scan(&window, &retain); err != nil {
			t.Fatal(err)
		}
		if window != want.window.Milliseconds() || retain != want.retain {
			t.Errorf("call %s: key window %dms, retain_ms %v; want %dms, %v", key, window, retain, want.window.Milliseconds(), want.retain)
		}
	}
	cs.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func TestRetentionRefused(t *testing.T) {
	t.Parallel()
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "proxy.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	layer, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Options{Layer: layer, Upstream: newUpstream(),
		Retention: map[string]outbox.ToolRetention{"work": {Outcome: time.Hour}}})
	if err == nil || !strings.Contains(err.Error(), `tool "work"`) || !strings.Contains(err.Error(), "shorter than the key's time 24h0m0s") {
		t.Errorf("New with an outcome retention shorter than the key's: %v, want an error naming the tool and why", err)
	}
}
