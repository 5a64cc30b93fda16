// Package remote is what the proxy (package outbox/sidecar, the
// `mcp-outbox proxy` command) needs of the layer and a library user does
// not: tools that run in another process, the claim a forwarded call
// carries, and the status tool and spans of a server that is not a go-sdk
// server.
//
// Forwarding a call needs the layer's internals (the attempt, its claim,
// the commit path), which only package outbox can reach, so the code stays
// there; only the names the proxy calls it by live here. Package outbox
// imports this package, never the reverse, and sets [Of] in an init
// function. The proxy imports outbox (for *outbox.Layer), so that init has
// run before the proxy can call Of. Being internal to outbox/, none of this
// is part of outbox's API, yet outbox and outbox/sidecar both reach it.
//
// The contract with a cooperating upstream (the claim under [MetaKeyClaim],
// the fenced commit) is described for every language in schema/README.md,
// which spells the key out: an upstream needs no Go name for it.
package remote

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"
)

// MetaKeyClaim is the params._meta entry a forwarded call carries.
const MetaKeyClaim = "io.github.mcp-outbox/claim"

// Claim names the claimed call row a cooperating upstream records into.
type Claim struct {
	Key    string `json:"key"`    // the call's idempotency key
	CallID string `json:"callId"` // calls.uid; effect n's Idempotency-Key is CallID-n
	RowID  int64  `json:"rowId"`  // calls.id; effects.call_id
	Owner  string `json:"owner"`  // calls.owner: the fence of the upstream's update
}

// ErrNotForwarded marks an error of a [Forward] function that sent nothing:
// the call certainly did not run.
var ErrNotForwarded = errors.New("outbox: call not forwarded")

// Forward hands a call to the upstream and returns its answer. claim is nil
// for a call the layer does not record. An error wrapping [ErrNotForwarded]
// means nothing was sent; a *jsonrpc.Error is the upstream's protocol error
// (taken to mean the tool did not run: unknown tool, invalid params); any
// other error means the answer was lost.
type Forward func(ctx context.Context, claim *Claim) (*mcp.CallToolResult, error)

// Options configure [Layer.Tool].
type Options struct {
	// Cooperating says the upstream records each claimed call's outcome
	// itself, following schema/README.md.
	Cooperating bool
	// Tasks says when a call of the tool becomes a task of the 2026-07-28
	// Tasks extension; the zero value never.
	Tasks TaskOptions
	// Stored forwards a task: the tools/call params stored in the task's
	// row, with the claim, to an upstream connection of the proxy's own,
	// not a client's (the task outlives the request, its session, and on
	// recovery its process). Required for Tasks to take effect.
	Stored func(ctx context.Context, params json.RawMessage, claim *Claim) (*mcp.CallToolResult, error)
	// KeyRetention and OutcomeRetention are the tool's
	// outbox.ToolRetention, which this package cannot name; zero keeps
	// the defaults. Checked by Layer.CheckRetention.
	KeyRetention, OutcomeRetention time.Duration
}

// TaskOptions are outbox.TaskOptions, which this package cannot name.
type TaskOptions struct {
	Mode                     int // an outbox.TaskMode
	After, PollInterval, TTL time.Duration
}

// A Tool is a tool of the upstream, as the layer treats it.
type Tool interface {
	// Call runs one tools/call of the tool through the layer, with fwd in
	// place of a handler: a retry of a recorded call is replayed, a
	// duplicate waits for the original, and the answer is recorded as the
	// call's outcome. The returned error is a protocol error to send back
	// as such.
	//
	// A call that becomes a task is answered with CreateTaskResult (an
	// mcp.Result that is not a *mcp.CallToolResult) once the task is
	// durable, and is forwarded through Options.Stored, not fwd.
	Call(ctx context.Context, req *mcp.CallToolRequest, fwd Forward) (mcp.Result, error)
	// Recorded reports whether the tool's calls are recorded, and so may
	// be replayed.
	Recorded() bool
	// TaskSupport is the tool's execution.taskSupport of the 2025-11-25
	// revision ("optional" or "required"), "" for a tool whose calls
	// never become tasks.
	TaskSupport() string
}

