package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/internal/tasknote"
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

// task2025 is a task on the 2025-11-25 wire (its Task type): ttl is
// required and may be null, pollInterval optional.
type task2025 struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	TTL           *int64 `json:"ttl"`
	PollInterval  int64  `json:"pollInterval,omitempty"`
}

// createTaskResult2025 answers a tools/call that asked for a task: the task
// under "task" (2026-07-28 has its fields at the top level instead).
type createTaskResult2025 struct {
	mcp.ResultBase
	Task task2025 `json:"task"`
}

// taskResult2025 answers tasks/get and tasks/cancel: the task's fields at
// the top level of the result.
type taskResult2025 struct {
	mcp.ResultBase
	task2025
}

type listTasksParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

type listTasksResult2025 struct {
	mcp.ResultBase
	Tasks      []task2025 `json:"tasks"`
	NextCursor string     `json:"nextCursor,omitempty"`
}

// as2025 is a task read by getTask as the 2025-11-25 revision shows it. A
// task whose cancel is recorded in its row is cancelled at once: the
// revision wants it cancelled before tasks/cancel is answered, and it can
// end no other way (its owner's commit fails its fence, see cancelTask),
// though its attempt may still be rolling back.
func (t *taskResult) as2025() task2025 {
	w := task2025{TaskID: t.TaskID, Status: t.Status, StatusMessage: t.StatusMessage, CreatedAt: t.CreatedAt,
		LastUpdatedAt: t.LastUpdatedAt, TTL: t.TTLMs, PollInterval: t.PollIntervalMs}
	switch {
	case t.Status == taskWorking && t.cancelAsked:
		w.Status, w.StatusMessage = taskCancelled, "cancelled: its attempt rolls back, and nothing of it is kept"
	case t.Status == taskFailed && t.Error != nil && w.StatusMessage == "":
		w.StatusMessage = t.Error.Message
	case t.toolError:
		// The revision: failed "for tool calls specifically, ... where the
		// tool call result has isError set to true", with a statusMessage
		// to tell why; tasks/result still answers the CallToolResult.
		w.Status = taskFailed
		if w.StatusMessage == "" {
			w.StatusMessage = resultText(t.stored)
		}
	}
	return w
}

func terminal2025(status string) bool {
	return status == taskCompleted || status == taskFailed || status == taskCancelled
}

// createdAnswer is the answer of a tools/call that made (or found) a task,
// in the generation its request speaks.
func (l *Layer) createdAnswer(ctx context.Context, task *attemptTask, principal, id string) (mcp.Result, error) {
	if task == nil || !task.legacy {
		return l.taskAnswer(ctx, principal, id, "task")
	}
	t, err := l.getTask(ctx, principal, id, false)
	if err != nil {
		return nil, err
	}
	return &createTaskResult2025{Task: t.as2025()}, nil
}

// tasks2025 answers the tasks/* methods of a 2025-11-25 session. ctx has
// the request's principal (principalKey).
func (l *Layer) tasks2025(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
	who, ok := ctx.Value(principalKey{}).(string)
	if !ok {
		return nil, errTaskNotFound
	}
	var id, cursor string
	switch p := req.GetParams().(type) {
	case *listTasksParams:
		if p != nil {
			cursor = p.Cursor
		}
	case *taskParams:
		if p != nil {
			id = p.TaskID
		}
	}
	return l.taskMethod2025(ctx, who, method, id, cursor)
}

// taskMethod2025 answers a tasks/* method of the 2025-11-25 revision for
// principal who: a go-sdk session's (tasks2025) or the proxy's
// (remoteLayer.TaskMethod).
func (l *Layer) taskMethod2025(ctx context.Context, who, method, id, cursor string) (mcp.Result, error) {
	switch method {
	case "tasks/list":
		return l.listTasks2025(ctx, who, cursor)
	case "tasks/get":
		t, err := l.getTask(ctx, who, id, false)
		if err != nil {
			return nil, err
		}
		return &taskResult2025{task2025: t.as2025()}, nil
	case "tasks/result":
		return l.taskPayload2025(ctx, who, id)
	case "tasks/cancel":
		return l.cancelTask2025(ctx, who, id)
	}
	return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("%s is not a method of protocol version %s", method, protocolTasks2025)}
}

// relatedTaskMeta is the _meta key that ties a message to its task.
const relatedTaskMeta = "io.modelcontextprotocol/related-task"

// storedResult2025 is a completed task's stored CallToolResult, sent as it
// was stored, with the related-task _meta the revision asks for.
type storedResult2025 struct {
	mcp.ResultBase
	fields map[string]json.RawMessage
}

func (r *storedResult2025) MarshalJSON() ([]byte, error) { return json.Marshal(r.fields) }

