package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// runCounter counts the runs of each tool's handler.
type runCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *runCounter) add(tool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[tool]++
}

func (c *runCounter) runs(tool string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[tool]
}

// addCounted registers a recorded tool that counts its runs, with opts.
func addCounted(l *outbox.Layer, s *mcp.Server, c *runCounter, name string, opts *outbox.ToolOptions) {
	outbox.AddTool(l, s, &mcp.Tool{Name: name, Description: "counts its runs"},
		func(_ context.Context, _ outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
			c.add(name)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran " + name}}}, struct{}{}, nil
		}, opts)
}

func TestToolRetention(t *testing.T) {
	t.Parallel()
	start := time.UnixMilli(time.Now().UnixMilli()) // the table's precision
	clk := &clock{t: start}
	db := openDB(t)
	l, err := outbox.New(db, &outbox.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	c := &runCounter{n: map[string]int{}}
	// short: Stripe-like, both times an hour; keyonly: its key an hour, its
	// row the purge's default; long: the layer's defaults.
	addCounted(l, s, c, "short", &outbox.ToolOptions{Retention: outbox.ToolRetention{Key: time.Hour, Outcome: 2 * time.Hour}})
	addCounted(l, s, c, "keyonly", &outbox.ToolOptions{Retention: outbox.ToolRetention{Key: time.Hour}})
	addCounted(l, s, c, "long", nil)
	cs := connect(t, s)
	call := func(tool, key string) *mcp.CallToolResult {
		t.Helper()
		res := outboxtest.Call(t, cs, tool, key, map[string]any{})
		if res.IsError {
			t.Fatalf("%s %s: %s", tool, key, text(res))
		}
		return res
	}
	for _, k := range []struct{ tool, key string }{
		{"short", "s-1"}, {"short", "s-retry"}, {"keyonly", "k-1"}, {"long", "l-1"},
	} {
		call(k.tool, k.key)
	}
	purge := func(r outbox.Retention) admin.PurgeCounts {
		t.Helper()
		n, err := admin.Purge(context.Background(), db, &admin.PurgeOptions{Retention: r, Now: clk.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	keys := `SELECT key FROM calls ORDER BY key`

	t.Run("StatusSaysWhenTheKeyExpires", func(t *testing.T) {
		for key, want := range map[string]time.Time{
			"s-1": start.Add(time.Hour), "k-1": start.Add(time.Hour), "l-1": start.Add(defaults.KeyRetention),
		} {
			st := status(t, cs, map[string]any{"key": key})
			if st.ExpiresAt == nil || !st.ExpiresAt.Equal(want) {
				t.Errorf("call_status %s: expiresAt %v, want %v", key, st.ExpiresAt, want)
			}
		}
	})

	// Just before the hour, a retry replays.
	clk.Add(59 * time.Minute)
	if res := call("short", "s-retry"); callMeta(res)["replayed"] != true {
		t.Errorf("retry of short within its key's hour: not replayed (%v)", callMeta(res))
	}
	if got := c.runs("short"); got != 2 {
		t.Errorf("short ran %d times, want 2 (two keys, the retry replayed)", got)
	}

	// Past the hour the key is forgotten: the status says so, and a retry
	// runs the call again, as documented.
	clk.Add(2 * time.Minute)
	if st := status(t, cs, map[string]any{"key": "s-1"}); st.State != query.NotFound {
		t.Errorf("call_status s-1 after its key's hour: %s, want not_found", st.State)
	}
	if res := call("short", "s-retry"); callMeta(res)["replayed"] == true {
		t.Errorf("retry of short after its key's hour: replayed, want a new run")
	}
	if got := c.runs("short"); got != 3 {
		t.Errorf("short ran %d times, want 3 (the retry after expiry ran again)", got)
	}
	if st := status(t, cs, map[string]any{"key": "l-1"}); st.State != query.Completed {
		t.Errorf("call_status l-1 (the layer's 24h): %s, want completed", st.State)
	}

	// The rows outlive their keys: short's for its Outcome, keyonly's for
	// the purge's Calls.
	if n := purge(outbox.Retention{}); n.Calls != 0 {
		t.Errorf("purge at 61m deleted %d calls, want none", n.Calls)
	}
	clk.Add(time.Hour) // 2h01m: short's s-1 is past both times
	if n := purge(outbox.Retention{Calls: 72 * time.Hour}); n.Calls != 1 {
		t.Errorf("purge at 2h01m with Calls 72h deleted %d calls, want 1 (short's own Outcome wins)", n.Calls)
	}
	if got, want := keysOf(t, db, keys), "[k-1 l-1 s-retry]"; got != want {
		t.Errorf("calls after the purge at 2h01m: %s, want %s", got, want)
	}

	clk.Add(defaults.CallRetention) // a day later
	purge(outbox.Retention{})
	if got, want := keysOf(t, db, keys), "[]"; got != want {
		t.Errorf("calls after the purge a day later: %s, want %s", got, want)
	}
}

func TestToolRetention_Refused(t *testing.T) {
	t.Parallel()
	l, err := outbox.New(openDB(t), &outbox.Options{KeyRetention: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		r    outbox.ToolRetention
		want string
	}{
		{"NegativeKey", outbox.ToolRetention{Key: -time.Second}, "negative Retention.Key -1s"},
		{"NegativeOutcome", outbox.ToolRetention{Outcome: -time.Second}, "negative Retention.Outcome -1s"},
		{"OutcomeShorterThanKey", outbox.ToolRetention{Key: 2 * time.Hour, Outcome: time.Hour},
			"Retention.Outcome of 1h0m0s is shorter than the key's time 2h0m0s (Retention.Key)"},
		{"OutcomeShorterThanLayersKey", outbox.ToolRetention{Outcome: time.Hour},
			"Retention.Outcome of 1h0m0s is shorter than the key's time 2h0m0s (Options.KeyRetention)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
			defer func() {
				p, _ := recover().(string)
				if !strings.Contains(p, `outbox.AddTool "x"`) || !strings.Contains(p, tc.want) {
					t.Errorf("AddTool panicked with %q, want one naming the tool and %q", p, tc.want)
				}
			}()
			addCounted(l, s, &runCounter{n: map[string]int{}}, "x", &outbox.ToolOptions{Retention: tc.r})
		})
	}
	// What makes sense is taken.
	s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	addCounted(l, s, &runCounter{n: map[string]int{}}, "shorter", &outbox.ToolOptions{Retention: outbox.ToolRetention{Key: time.Hour, Outcome: time.Hour}})
	addCounted(l, s, &runCounter{n: map[string]int{}}, "longer", &outbox.ToolOptions{Retention: outbox.ToolRetention{Outcome: 30 * 24 * time.Hour}})
}

// TestToolRetention_TaskTTL: a task's ttlMs, when its tool sets no TTL, is
// the tool's own key window, so the task lives as long as the key that
// finds it again.
func TestToolRetention_TaskTTL(t *testing.T) {
	t.Parallel()
	b := setupOn(t, mustLedger(t, openDB(t)), nil, &ledger.Options{
		Tasks:     map[string]outbox.TaskOptions{"charge": {Mode: outbox.TasksAlways}},
		Retention: map[string]outbox.ToolRetention{"charge": {Key: 90 * time.Minute}},
	})
	p := stdioPeer(t, b.server)
	created := result(t, p.charge(true, "task-ttl", 700))
	if got, want := created["ttlMs"], float64((90 * time.Minute).Milliseconds()); got != want {
		t.Errorf("ttlMs %v, want the tool's key window %v", got, want)
	}
	if id, _ := created["taskId"].(string); id != "" {
		p.waitTask(id)
	}
}
