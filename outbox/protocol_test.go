package outbox_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
)

// answers records the results a client reads, as they came over the wire.
type answers struct {
	mcp.Transport
	mu      sync.Mutex
	results []json.RawMessage
}

func (a *answers) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := a.Transport.Connect(ctx)
	return &answersConn{Connection: c, a: a}, err
}

type answersConn struct {
	mcp.Connection
	a *answers
}

func (c *answersConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if r, ok := m.(*jsonrpc.Response); ok && r.Result != nil {
		c.a.mu.Lock()
		c.a.results = append(c.a.results, r.Result)
		c.a.mu.Unlock()
	}
	return m, err
}

// last is the most recent result read.
func (a *answers) last() map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	var m map[string]any
	if len(a.results) > 0 {
		_ = json.Unmarshal(a.results[len(a.results)-1], &m)
	}
	return m
}

// TestCall_ResultTypeForNewProtocol: on 2026-07-28 every tools/call result
// carries resultType, also the answers the layer gives without running the
// tool (a replay, a conflict, the status). The Python SDK 2.3.0 refuses a
// 2026-07-28 result without it, so a client on it could never get a replay;
// the go-sdk's own client does not check.
func TestCall_ResultTypeForNewProtocol(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, nil)
			st, ct := mcp.NewInMemoryTransports()
			ss, err := b.server.Connect(context.Background(), mcpstdio.NewTransport(st, nil), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ss.Close()
			rec := &answers{Transport: ct}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "v0"}, nil).Connect(context.Background(), rec, &mcp.ClientSessionOptions{ProtocolVersion: version})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			want := any(nil)
			if version >= "2026-07-28" {
				want = "complete"
			}
			for _, step := range []struct {
				what string
				tool string
				args map[string]any
				key  string
			}{
				{"the first call", "charge", map[string]any{"amount": 100}, "rt-1"},
				{"a replay", "charge", map[string]any{"amount": 100}, "rt-1"},
				{"a conflict", "charge", map[string]any{"amount": 200}, "rt-1"},
				{"the status", outbox.StatusToolName, map[string]any{"key": "rt-1"}, ""},
			} {
				call(t, cs, step.tool, step.key, step.args)
				got := rec.last()
				if got["resultType"] != want {
					t.Errorf("%s: resultType %v, want %v: %v", step.what, got["resultType"], want, got)
				}
			}
		})
	}
}
