package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HandlerFor is a side-effecting tool's handler. Everything it does through
// tx (its own rows and the effects it enqueues) commits together with the
// call's recorded outcome, or not at all. Slow or external work belongs in
// an effect, delivered after the commit, not in the handler: SQLite has one
// writer, and tx holds it from the handler's first statement to the commit.
//
// What it returns decides what is recorded. A result with IsError set, or
// an error marked with [Final] (a business rejection: "card declined"), is
// the call's outcome: recorded as failed, with the handler's writes and
// effects rolled back, and replayed to a retry with the same key. Any other
// error is a fault (a bad statement, a bug, a downstream that did not
// answer): the handler's writes roll back, nothing is recorded, so a retry
// runs the handler again, and the client gets a generic tool error naming
// the call's id, never the error's text, which goes to the layer's log
// with that id; with [ToolOptions.ShowErrors] or [Options.ShowErrors] the
// client gets the text, unless it carries the database's. A
// *jsonrpc.Error is a protocol error and is not recorded either.
//
// ctx ends when the call stops before its commit: a client's cancel that
// the tool's [CancelPolicy] does not ride out, or the connection closing.
// A cancel from a client's timeout does not end it by default: the call
// runs on and is recorded.
type HandlerFor[In, Out any] func(ctx context.Context, tx Tx, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error)

// ToolOptions configure one tool registered with [AddTool]; nil means all
// defaults.
type ToolOptions struct {
	// FingerprintWindow overrides the layer's window for this tool; zero
	// keeps the layer's, FingerprintOff turns fingerprints off.
	FingerprintWindow time.Duration
	// Record forces recording of a tool annotated idempotentHint.
	Record bool
	// ShowErrors lets the text of a plain error the handler returns reach
	// the client, still unrecorded, as [Options.ShowErrors] does for every
	// tool of the layer; false keeps the layer's setting.
	ShowErrors bool
	// OnCancel says what a client's cancel does to a running call; the
	// zero value is FinishOnTimeout. A task is not stopped by a client's
	// notifications/cancelled (the request was answered already), only by
	// tasks/cancel.
	OnCancel CancelPolicy
	// Tasks say when a call becomes a task (see "Tasks" in the package
	// doc); the zero value never makes one.
	Tasks TaskOptions
	// Retention overrides how long this tool's calls are remembered and
	// kept; the zero value keeps the layer's and the reaper's.
	Retention ToolRetention
}

type toolInfo struct {
	name        string
	record      bool // false: runs in a transaction, never recorded or replayed
	readOnly    bool // read-only transaction, never recorded
	showErrors  bool // a plain handler error's text reaches the client (ShowErrors)
	keyArgument bool // input schema declares idempotency_key
	window      time.Duration
	annotations toolAnnotations
	// onLost is what an abandoned claim of this tool means (calls.on_lost);
	// "" means onLostRerun.
	onLost string
	// sharedClaim: another process reads the claim (a forwarded call's
	// upstream), so it must be committed before the call goes on.
	sharedClaim bool
	// floatArgs: the arguments reach the handler through the go-sdk's
	// schema step, which turns numbers into float64 (see numbers.go), so
	// numbers a float64 cannot hold are refused.
	floatArgs bool
	// tenant scopes the principal of the tool's calls: the server's
	// ServerOptions.Tenant, "" for none.
	tenant string
	// structuredNote: a replay's note may go into its structuredContent,
	// because the tool advertises no output schema or the one it lists
	// declares the note's property (replaynote.go).
	structuredNote bool
	// onCancel: what a client's cancel does to a running call.
	onCancel CancelPolicy
	// tasks: when a call becomes a task, with defaults applied.
	tasks TaskOptions
	// keyRetention: how long a client's key names a call of the tool;
	// zero means the layer's Options.KeyRetention.
	keyRetention time.Duration
	// outcomeRetention: the least time a completed call's row is kept
	// (calls.retain_ms); zero leaves it to the purge's Retention.Calls.
	outcomeRetention time.Duration
	// runStored runs the handler for a task, from the request or from
	// params stored in the task's row, without the SDK: it validates the
	// arguments against the input schema, decodes them into In, and calls
	// the handler with the attempt as Tx (task_run.go).
	runStored func(ctx context.Context, a *attempt, req *mcp.CallToolRequest) (*mcp.CallToolResult, error)
	// finishStored, for a remote tool, decides a task's outcome from what
	// runStored returned; nil means attempt.finish (task_remote.go).
	finishStored func(ctx context.Context, a *attempt, res *mcp.CallToolResult, err error) (mcp.Result, error)
}

