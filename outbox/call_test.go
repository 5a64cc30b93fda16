package outbox_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

func callCharge(t *testing.T, cs *mcp.ClientSession, key string, amount int) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": amount}}
	if key != "" {
		p.Meta = mcp.Meta{"idempotencyKey": key}
	}
	res, err := cs.CallTool(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func callMeta(res *mcp.CallToolResult) map[string]any {
	m, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
	return m
}

func TestCall_ReplayWithKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	first := callCharge(t, b.session, "k1", 100)
	if first.IsError {
		t.Fatalf("first call failed: %v", first.Content)
	}
	second := callCharge(t, b.session, "k1", 100)
	if got := charges(t, b); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
	if m := callMeta(second); m["replayed"] != true {
		t.Fatalf("second result meta = %v, want replayed", second.Meta)
	}
	if m := callMeta(first); m["replayed"] != false {
		t.Fatalf("first result meta = %v, want not replayed", first.Meta)
	}
	t.Logf("%+v", second.Content[len(second.Content)-1])
}
