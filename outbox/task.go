package outbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
)

// ErrTaskCancelled is the cause (context.Cause) of a task's handler
// context when a client's tasks/cancel ended it before its commit: the
// task ends cancelled, and nothing of it is kept.
var ErrTaskCancelled = errors.New("outbox: the task was cancelled by its client (tasks/cancel)")

// ErrLayerStopped is the cause (context.Cause) of a task's handler context
// when Runner.Stop stopped it before its commit: nothing of it is kept, and
// it runs again at the next start.
var ErrLayerStopped = errors.New("outbox: the layer is stopping; the task runs again at the next start")

// ExtensionTasks is the 2026-07-28 Tasks extension (SEP-2663). A client
// lists it per request under
// _meta["io.modelcontextprotocol/clientCapabilities"].extensions; a server
// whose tools allow tasks lists it in server/discover.
const ExtensionTasks = "io.modelcontextprotocol/tasks"

// CodeTaskRequired is the JSON-RPC error of a call, made without the Tasks
// extension, to a tool that runs only as a task ([TasksRequired]).
const CodeTaskRequired = -32021

// TaskMode says when a call of a tool becomes a task (see "Tasks" in the
// package doc). Only a request that declares [ExtensionTasks] ever gets a
// task; only recorded calls (with a key, or a fingerprint) can be one.
type TaskMode int

const (
	// TasksNever, the default: never a task.
	TasksNever TaskMode = iota
	// TasksAlways: a task whenever the request declares the extension; a
	// plain call otherwise.
	TasksAlways
	// TasksRequired: only as a task; a request without the extension gets
	// the JSON-RPC error CodeTaskRequired (-32021) and nothing runs.
	TasksRequired
	// TasksIfSlow: a plain answer if the call finishes within
	// TaskOptions.After, else a task. The call's claim is committed with
	// an fsync up front (a task must be durable before its handle is
	// sent, and later the handler may hold SQLite's writer), so every
	// call that may become a task pays one durable commit more.
	TasksIfSlow
)

func (m TaskMode) valid() bool { return m >= TasksNever && m <= TasksIfSlow }

// grantTTL is the ttl a task gets when its client asked for asked: at
// most ceiling, the retention the task has without asking (a task outlives
// neither its tool's TTL nor the key that finds it again), at least
// 1 minute (or ceiling, if shorter). Asking shortens how long the call's
// record is kept, its key with it: after the ttl a retry runs it again.
func grantTTL(asked, ceiling time.Duration) time.Duration {
	return min(ceiling, max(asked, min(defaults.MinTaskTTL, ceiling)))
}

// TaskOptions configure the tasks of one tool ([ToolOptions.Tasks]).
type TaskOptions struct {
	// Mode says when a call becomes a task; the zero value is TasksNever.
	Mode TaskMode
	// After is how long a TasksIfSlow call waits for a plain answer; zero
	// means 1 s.
	After time.Duration
	// PollInterval is the pollIntervalMs told to clients; zero means
	// 500 ms.
	PollInterval time.Duration
	// TTL is the ttlMs told to clients: how long a finished task is kept,
	// and the call's record with it. Zero means the call's key retention
	// (ToolRetention.Key, else Options.KeyRetention, for a client's key;
	// the fingerprint window for a call made without one), so a task lives
	// exactly as long as the key that finds it again.
	// A client of the 2025-11-25 generation may ask for a shorter ttl
	// (params.task.ttl): it gets it, though never less than 1 minute,
	// and the answered ttl says what it got. The 2026-07-28 extension
	// lets a client ask for none.
	TTL time.Duration
}

func (o TaskOptions) withDefaults() TaskOptions {
	if o.After <= 0 {
		o.After = defaults.TaskAfter
	}
	if o.PollInterval <= 0 {
		o.PollInterval = defaults.TaskPollInterval
	}
	return o
}

// declaresTasks reports whether the request lists the Tasks extension in
// its own _meta. Only the request's _meta counts: the extension is
// declared per request, never for a session.
func declaresTasks(req *mcp.CallToolRequest) bool {
	if req.Params == nil || req.Params.Meta == nil {
		return false
	}
	raw, ok := req.Params.Meta[mcp.MetaKeyClientCapabilities]
	if !ok {
		return false
	}
	// Over a wire it is a map; a client in the same process may put the
	// SDK's own typed value there.
	b, err := json.Marshal(raw)
	if err != nil {
		return false
	}
	var caps struct {
		Extensions map[string]json.RawMessage `json:"extensions"`
	}
	if json.Unmarshal(b, &caps) != nil {
		return false
	}
	_, ok = caps.Extensions[ExtensionTasks]
	return ok
}