// principalOf is the principal a call of t is recorded under: the
// request's, scoped by the tenant of t's server.
func (t *toolInfo) principalOf(req *mcp.CallToolRequest) string {
	return scopedPrincipal(t.tenant, principalOf(req))
}

func (t *toolInfo) onLostPolicy() string {
	if t.onLost == "" {
		return onLostRerun
	}
	return t.onLost
}

// AddTool registers a side-effecting tool on s, which must have the layer
// installed ([Layer.NewServer] or [Layer.Install]); it panics otherwise, as
// [mcp.AddTool] does for a tool it cannot serve. The tool belongs to s
// alone: other servers of the layer may have a tool of the same name with
// another handler. A tool registered on s with [mcp.AddTool] instead is not
// recorded, and a retry with the same key runs it again; its first call
// logs a warning that says so. Like [mcp.AddTool], In and Out give the
// input and output schemas, and arguments are validated before the handler
// runs. A call whose arguments hold a number that a float64 cannot hold,
// which the SDK's validation would change, is refused and nothing runs (see
// "Numbers in arguments" in the package doc).
//
// Tools annotated readOnlyHint run in a read-only transaction and are not
// recorded: their writes fail (see [ErrReadOnly]). Tools annotated idempotentHint run in a transaction but are not
// recorded unless [Options.RecordIdempotent] or [ToolOptions.Record] is set.
//
// t is not changed: the SDK gets a copy whose input schema is JSON text
// (the same JSON clients list), which the SDK's stateless HTTP handler
// reads on every call far more cheaply than a *jsonschema.Schema. For a
// recorded tool the copy's output schema (t's, or the one Out infers)
// also lists the optional string property "mcp_outbox", the note a replay
// carries in its structured content (see "Replays" in the package doc);
// AddTool panics if the output schema already has a property of that name.
func AddTool[In, Out any](l *Layer, s *mcp.Server, t *mcp.Tool, h HandlerFor[In, Out], opts *ToolOptions) {
	var o ToolOptions
	if opts != nil {
		o = *opts
	}
	if !o.OnCancel.valid() {
		panic(fmt.Sprintf("outbox.AddTool %q: ToolOptions.OnCancel is %d, not a CancelPolicy", t.Name, int(o.OnCancel)))
	}
	if !o.Tasks.Mode.valid() {
		panic(fmt.Sprintf("outbox.AddTool %q: ToolOptions.Tasks.Mode is %d, not a TaskMode", t.Name, int(o.Tasks.Mode)))
	}
	if err := o.Retention.check(l.opts.KeyRetention); err != nil {
		panic(fmt.Sprintf("outbox.AddTool %q: ToolOptions: %v", t.Name, err))
	}
	info := &toolInfo{name: t.Name, record: true, window: l.opts.FingerprintWindow, annotations: annotationsOf(t.Annotations),
		floatArgs: true, onCancel: o.OnCancel, tasks: o.Tasks.withDefaults(), showErrors: l.opts.ShowErrors || o.ShowErrors,
		keyRetention: o.Retention.Key, outcomeRetention: o.Retention.Outcome}
	if o.FingerprintWindow != 0 {
		info.window = o.FingerprintWindow
	}
	if a := t.Annotations; a != nil {
		if a.ReadOnlyHint {
			info.readOnly, info.record = true, false
		} else if a.IdempotentHint && !l.opts.RecordIdempotent && !o.Record {
			info.record = false
		}
	}
	sdkTool := inputSchemaAsJSON[In](t)
	declared, err := declaresKeyArgument(sdkTool)
	if err != nil {
		panic(fmt.Sprintf("outbox.AddTool %q: %v", t.Name, err))
	}
	info.keyArgument = declared
	sdkTool, out, err := outputSchemaWithNote[Out](sdkTool, info.record)
	if err != nil {
		panic(fmt.Sprintf("outbox.AddTool %q: %v", t.Name, err))
	}
	info.structuredNote = out.noteAdvertised
	if info.tasks.Mode != TasksNever && !info.record {
		panic(fmt.Sprintf("outbox.AddTool %q: ToolOptions.Tasks on a tool whose calls are not recorded "+
			"(readOnlyHint, or idempotentHint without ToolOptions.Record): a task is its call's record", t.Name))
	}

	reg := l.toolsOf(s)
	if reg == nil {
		panic(fmt.Sprintf("outbox.AddTool %q: the layer is not installed on this server; "+
			"create the server with Layer.NewServer, or call Layer.Install on it first", t.Name))
	}
	info.tenant = reg.tenant

	invoke := func(ctx context.Context, a *attempt, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		a.reached = true
		res, o, err := h(ctx, a, req, in)
		o = out.zeroFor(o)
		if err == nil && res != nil && res.InputRequests != nil {
			// A multi round-trip request: the handler runs again with the
			// client's input, in this attempt (the SDK's server-side loop for
			// older clients) or in the client's retry, which carries the same
			// _meta and so the same key. Either way only the final run's work
			// may commit.
			err = a.discardWork(ctx)
		}
		var wire *jsonrpc.Error
		if err != nil && !isFinal(err) && !errors.As(err, &wire) {
			// The SDK would put err's text into the result it sends
			// (CallToolResult.SetError), and that text may be a driver's.
			// finish answers for the call instead; the SDK only sees a
			// stand-in.
			a.handlerErr = err
			var zero Out
			return nil, zero, errHandlerFailed
		}
		return res, o, err
	}
	if info.tasks.Mode != TasksNever {
		run, err := storedRunner(sdkTool, invoke)
		if err != nil {
			panic(fmt.Sprintf("outbox.AddTool %q: %v", t.Name, err))
		}
		info.runStored = run
	}
	reg.add(info)

	mcp.AddTool(s, sdkTool, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		a := attemptFrom(ctx)
		if a == nil || a.tool != info {
			var zero Out
			return nil, zero, errors.New("outbox: tool called outside the outbox layer; call Layer.Install on the server")
		}
		return invoke(ctx, a, req, in)
	})
}

