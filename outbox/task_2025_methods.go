package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/tasknote"
)

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
