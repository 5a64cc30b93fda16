package outbox_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/internal/schemacheck"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
)

func status(t *testing.T, cs *mcp.ClientSession, args map[string]any) query.Status {
	t.Helper()
	return outboxtest.Status(t, cs, args)
}

func TestStatus_States(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	g := addGate(b.layer, b.server)

	if st := status(t, b.session, map[string]any{"key": "never"}); st.State != query.NotFound {
		t.Errorf("key never used: state %s", st.State)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		callErr(context.Background(), b.session, "gate", "running", map[string]any{"n": 1})
	}()
	<-g.started
	if st := status(t, b.session, map[string]any{"key": "running"}); st.State != query.InFlight || st.Tool != "gate" {
		t.Errorf("running call: %+v", st)
	}
	close(g.release)
	<-done

	callCharge(t, b.session, "paid", 250)
	st := status(t, b.session, map[string]any{"key": "paid"})
	if st.State != query.Completed || st.CompletedAt == nil || len(st.Result) == 0 {
		t.Fatalf("completed call: %+v", st)
	}
	if len(st.Effects) != 1 || st.Effects[0].State != "pending" || st.Effects[0].Destination != "payments" ||
		st.Effects[0].Path != "/v1/charges" || st.Effects[0].IdempotencyKey == "" {
		t.Errorf("effects: %+v", st.Effects)
	}

	call(t, b.session, "refund", "bad-refund", map[string]any{"charge_id": 999})
	if st := status(t, b.session, map[string]any{"key": "bad-refund"}); st.State != query.Failed {
		t.Errorf("failed call: %+v", st)
	}

	// A call made without a key is found by tool and arguments.
	callCharge(t, b.session, "", 77)
	st = status(t, b.session, map[string]any{"tool": "charge", "arguments": map[string]any{"amount": 77}})
	if st.State != query.Completed || st.KeySource != "fingerprint" {
		t.Errorf("lookup by arguments: %+v", st)
	}

	res := call(t, b.session, outbox.StatusToolName, "", map[string]any{})
	if !res.IsError {
		t.Errorf("status without key or tool: want an error")
	}
}

// TestStatusTool_StrictSchemas: strict clients (the TypeScript SDK,
// LangChain.js, the conformance suite) refuse a tools/list answer with a
// boolean schema where a property's schema belongs; the status tool is on
// every server built with the layer, so one bad schema locks them all out.
// The proxy lists the same definition.
func TestStatusTool_StrictSchemas(t *testing.T) {
	b := setup(t, nil, nil)
	listed, err := b.session.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var tool *mcp.Tool
	for _, lt := range listed.Tools {
		if lt.Name == outbox.StatusToolName {
			tool = lt
		}
	}
	if tool == nil {
		t.Fatalf("tools/list has no %s", outbox.StatusToolName)
	}
	for name, s := range map[string]any{"inputSchema": tool.InputSchema, "outputSchema": tool.OutputSchema} {
		if err := schemacheck.Strict(s); err != nil {
			t.Errorf("%s %s: %v", tool.Name, name, err)
		}
	}
}