// tasks2025Key marks a context of a request that speaks the 2025-11-25
// revision's Tasks.
type tasks2025Key struct{}

// WithTasks2025 marks ctx as a request's of a session negotiated at the
// 2025-11-25 revision (initialize), whose Tasks are the client's choice
// (params.task) and are answered in that revision's shapes, for
// [Tool.Call] and [Layer.TaskMethod]. Unmarked, a request speaks the
// 2026-07-28 extension. The proxy knows the session's revision; the
// layer, which sees no go-sdk session of the proxy's, cannot.
func WithTasks2025(ctx context.Context) context.Context {
	return context.WithValue(ctx, tasks2025Key{}, true)
}

// Tasks2025 reports whether ctx is marked by [WithTasks2025].
func Tasks2025(ctx context.Context) bool {
	v, _ := ctx.Value(tasks2025Key{}).(bool)
	return v
}

// RequestInfo describes an MCP request for its server span where the
// go-sdk's request does not: the proxy has no go-sdk server session.
type RequestInfo struct {
	// Transport is the network.transport: "pipe" for stdio, "tcp" for HTTP.
	Transport string
	// ProtocolVersion is the MCP protocol version of the session or request.
	ProtocolVersion string
	// SessionID is the MCP session id, "" if none.
	SessionID string
}

// Layer is an *outbox.Layer as the proxy uses it.
type Layer interface {
	// Tool describes an upstream tool from its definition (as tools/list
	// gave it; nil for a tool the upstream has not listed). Its
	// annotations decide, as for outbox.AddTool, whether calls are
	// recorded: readOnlyHint and idempotentHint tools pass through
	// unrecorded, everything else is recorded, the spec's default
	// (destructive) included.
	Tool(name string, t *mcp.Tool, opts Options) Tool

	// CheckRetention says what is wrong with a tool's key and outcome
	// retention (Options.KeyRetention, OutcomeRetention), as
	// outbox.AddTool would, nil if nothing: Tool cannot refuse.
	CheckRetention(key, outcome time.Duration) error

	// StartToolCallSpan starts the SERVER span of a tools/call, with the
	// same parent, links and attributes as the spans of a go-sdk server the
	// layer is installed on. Pass the returned context to [Tool.Call], then
	// call end with the answer. describe is called only when the span
	// records: a caller that does not trace pays nothing for finding out
	// what it says.
	StartToolCallSpan(ctx context.Context, req *mcp.CallToolRequest, describe func() RequestInfo) (_ context.Context, end func(*mcp.CallToolResult, error))

	// TracerProvider is the provider of the layer's spans, for the spans
	// the proxy adds of its own (its forwarded calls).
	TracerProvider() trace.TracerProvider

	// CallStatus answers a call of the status tool: arguments are checked
	// the way mcp.AddTool would, and the status is both the structured
	// content and, as JSON, the text content.
	CallStatus(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult

	// StatusTool is the status tool's definition, as tools/list shows it.
	StatusTool() *mcp.Tool

	// Capability is the value advertised under
	// capabilities.experimental[outbox.CapabilityName].
	Capability() map[string]any

	// TaskMethod answers tasks/get, tasks/update or tasks/cancel of the
	// 2026-07-28 Tasks extension from the database, for the principal of
	// extra's token; on a ctx marked by [WithTasks2025], tasks/get,
	// tasks/result (which waits until the task is terminal), tasks/list
	// and tasks/cancel of the 2025-11-25 revision. tasks/result and
	// tasks/list of 2026-07-28 are -32601; the result is nil for any other
	// method.
	TaskMethod(ctx context.Context, method string, params json.RawMessage, extra *mcp.RequestExtra) (mcp.Result, error)
}

// Of returns layer, which must be a non-nil *outbox.Layer, as the proxy
// uses it. Package outbox sets it in its init function.
var Of func(layer any) Layer
