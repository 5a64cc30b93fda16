package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
)

// The 2025-11-25 generation of Tasks (experimental in that revision's
// core), spoken by the TypeScript SDK 1.24–1.32 (client.experimental.tasks),
// Python mcp 1.23–1.30 (session.experimental) and
// @modelcontextprotocol/ext-tasks on a 2025-11-25 connection. The client
// decides: it sends params.task on a tools/call of a tool whose
// execution.taskSupport allows it; the server has said so in initialize
// (capabilities.tasks) and tools/list. The tasks are the same durable rows
// as the 2026-07-28 extension's; only the wire differs.

// Protocol revisions that decide which generation a request speaks.
const (
	protocolTasks2025 = "2025-11-25"
	protocolTasks2026 = "2026-07-28"
)

// speaks2025 reports whether req belongs to a session negotiated with
// initialize at 2025-11-25: a 2026-07-28 request carries its protocol
// version in its own _meta, and one session may see both (a stdio server
// is reached by one client, but serve's HTTP endpoint by several).
//
// go-sdk v1.8.0 keeps the version a client asked for in InitializeParams;
// initialize never negotiates past 2025-11-25, so a session that asked for
// that or later speaks 2025-11-25. Over stateful Streamable HTTP the
// session is the one initialize made; a request without a session gets
// InitializeParams made up from its MCP-Protocol-Version header.
func speaks2025(req mcp.Request) bool {
	// A request without params holds a typed nil (*ListToolsParams, say),
	// whose GetMeta panics.
	if p := req.GetParams(); p != nil && !reflect.ValueOf(p).IsNil() {
		if _, ok := p.GetMeta()[mcp.MetaKeyProtocolVersion]; ok {
			return false
		}
	}
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok || ss == nil {
		return false
	}
	ip := ss.InitializeParams()
	return ip != nil && version2025(ip.ProtocolVersion)
}

func version2025(v string) bool { return v >= protocolTasks2025 && v < protocolTasks2026 }

// asksForTask reports whether a tools/call carried params.task, which the
// fronts (mcpstdio, mcphttp) lift into _meta: go-sdk v1.8.0's
// CallToolParamsRaw has no field for it and would drop it.
func asksForTask(req *mcp.CallToolRequest) bool {
	if req.Params == nil {
		return false
	}
	_, ok := req.Params.Meta[paramskey.TaskMetaKey]
	return ok
}

// askedTTL is the ttl a 2025-11-25 request asked for in params.task
// (lifted into _meta), zero when it asked for none (or for nonsense: the
// default then applies). attempt.retention grants it within bounds.
func askedTTL(req *mcp.CallToolRequest) time.Duration {
	if req.Params == nil {
		return 0
	}
	b, err := json.Marshal(req.Params.Meta[paramskey.TaskMetaKey])
	if err != nil {
		return 0
	}
	var p struct {
		TTL *float64 `json:"ttl"`
	}
	if json.Unmarshal(b, &p) != nil || p.TTL == nil || *p.TTL < 1 || *p.TTL > float64(math.MaxInt64/int64(time.Millisecond)) {
		return 0
	}
	return time.Duration(*p.TTL) * time.Millisecond
}

// frontMarked reports whether params came through a front of this module,
// which marks them (paramskey.FrontMetaKey) and lifts params.task on every
// tools/call: mcpstdio and mcphttp mark a session's initialize, the proxy
// (which has no go-sdk session) each tools/call of a 2025-11-25 session.
func frontMarked(p mcp.Params) bool {
	if p == nil || reflect.ValueOf(p).IsNil() {
		return false
	}
	v, _ := p.GetMeta()[paramskey.FrontMetaKey].(bool)
	return v
}

// sessionFronted reports whether req's session was made by an initialize
// that came through a front.
func sessionFronted(req mcp.Request) bool {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok || ss == nil {
		return false
	}
	ip := ss.InitializeParams()
	return ip != nil && frontMarked(ip)
}

// fronted reports marked, and, the first time a server with tasks is
// reached through no front, logs why its 2025-11-25 clients get no tasks.
func (l *Layer) fronted(ctx context.Context, r *serverTools, marked bool) bool {
	if marked || !r.anyTasks() {
		return marked
	}
	if l.warnedNoFront.CompareAndSwap(false, true) {
		l.logger.WarnContext(ctx, "a session of a server with task tools was made without the outbox's transport front "+
			"(mcpstdio.NewTransport around the transport, or mcphttp.NewHandler / mcphttp.LiftParamsKey): go-sdk drops "+
			"the params.task of 2025-11-25 clients, so that revision's Tasks are not offered on it (2026-07-28 Tasks work)")
	}
	return false
}

