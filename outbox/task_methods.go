package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// taskParams are the params of tasks/get, tasks/update and tasks/cancel.
type taskParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
	// InputResponses of tasks/update; no tool of the layer asks for input
	// in a task, so they are accepted and ignored.
	InputResponses json.RawMessage `json:"inputResponses,omitempty"`
}

// ackResult answers tasks/update and tasks/cancel.
type ackResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

func ack() *ackResult { return &ackResult{ResultType: "complete"} }

var errTaskNotFound = &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Task not found"}

// principalKey carries a tasks/* request's principal from the layer's
// middleware, which sees the request's Extra (its token), to the method
// handler, which the SDK gives only the session and the params.
type principalKey struct{}

// addTaskMethods registers tasks/get, tasks/update and tasks/cancel on s,
// and tasks/result and tasks/list, which only the 2025-11-25 generation has:
// the layer's middleware answers those of a 2025-11-25 session
// (tasks2025), and -32601 to the rest, as the 2026-07-28 extension wants.
func (l *Layer) addTaskMethods(s *mcp.Server) {
	principal := func(ctx context.Context) (string, error) {
		p, ok := ctx.Value(principalKey{}).(string)
		if !ok {
			// Reached without the layer's middleware: no principal to
			// scope the task by, so no task.
			return "", errTaskNotFound
		}
		return p, nil
	}
	must := func(err error) {
		if err != nil {
			panic(fmt.Sprintf("outbox: register task method: %v", err))
		}
	}
	must(mcp.AddReceivingCustomMethod(s, "tasks/get", func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (*taskResult, error) {
		who, err := principal(ctx)
		if err != nil {
			return nil, err
		}
		return l.getTask(ctx, who, p.TaskID, true)
	}))
	notFound := func(method string) error {
		return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("%s is not a method of protocol version %s", method, protocolTasks2026)}
	}
	must(mcp.AddReceivingCustomMethod(s, "tasks/result", func(context.Context, *mcp.ServerSession, *taskParams) (*taskResult, error) {
		return nil, notFound("tasks/result")
	}))
	must(mcp.AddReceivingCustomMethod(s, "tasks/list", func(context.Context, *mcp.ServerSession, *listTasksParams) (*listTasksResult2025, error) {
		return nil, notFound("tasks/list")
	}))
	must(mcp.AddReceivingCustomMethod(s, "tasks/update", func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (*ackResult, error) {
		who, err := principal(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := l.getTask(ctx, who, p.TaskID, false); err != nil {
			return nil, err
		}
		return ack(), nil
	}))
	must(mcp.AddReceivingCustomMethod(s, "tasks/cancel", func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (*ackResult, error) {
		who, err := principal(ctx)
		if err != nil {
			return nil, err
		}
		if err := l.cancelTask(ctx, who, p.TaskID); err != nil {
			return nil, err
		}
		return ack(), nil
	}))
}

// isTaskMethod reports whether method is one the layer answers for tasks.
func isTaskMethod(method string) bool {
	switch method {
	case "tasks/get", "tasks/update", "tasks/cancel", "tasks/result", "tasks/list":
		return true
	}
	return false
}

// requestPrincipal is the principal of any request, as principalOf is of
// a tools/call.
func requestPrincipal(req mcp.Request) string {
	return principalOf(&mcp.CallToolRequest{Extra: req.GetExtra()})
}

const selectTask = `
SELECT id, uid, key, key_source, state, result, created_at, completed_at, expires_at, task_ttl_ms, task_poll_ms, task_end, task_error_code, task_cancel
FROM calls WHERE principal = $1 AND task_id = $2`

