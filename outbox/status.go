package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/errid"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// statusInput, the status tool's input, asks for one call: by key, or by tool and arguments for a call
// made without a key.
type statusInput struct {
	Key       string          `json:"key,omitempty" jsonschema:"the idempotency key the call was made with"`
	Tool      string          `json:"tool,omitempty" jsonschema:"for a call made without a key: the tool's name"`
	Arguments json.RawMessage `json:"arguments,omitempty" jsonschema:"for a call made without a key: its exact arguments"`
}

func (l *Layer) addStatusTool(s *mcp.Server, tenant string) {
	mcp.AddTool(s, statusTool(), func(ctx context.Context, req *mcp.CallToolRequest, in statusInput) (*mcp.CallToolResult, *query.Status, error) {
		st, err := l.lookupStatus(ctx, scopedPrincipal(tenant, principalOf(req)), in)
		if err == nil && speaks2025(req) {
			as2025(st)
		}
		return nil, st, err
	})
}

// statusTool is the status tool's definition, as tools/list shows it.
func statusTool() *mcp.Tool {
	t := &mcp.Tool{
		Name:  StatusToolName,
		Title: "What happened to a tool call",
		Description: "Reports what happened to an earlier tool call whose response was lost or unclear: " +
			"not_found (expired or never seen: a retry runs it), in_flight, completed (with the recorded result), " +
			"failed, or unknown (forwarded, but its outcome was lost: it may or may not have run, it will not run again " +
			"by itself, and an operator settles it), and the delivery state of each downstream effect. " +
			"Give the idempotency key the call used, " +
			"or, for a call made without a key, the tool name and the same arguments.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true},
	}
	t.InputSchema, t.OutputSchema = statusSchemas()
	return t
}

// callStatus answers a call of the status tool that reaches the layer
// without a go-sdk server, as in the proxy: arguments are checked the way
// [mcp.AddTool] would, and the status is both the structured content and,
// as JSON, the text content.
func (l *Layer) callStatus(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	var in statusInput
	dec := json.NewDecoder(bytes.NewReader(req.Params.Arguments))
	dec.DisallowUnknownFields()
	if len(req.Params.Arguments) > 0 {
		if err := dec.Decode(&in); err != nil {
			return statusError(fmt.Errorf("invalid arguments: %w", err))
		}
	}
	st, err := l.lookupStatus(ctx, principalOf(req), in)
	if err != nil {
		return statusError(err)
	}
	if remote.Tasks2025(ctx) {
		as2025(st)
	}
	text, err := json.Marshal(st)
	if err != nil {
		return statusError(err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(text)}}, StructuredContent: st}
}

// as2025 makes a status's taskStatus what tasks/get tells the asking
// session: query reports the extension's (2026-07-28), where a tool result
// with isError completes a task, but 2025-11-25 calls that task failed, and
// call_status must not contradict the tasks/get its client just read.
func as2025(st *query.Status) {
	if st.TaskStatus == taskCompleted && st.State == query.Failed {
		st.TaskStatus = taskFailed
	}
}

func statusError(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
}

func (l *Layer) lookupStatus(ctx context.Context, principal string, in statusInput) (*query.Status, error) {
	var (
		st  *query.Status
		err error
	)
	// The client's input first: what is wrong with it is the client's to
	// read. Past it, a failure is the database's (issue 36: its text, a
	// lock, a host name, is the operator's), except a database whose
	// fingerprints need a key file this server lacks.
	switch {
	case in.Key != "" && in.Tool == "":
		if err := callkey.Validate(in.Key); err != nil {
			return nil, fmt.Errorf("%s: %w", StatusToolName, err)
		}
		st, err = query.LookupSealed(ctx, l.db, l.opts.Keys, principal, in.Key, l.now())
	case in.Key == "" && in.Tool != "":
		if _, err := callkey.Canonical(in.Arguments); err != nil {
			return nil, fmt.Errorf("%s: %w", StatusToolName, err)
		}
		st, err = query.LookupArgsSealed(ctx, l.db, l.opts.Keys, principal, in.Tool, in.Arguments, l.now())
	default:
		return nil, fmt.Errorf("%s: give either key, or tool with arguments", StatusToolName)
	}
	if errors.Is(err, query.ErrKeyedFingerprints) {
		return nil, fmt.Errorf("%s: %w", StatusToolName, err)
	}
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%s: %w", StatusToolName, ctx.Err())
	}
	if err != nil {
		id := errid.New()
		l.logger.ErrorContext(ctx, "call_status lookup failed", "error_id", id, "error", err)
		return nil, fmt.Errorf("%s: the lookup failed on the server; its log has the error under error_id=%s", StatusToolName, id)
	}
	if st.State == query.NotFound {
		// A claim waits for no commit of its own (group commit): an attempt
		// of this process may be running a call the table does not show yet.
		l.mu.Lock()
		a := l.local[localKey{principal, st.Key}]
		l.mu.Unlock()
		if a != nil {
			st = query.Running(a.id.key, string(a.id.source), a.tool.name)
			st.ToolCallID = a.toolCallID
		}
	}
	forClient(st)
	return st, nil
}

// statusSchemas derives the status tool's schemas. json.RawMessage is a
// []byte to the schema inference, which would demand an array or null where
// a JSON object (the call's arguments, its recorded result) belongs.
//
// Every property gets a schema object with a type, never the empty schema:
// jsonschema-go writes an empty schema as the boolean schema `true`, which
// is valid JSON Schema but which strict consumers refuse where a property
// schema is expected. The TypeScript SDK's listTools, LangChain.js's
// @langchain/mcp-adapters ("Failed to load tools from server") and the
// official conformance suite's tools-list all rejected `"result": true`.
func statusSchemas() (in, out *jsonschema.Schema) {
	opts := &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[json.RawMessage](): {Type: "object"},
	}}
	in, err := jsonschema.For[statusInput](opts)
	if err != nil {
		panic(fmt.Sprintf("status tool input schema: %v", err))
	}
	out, err = jsonschema.For[query.Status](opts)
	if err != nil {
		panic(fmt.Sprintf("status tool output schema: %v", err))
	}
	out.Properties["result"].Description = "the recorded result of the call, as tools/call answered it: content, structuredContent, isError"
	return in, out
}