// taskSupport is a tool's execution.taskSupport of 2025-11-25: "" (absent,
// which means forbidden) for a tool that never becomes a task.
func (t *toolInfo) taskSupport() string {
	switch {
	case !t.record || t.tasks.Mode == TasksNever:
		return ""
	case t.tasks.Mode == TasksRequired:
		return "required"
	default:
		return "optional"
	}
}

// call2025 decides a tools/call of a 2025-11-25 session; done is false when
// the call is a plain one, for call to go on with.
func (l *Layer) call2025(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest) (res mcp.Result, err error, done bool) {
	support := t.taskSupport()
	if !sessionFronted(req) && !frontMarked(req.Params) {
		// No front lifted params.task (and none was offered: see
		// fronted): the call cannot be a task.
		if support == "required" {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf(
				"tool %q runs only as a task, and this server offers 2025-11-25 Tasks only through the outbox's transport fronts (mcpstdio, mcphttp). Nothing was executed.", t.name)}, true
		}
		return nil, nil, false
	}
	switch {
	case asksForTask(req) && support == "":
		// The revision: a server SHOULD answer -32601 to a task asked of
		// a tool that forbids it. Nothing runs: the client expects a
		// CreateTaskResult, and a plain answer would read as a failure
		// after the call had had its effect.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf(
			"tool %q does not run as a task (its execution.taskSupport is forbidden); call it without params.task. Nothing was executed.", t.name)}, true
	case asksForTask(req):
		// The client decided, so TasksIfSlow does not wait for a plain
		// answer: a client that sent params.task reads the answer as a
		// CreateTaskResult only (the TypeScript SDK parses it with
		// CreateTaskResultSchema, and fails on a CallToolResult).
		res, err := l.callAsTask(ctx, t, req, true)
		if cr, ok := res.(*mcp.CallToolResult); ok && err == nil {
			return nil, refusal2025(cr), true
		}
		return res, err, true
	case support == "required":
		// The revision: MUST answer -32601 to a call made without a task.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf(
			"tool %q runs only as a task (execution.taskSupport required): send params.task. Nothing was executed.", t.name)}, true
	}
	return nil, nil, false
}

// refusal2025 is the JSON-RPC error that answers a task-augmented
// tools/call with what the layer decided before any task was made (a key
// conflict, an invalid key, arguments refused, a replay of a call recorded
// without a task...). The revision leaves a receiver two answers: a
// CreateTaskResult for a request it accepts, or a JSON-RPC error; the
// TypeScript SDK rejects anything else with an unhelpful -32603 of its own
// and the caller never reads why. No task exists here, and making one
// (already failed) would show a task that never ran as a call's record, so
// it is an error. Its message is the refusal's text, which says nothing
// was executed; data keeps the layer's code and the CallToolResult a call
// without params.task would have had.
func refusal2025(cr *mcp.CallToolResult) error {
	code, _ := cr.Meta[MetaKeyError].(string)
	msg := ""
	for _, c := range cr.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			msg = tc.Text
			break
		}
	}
	rpc := int64(jsonrpc.CodeInvalidParams)
	switch {
	case code == codeNotRecorded:
		// The store failed (or the task ended before it was taken up):
		// nothing about the request itself was wrong.
		rpc = jsonrpc.CodeInternalError
	case code == "" && !cr.IsError:
		// A replay: the key names a call recorded without a task. Its
		// result is the outcome a retry gets; here it goes under data.
		msg = "this call was made earlier without a task and its outcome is recorded; no task was made and nothing was executed now. " +
			"Call it again without params.task to get its recorded result (it is also under data.result)."
		code = "not_a_task"
	case code == "":
		msg = "this call was made earlier without a task and its outcome, an error, is recorded; no task was made and nothing was executed now. " +
			"Its recorded result: " + msg
		code = "not_a_task"
	}
	data, err := json.Marshal(map[string]any{"code": code, "result": cr})
	if err != nil {
		data = nil
	}
	return &jsonrpc.Error{Code: rpc, Message: msg, Data: data}
}