// getTask reads a task: a pure read of the call's row, from any process or
// replica. withResult adds the final result of a terminal task.
func (l *Layer) getTask(ctx context.Context, principal, id string, withResult bool) (*taskResult, error) {
	if id == "" {
		return nil, errTaskNotFound
	}
	var (
		callID, created, expires int64
		uid, key, source         string
		state, end               string
		result                   sql.NullString
		completed, ttl           sql.NullInt64
		poll, code, cancel       int64
	)
	err := l.db.Read.QueryRowContext(ctx, selectTask, principal, id).Scan(
		&callID, &uid, &key, &source, &state, &result, &created, &completed, &expires, &ttl, &poll, &end, &code, &cancel)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errTaskNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read task: %w", err)
	}
	if result.Valid {
		plain, err := l.sealer.OpenString(ctx, l.db.Read, callRef(callID, "result", principal), result.String)
		if err != nil {
			// Erased, tampered or under a missing key: the task's result
			// says so; the task is never run again.
			plain, _ = encodeResult(toolError(unreadableCode(err), "the recorded result of this task cannot be read (%v).", err))
		}
		result.String = plain
	}
	t := &taskResult{ResultType: "complete", TaskID: id, CreatedAt: taskTime(created), LastUpdatedAt: taskTime(created),
		PollIntervalMs: poll}
	if ttl.Valid {
		t.TTLMs = &ttl.Int64
	}
	t.cancelAsked, t.stored = cancel != 0, result.String
	if completed.Valid {
		t.LastUpdatedAt = taskTime(completed.Int64)
		// A recorded result carries the layer's outcome, as a plain
		// call's does (setCallMeta): the task's is delivered, not
		// replayed, however often it is read.
		t.callMeta = callMeta(callIdentity{key: key, source: callkey.Source(source)}, uid, state, false, created, completed.Int64)
	}
	switch {
	case state == "in_flight":
		t.Status = taskWorking
		if cancel != 0 {
			t.StatusMessage = "cancel requested; the task ends cancelled unless its outcome committed first"
		}
	case end == "cancelled":
		t.Status, t.StatusMessage = taskCancelled, "cancelled before its commit: nothing of it was kept"
	case end == "failed":
		t.Status = taskFailed
		t.Error = &taskError{Code: code, Message: resultText(result.String)}
	case state == "unknown":
		t.Status = taskFailed
		t.Error = &taskError{Code: jsonrpc.CodeInternalError, Message: "the call's outcome is unknown: it may or may not have run; an operator settles it"}
	default: // completed or failed: a tool result, isError or not
		// The extension: completed "includes tool calls that returned
		// results with isError: true"; failed is for JSON-RPC errors only.
		t.Status, t.toolError = taskCompleted, state == "failed"
		if withResult && result.Valid {
			inner, err := completeResult(result.String, t.callMeta)
			if err != nil {
				return nil, fmt.Errorf("read task result: %w", err)
			}
			t.Result = inner
		}
	}
	return t, nil
}

// completeResult is a stored tool result as a task's "result": the
// extension's client wants resultType "complete" inside it too (without it,
// ext-tasks 0.2.2 reports the task failed).
func completeResult(stored string, call map[string]any) (json.RawMessage, error) {
	var m map[string]any
	if err := json.Unmarshal([]byte(stored), &m); err != nil {
		return nil, err
	}
	m["resultType"] = "complete"
	if call != nil {
		meta, _ := m["_meta"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta[MetaKeyCall] = call
		m["_meta"] = meta
	}
	return json.Marshal(m)
}

// resultText is the text of a stored result's first text block.
func resultText(stored string) string {
	var r mcp.CallToolResult
	if json.Unmarshal([]byte(stored), &r) == nil {
		for _, c := range r.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				return tc.Text
			}
		}
	}
	return "the task failed"
}

// requestTaskCancel records that tasks/cancel asked a task to stop; the
// owner's commit then refuses to record an outcome (recordOutcome).
const requestTaskCancel = `UPDATE calls SET task_cancel = 1 WHERE id = $1 AND state = 'in_flight'`

// cancelTask stops a task that has not committed: an attempt of this layer
// running it is told at once, and the request is recorded in the row, so
// that an owner in another process (or replica) fails its fence and the
// task ends cancelled. A terminal task stays as it is.
func (l *Layer) cancelTask(ctx context.Context, principal, id string) error {
	var (
		callID      int64
		state, tool string
	)
	err := l.db.Read.QueryRowContext(ctx, `SELECT id, state, tool FROM calls WHERE principal = $1 AND task_id = $2`, principal, id).Scan(&callID, &state, &tool)
	if errors.Is(err, sql.ErrNoRows) {
		return errTaskNotFound
	}
	if err != nil {
		return fmt.Errorf("read task: %w", err)
	}
	if state != "in_flight" {
		return nil // terminal: cancel changes nothing
	}
	// Tell a local attempt first: on SQLite it may hold the writer, which
	// the write below waits for.
	l.mu.Lock()
	a := l.tasks[id]
	l.mu.Unlock()
	if a != nil {
		via := taskCancelOrigin(ctx)
		a.task.cancelVia.Store(&via)
		a.task.cancelled.Store(true)
		a.task.stop(ErrTaskCancelled)
	}
	u, err := l.group.enter(background(ctx), true)
	if err != nil {
		return fmt.Errorf("cancel task: %w", err)
	}
	_, xerr := u.exec(requestTaskCancel, callID)
	if err := errors.Join(xerr, u.leave(xerr == nil).wait()); err != nil {
		return fmt.Errorf("cancel task: %w", err)
	}
	if a == nil {
		if err := l.cancelRemoteTask(ctx, callID, tool); err != nil { // task_remote.go
			return err
		}
	}
	l.tickTasks()
	return nil
}