// taskPayload2025 answers tasks/result: it waits until the task is terminal
// (reading its row, so the task may run in another process or replica),
// then answers what its tools/call would have: the CallToolResult of a
// task that ended with one (a failed task on this wire when it has
// isError), the JSON-RPC error of a task that ended with an error.
func (l *Layer) taskPayload2025(ctx context.Context, who, id string) (mcp.Result, error) {
	for {
		t, err := l.getTask(ctx, who, id, false)
		if err != nil {
			return nil, err
		}
		w := t.as2025()
		switch {
		case t.Status == taskCompleted: // isError or not (failed on this wire)
			fields := map[string]json.RawMessage{}
			if err := json.Unmarshal([]byte(t.stored), &fields); err != nil {
				return nil, fmt.Errorf("read task result: %w", err)
			}
			meta := map[string]any{}
			if raw, ok := fields["_meta"]; ok {
				_ = json.Unmarshal(raw, &meta)
			}
			meta[relatedTaskMeta] = map[string]string{"taskId": id}
			if t.callMeta != nil {
				meta[MetaKeyCall] = t.callMeta
			}
			b, err := json.Marshal(meta)
			if err != nil {
				return nil, err
			}
			fields["_meta"] = b
			return &storedResult2025{fields: fields}, nil
		case w.Status == taskFailed && t.Error != nil:
			return nil, &jsonrpc.Error{Code: t.Error.Code, Message: t.Error.Message}
		case terminal2025(w.Status):
			// Cancelled. The revision has tasks/result answer what the
			// request would have, but a cancelled request has no answer
			// (cancellation: receivers SHOULD "Not send a response for the
			// cancelled request"). So an error about the request's taskId,
			// whose task holds no result: -32602, as the revision's other
			// errors about a task that cannot serve the method. Not
			// -32603, which reads as a fault of the server.
			data, _ := json.Marshal(map[string]string{"taskId": id, "status": taskCancelled})
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Data: data, Message: fmt.Sprintf(
				"task %s was cancelled before its commit: it has no result, nothing of it was kept, and it will not run again", id)}
		}
		// Poll the row: the task may run anywhere. Its own poll interval
		// bounds the wait, and a short one keeps the answer prompt.
		wait := min(time.Duration(t.PollIntervalMs)*time.Millisecond, 100*time.Millisecond)
		timer := time.NewTimer(max(wait, 10*time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-timer.C:
		}
	}
}

// cancelTask2025 is tasks/cancel of 2025-11-25: -32602 on a terminal task,
// else the cancel of the 2026 generation (cancelTask), answered with the
// task, cancelled. A task whose commit won the race is terminal: -32602.
func (l *Layer) cancelTask2025(ctx context.Context, who, id string) (mcp.Result, error) {
	t, err := l.getTask(ctx, who, id, false)
	if err != nil {
		return nil, err
	}
	if s := t.as2025().Status; terminal2025(s) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Cannot cancel task: it is already " + s}
	}
	if err := l.cancelTask(ctx, who, id); err != nil {
		return nil, err
	}
	if t, err = l.getTask(ctx, who, id, false); err != nil {
		return nil, err
	}
	w := t.as2025()
	if w.Status != taskCancelled {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Cannot cancel task: it committed first and is " + w.Status}
	}
	return &taskResult2025{task2025: w}, nil
}

// tasksPage is how many tasks one tasks/list answer holds.
const tasksPage = 50

const selectTaskPage = `
SELECT id, task_id FROM calls WHERE principal = $1 AND task_id IS NOT NULL AND id > $2 ORDER BY id LIMIT $3`

// listTasks2025 lists the principal's tasks, oldest first, a page at a
// time. The cursor is the last call id of the previous page: rows are only
// ever added with larger ids, so a page never repeats a task.
func (l *Layer) listTasks2025(ctx context.Context, who, cursor string) (mcp.Result, error) {
	var after int64
	if cursor != "" {
		n, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || n < 0 {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid cursor"}
		}
		after = n
	}
	rows, err := l.db.Read.QueryContext(ctx, selectTaskPage, who, after, tasksPage+1)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	type row struct {
		callID int64
		taskID string
	}
	var page []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.callID, &r.taskID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list tasks: %w", err)
		}
		page = append(page, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	res := &listTasksResult2025{Tasks: []task2025{}}
	if len(page) > tasksPage {
		page = page[:tasksPage]
		res.NextCursor = strconv.FormatInt(page[len(page)-1].callID, 10)
	}
	for _, r := range page {
		t, err := l.getTask(ctx, who, r.taskID, false)
		if err == errTaskNotFound {
			continue // removed by retention meanwhile
		}
		if err != nil {
			return nil, err
		}
		res.Tasks = append(res.Tasks, t.as2025())
	}
	return res, nil
}

