package sidecar

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestRetention: Options.Retention gives an upstream tool's calls their own
// key window and outcome retention, written into their rows where the
// purge reads them; other tools keep the layer's.
func TestRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := newUpstream()
	p := newTestProxy(t, nil, Options{Upstream: u,
		Retention: map[string]outbox.ToolRetention{"work": {Key: time.Hour, Outcome: 2 * time.Hour}}})
	cs := p.connect(t)
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
		"g-1": {defaults.KeyRetention, sql.NullInt64{}},
	} {
		var window int64
		var retain sql.NullInt64
		if err := p.db.Read.QueryRow(`SELECT expires_at - completed_at, retain_ms FROM calls WHERE key = $1`, key).Scan(&window, &retain); err != nil {
			t.Fatal(err)
		}
		if window != want.window.Milliseconds() || retain != want.retain {
			t.Errorf("call %s: key window %dms, retain_ms %v; want %dms, %v", key, window, retain, want.window.Milliseconds(), want.retain)
		}
	}
}

func TestRetentionRefused(t *testing.T) {
	t.Parallel()
	_, layer := testLayer(t, nil)
	_, err := New(Options{Layer: layer, Upstream: newUpstream(),
		Retention: map[string]outbox.ToolRetention{"work": {Outcome: time.Hour}}})
	if err == nil || !strings.Contains(err.Error(), `tool "work"`) || !strings.Contains(err.Error(), "shorter than the key's time 24h0m0s") {
		t.Errorf("New with an outcome retention shorter than the key's: %v, want an error naming the tool and why", err)
	}
}