// attemptTask is what an attempt that runs as a task carries.
type attemptTask struct {
	opts TaskOptions
	// params: the tools/call params the task runs from, stored in the row.
	params string
	// recover: the task runner took this attempt up; it never inserts a row.
	recover bool
	// legacy: the request speaks the 2025-11-25 generation (task_2025.go),
	// which shapes the answers; the row is the same.
	legacy bool
	// session: the 2025-11-25 session that asked for the task, which gets
	// its notifications/tasks/status from this process (notifyTaskEnd);
	// nil for a task taken over from a process that died.
	session *mcp.ServerSession
	// ttl: what the client asked for (params.task.ttl), or, for a task
	// taken over, what its row was granted; zero for the default.
	// attempt.retention grants it.
	ttl time.Duration

	mu sync.Mutex
	id string // the task's id; a takeover of a task's row adopts the row's

	stop      context.CancelCauseFunc // ends the detached handler's context, saying why
	cancelled atomic.Bool             // tasks/cancel asked
	shutdown  atomic.Bool             // the layer stops: leave the task to the next process
	// cancelVia: what asked the cancel, for the log (taskCancelOrigin).
	cancelVia atomic.Pointer[string]
	// storeFault: the attempt ended on a failure of the store, not of the
	// task: endTask gives the task back to run again (giveTaskBack).
	storeFault bool
	rpcErr     atomic.Pointer[taskError]
}

func (t *attemptTask) taskID() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.id
}

func (t *attemptTask) setID(id string) {
	t.mu.Lock()
	t.id = id
	t.mu.Unlock()
}

// newTaskID is unguessable: 26 characters of base32 from crypto/rand
// (128 bits and more). A task is found by principal and id, never by id alone.
func newTaskID() string { return "task_" + rand.Text() }

// storedParams are the tools/call params a task runs from.
type storedParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Meta      mcp.Meta        `json:"_meta,omitempty"`
}

// paramsOf keeps what running the call again needs: the name, the
// arguments and the _meta the handler may read. The client's capabilities
// and the transport's notes are the request's, not the call's.
func paramsOf(req *mcp.CallToolRequest) (string, error) {
	p := storedParams{Name: req.Params.Name, Arguments: req.Params.Arguments}
	if len(req.Params.Meta) > 0 {
		p.Meta = mcp.Meta{}
		for k, v := range req.Params.Meta {
			switch k {
			case mcp.MetaKeyClientCapabilities, mcp.MetaKeyClientInfo, "progressToken", paramskey.TaskMetaKey, paramskey.FrontMetaKey:
				continue
			}
			p.Meta[k] = v
		}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("store task params: %w", err)
	}
	return string(b), nil
}

func (p storedParams) request() *mcp.CallToolRequest {
	return &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: p.Name, Arguments: p.Arguments, Meta: p.Meta}}
}

// taskError is a failed task's error: a JSON-RPC error object.
type taskError struct {
	Code    int64  `json:"code"`
	Message string `json:"message"`
}

// taskResult is the wire form of a task: CreateTaskResult (resultType
// "task") and the answer of tasks/get (resultType "complete"), with the
// task's fields at the top level, as @modelcontextprotocol/ext-tasks 0.2.2
// checks them (not under "task", as the 2025-11-25 generation had them).
//
// go-sdk v1.8.0 knows only "complete" and "input_required": its own types
// get resultType from an unexported method (setCompleteResultType, run
// after the middleware for every 2026-07-28 request), which a type of ours
// cannot implement, so the SDK leaves this field as set here, and only
// adds serverInfo to _meta (through ResultBase's GetMeta/SetMeta). A
// receiving middleware may return any Result for tools/call: the SDK
// marshals what it gets, over stdio and over (stateless) Streamable HTTP
// alike.
type taskResult struct {
	mcp.ResultBase
	ResultType     string          `json:"resultType"`
	TaskID         string          `json:"taskId"`
	Status         string          `json:"status"`
	StatusMessage  string          `json:"statusMessage,omitempty"`
	CreatedAt      string          `json:"createdAt"`
	LastUpdatedAt  string          `json:"lastUpdatedAt"`
	TTLMs          *int64          `json:"ttlMs"`
	PollIntervalMs int64           `json:"pollIntervalMs"`
	Result         json.RawMessage `json:"result,omitempty"`
	Error          *taskError      `json:"error,omitempty"`

	// For the 2025-11-25 generation, which shapes these otherwise:
	cancelAsked bool   // tasks/cancel is recorded in the row
	stored      string // the stored result of a terminal task
	// toolError: a completed task whose result has isError, which
	// 2025-11-25 calls failed and the 2026-07-28 extension completed.
	toolError bool
	// callMeta: the _meta[MetaKeyCall] of a terminal task's result.
	callMeta map[string]any
}

// Task statuses of the 2026-07-28 extension. input_required is not used:
// no tool of the layer asks for input in a task (a handler's
// InputRequests is a multi round-trip of a plain call).
const (
	taskWorking   = "working"
	taskCompleted = "completed"
	taskFailed    = "failed"
	taskCancelled = "cancelled"
)

// taskTime is how task times go on the wire: ISO 8601 in UTC, to the
// millisecond, which JavaScript's Date parses.
func taskTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