// tasksCapability2025 is capabilities.tasks of 2025-11-25: tasks/list,
// tasks/cancel, and tools/call made a task.
var tasksCapability2025 = json.RawMessage(`{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}`)

// initializeResult2025 is an initialize answer with capabilities.tasks,
// which go-sdk v1.8.0's ServerCapabilities has no field for. The SDK does
// nothing with the answer after the middleware but marshal it.
type initializeResult2025 struct{ *mcp.InitializeResult }

func (r initializeResult2025) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.InitializeResult)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	caps := map[string]json.RawMessage{}
	if raw, ok := m["capabilities"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &caps); err != nil {
			return nil, err
		}
	}
	caps["tasks"] = tasksCapability2025
	if m["capabilities"], err = json.Marshal(caps); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// advertiseTasks2025 adds capabilities.tasks to an initialize answer at
// 2025-11-25 when a tool of the server may become a task.
func advertiseTasks2025(r *serverTools, res mcp.Result, err error) (mcp.Result, error) {
	ir, ok := res.(*mcp.InitializeResult)
	if err != nil || !ok || !version2025(ir.ProtocolVersion) || !r.anyTasks() {
		return res, err
	}
	return initializeResult2025{ir}, nil
}

// listTools2025 is a tools/list answer with execution.taskSupport on the
// tools that may become tasks: go-sdk v1.8.0's Tool has no such field.
type listTools2025 struct {
	*mcp.ListToolsResult
	support map[string]string
}

func (r listTools2025) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.ListToolsResult)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	var tools []map[string]json.RawMessage
	if err := json.Unmarshal(m["tools"], &tools); err != nil {
		return nil, err
	}
	for i, t := range r.ListToolsResult.Tools {
		if s := r.support[t.Name]; s != "" && i < len(tools) {
			tools[i]["execution"] = json.RawMessage(`{"taskSupport":"` + s + `"}`)
		}
	}
	if m["tools"], err = json.Marshal(tools); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func advertiseToolTasks2025(r *serverTools, res mcp.Result, err error) (mcp.Result, error) {
	lr, ok := res.(*mcp.ListToolsResult)
	if err != nil || !ok {
		return res, err
	}
	support := map[string]string{}
	for _, t := range lr.Tools {
		if ti := r.lookup(t.Name); ti != nil {
			if s := ti.taskSupport(); s != "" {
				support[t.Name] = s
			}
		}
	}
	if len(support) == 0 {
		return res, err
	}
	return listTools2025{lr, support}, nil
}

// notifyTaskEnd sends notifications/tasks/status (2025-11-25: a server
// MAY send it when a task's status changes) to the session that asked for
// the task, once its attempt ended in this process and the task is
// terminal. ext-tasks 0.2.2 acts on it: its poll loop wakes at once, reads
// the terminal status and fetches tasks/result, instead of waiting out
// pollInterval. The TypeScript SDK 1.32.2's client only hands it to a
// notification handler the application set.
//
// Only this process's session hears it: a task finished by another process
// (after its owner died, or on another replica) has no session here, and
// its client learns the end from its next tasks/get or tasks/result, which
// read the row from any process. Over Streamable HTTP it goes on the
// session's standalone stream, the client's GET, where go-sdk puts a
// notification related to no request; a client without that stream polls.
// The 2026-07-28 extension's notifications/tasks goes on the
// subscriptions/listen stream a client opens for its tasks instead
// (task_listen.go).
func (l *Layer) notifyTaskEnd(a *attempt) {
	task := a.task
	if task == nil || task.session == nil || task.shutdown.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t, err := l.getTask(ctx, a.id.principal, task.taskID(), false)
	if err != nil {
		l.logger.WarnContext(ctx, "task status notification: read task", "call_id", a.uid, "error", err)
		return
	}
	w := t.as2025()
	if !terminal2025(w.Status) {
		return // left in flight for the next process: nothing to tell yet
	}
	p, err := tasknote.Progress("notifications/tasks/status", w)
	if err != nil {
		l.logger.WarnContext(ctx, "task status notification", "call_id", a.uid, "error", err)
		return
	}
	// On its own goroutine, outside the task's: a write to a session
	// whose client reads nothing (a stdio pipe nobody drains) blocks until
	// the session closes, and ctx does not bound it; the task is done.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := task.session.NotifyProgress(ctx, p); err != nil {
			// The session may be gone: its client polls, or retries
			// the call and finds the task.
			l.logger.DebugContext(ctx, "task status notification not sent", "call_id", a.uid, "error", err)
		}
	}()
}