// declaresKeyArgument reports whether the tool's input schema has a top-level
// idempotency_key property. A tool without a schema has none: AddTool gives
// it the one its input type infers (inputSchemaAsJSON), and for an untyped
// input the SDK's is an empty object.
func declaresKeyArgument(t *mcp.Tool) (bool, error) {
	if t.InputSchema == nil {
		return false, nil
	}
	b, err := json.Marshal(t.InputSchema)
	if err != nil {
		return false, fmt.Errorf("input schema: %w", err)
	}
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return false, fmt.Errorf("input schema: %w", err)
	}
	_, ok := s.Properties[ArgumentIdempotencyKey]
	return ok, nil
}

// inputSchemaAsJSON returns a copy of t whose input schema is JSON text,
// inferred from In as mcp.AddTool would when t has none; the SDK still
// resolves it once, at registration, to validate arguments, and lists the
// same JSON. The reason is the go-sdk's Streamable HTTP handler (v1.8.0):
// for every tools/call request of a 2026-07-28 client it marshals the
// tool's InputSchema again to look for x-mcp-header annotations
// (extractParamHeaderAnnotations). A *jsonschema.Schema is marshalled by
// reflection each time, about 6% of serve's CPU under load; JSON text is
// copied. A schema the SDK would refuse is left as it is, for
// mcp.AddTool to report.
func inputSchemaAsJSON[In any](t *mcp.Tool) *mcp.Tool {
	schema := t.InputSchema
	if _, ok := schema.(json.RawMessage); ok {
		return t
	}
	if schema == nil {
		rt := reflect.TypeFor[In]()
		if rt == reflect.TypeFor[any]() {
			return t // the SDK's own case: an empty object schema
		}
		if rt.Kind() == reflect.Pointer {
			rt = rt.Elem()
		}
		inferred, err := jsonschema.ForType(rt, &jsonschema.ForOptions{})
		if err != nil {
			return t
		}
		schema = inferred
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return t
	}
	tt := *t
	tt.InputSchema = json.RawMessage(b)
	return &tt
}
