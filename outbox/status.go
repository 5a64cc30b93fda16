package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/query"
)

// StatusInput asks for one call: by key, or by tool and arguments for a call
// made without a key.
type StatusInput struct {
	Key       string          `json:"key,omitempty" jsonschema:"the idempotency key the call was made with"`
	Tool      string          `json:"tool,omitempty" jsonschema:"for a call made without a key: the tool's name"`
	Arguments json.RawMessage `json:"arguments,omitempty" jsonschema:"for a call made without a key: its exact arguments"`
}

func (l *Layer) addStatusTool(s *mcp.Server) {
	t := &mcp.Tool{
		Name:  StatusToolName,
		Title: "What happened to a tool call",
		Description: "Reports what happened to an earlier tool call whose response was lost or unclear: " +
			"unknown (never seen, or expired: a retry runs it), in_flight, completed (with the recorded result) " +
			"or failed, and the delivery state of each downstream effect. Give the idempotency key the call used, " +
			"or, for a call made without a key, the tool name and the same arguments.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true},
	}
	t.InputSchema, t.OutputSchema = statusSchemas()
	mcp.AddTool(s, t, func(ctx context.Context, req *mcp.CallToolRequest, in StatusInput) (*mcp.CallToolResult, *query.Status, error) {
		principal := principalOf(req)
		var (
			st  *query.Status
			err error
		)
		switch {
		case in.Key != "" && in.Tool == "":
			st, err = query.Lookup(ctx, l.db.Read, principal, in.Key, l.now())
		case in.Key == "" && in.Tool != "":
			st, err = query.LookupArgs(ctx, l.db.Read, principal, in.Tool, in.Arguments, l.now())
		default:
			err = errors.New("give either key, or tool with arguments")
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", StatusToolName, err)
		}
		return nil, st, nil
	})
}

// statusSchemas derives the status tool's schemas. json.RawMessage is a
// []byte to the schema inference, which would demand an array or null where
// any JSON value (the call's arguments, its recorded result) belongs.
func statusSchemas() (in, out *jsonschema.Schema) {
	opts := &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[json.RawMessage](): {},
	}}
	in, err := jsonschema.For[StatusInput](opts)
	if err != nil {
		panic(fmt.Sprintf("status tool input schema: %v", err))
	}
	out, err = jsonschema.For[query.Status](opts)
	if err != nil {
		panic(fmt.Sprintf("status tool output schema: %v", err))
	}
	return in, out
}
