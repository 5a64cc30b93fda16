package outbox

import (
	"encoding/json"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The go-sdk's stateless HTTP handler marshals a tool's input schema on
// every call; JSON text costs a copy where a *jsonschema.Schema costs a
// reflective marshal. Every schema AddTool registers must be JSON text,
// except the SDK's own case of an untyped input.
func TestInputSchemaAsJSON(t *testing.T) {
	type in struct {
		A int `json:"a"`
	}
	given, err := jsonschema.For[in](nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := json.RawMessage(`{"type":"object"}`)
	for name, got := range map[string]*mcp.Tool{
		"inferred": inputSchemaAsJSON[in](&mcp.Tool{Name: "t"}),
		"pointer":  inputSchemaAsJSON[*in](&mcp.Tool{Name: "t"}),
		"given":    inputSchemaAsJSON[in](&mcp.Tool{Name: "t", InputSchema: given}),
		"map":      inputSchemaAsJSON[in](&mcp.Tool{Name: "t", InputSchema: map[string]any{"type": "object"}}),
		"raw":      inputSchemaAsJSON[in](&mcp.Tool{Name: "t", InputSchema: raw}),
	} {
		if _, ok := got.InputSchema.(json.RawMessage); !ok {
			t.Errorf("%s: input schema is %T; want json.RawMessage", name, got.InputSchema)
		}
	}
	if got := inputSchemaAsJSON[any](&mcp.Tool{Name: "t"}); got.InputSchema != nil {
		t.Errorf("untyped input: schema %v; want nil, for the SDK's empty object", got.InputSchema)
	}
}
