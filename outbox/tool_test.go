package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

type toolIn struct {
	Amount int64  `json:"amount" jsonschema:"amount in minor units"`
	Note   string `json:"note,omitempty"`
}

type toolOut struct {
	OK bool `json:"ok"`
}

// outbox.AddTool hands the SDK the input schema as JSON text (see
// inputSchemaAsJSON): what clients list, and what the SDK validates, must be
// exactly what mcp.AddTool gives for the same tool, whether the schema is
// inferred, given as a *jsonschema.Schema, or given for a pointer type.
func TestAddTool_SchemaAsTheSDKGivesIt(t *testing.T) {
	ctx := context.Background()
	capped, err := jsonschema.For[toolIn](nil)
	if err != nil {
		t.Fatal(err)
	}
	maximum := 500.0
	capped.Properties["amount"].Maximum = &maximum
	tools := []*mcp.Tool{
		{Name: "inferred"},
		{Name: "given", InputSchema: capped},
	}
	bare := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
	b := setup(t, nil, nil)
	ran := 0
	for _, tool := range tools {
		mcp.AddTool(bare, tool, func(context.Context, *mcp.CallToolRequest, toolIn) (*mcp.CallToolResult, toolOut, error) {
			return nil, toolOut{OK: true}, nil
		})
		outbox.AddTool(b.layer, b.server, tool, func(context.Context, outbox.Tx, *mcp.CallToolRequest, toolIn) (*mcp.CallToolResult, toolOut, error) {
			ran++
			return nil, toolOut{OK: true}, nil
		}, nil)
		if tool.InputSchema != nil && tool.InputSchema != any(capped) {
			t.Fatalf("%s: the caller's tool was changed", tool.Name)
		}
	}
	mcp.AddTool(bare, &mcp.Tool{Name: "pointer"}, func(context.Context, *mcp.CallToolRequest, *toolIn) (*mcp.CallToolResult, toolOut, error) {
		return nil, toolOut{}, nil
	})
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "pointer"}, func(context.Context, outbox.Tx, *mcp.CallToolRequest, *toolIn) (*mcp.CallToolResult, toolOut, error) {
		return nil, toolOut{}, nil
	}, nil)

	listed := func(cs *mcp.ClientSession) map[string]string {
		t.Helper()
		res, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, tool := range res.Tools {
			in, err := json.Marshal(tool.InputSchema)
			if err != nil {
				t.Fatal(err)
			}
			m[tool.Name] = string(in)
		}
		return m
	}
	want, got := listed(connect(t, bare)), listed(b.session)
	for _, name := range []string{"inferred", "given", "pointer"} {
		if got[name] == "" || got[name] != want[name] {
			t.Errorf("%s: listed input schema\n%s\nwant (mcp.AddTool)\n%s", name, got[name], want[name])
		}
	}

	// The SDK still validates against it: above the given maximum, nothing runs.
	res, err := b.session.CallTool(ctx, &mcp.CallToolParams{Name: "given", Arguments: map[string]any{"amount": 501},
		Meta: mcp.Meta{"idempotencyKey": "over"}})
	if err == nil && !res.IsError {
		t.Fatal("an amount above the schema's maximum was accepted")
	}
	res, err = b.session.CallTool(ctx, &mcp.CallToolParams{Name: "given", Arguments: map[string]any{"amount": 500},
		Meta: mcp.Meta{"idempotencyKey": "at"}})
	if err != nil || res.IsError {
		t.Fatalf("an amount at the maximum: %v %v", err, res)
	}
	if ran != 1 {
		t.Fatalf("handler ran %d times; want 1 (only the valid call)", ran)
	}
}
