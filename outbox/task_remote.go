package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// Tasks of remote tools: `mcp-outbox proxy --task` makes a slow call to an
// upstream that knows nothing of tasks a task of the layer. The task is its
// call's row, as for a tool of the layer's own (task_run.go); what differs
// is how it runs and how its outcome is decided:
//
//   - It runs through remote.Options.Stored, which forwards the task's
//     stored params with the claim over an upstream connection of the
//     proxy's own: the task outlives the client's request and session, and
//     the task runner, which has neither, runs a recovered task the same way.
//   - Its outcome is decided by remoteTool.finish, as for a forwarded call:
//     a cooperating upstream's own commit is the outcome; a non-cooperating
//     upstream's lost answer (the proxy died, the forward was cancelled, the
//     connection broke) makes the call unknown, which tasks/get reports as
//     failed with an error that says so. A non-cooperating task is never
//     forwarded twice: its claim says unknown if abandoned (calls.on_lost),
//     and the task runner's takeover marks it so.

// remoteTasks is the registry of remote tools that may run tasks, for the
// task runner (taskTool); the proxy's tools have no tenant.
func (l *Layer) remoteTaskTool(name string) *toolInfo {
	l.mu.Lock()
	r := l.remoteTasks
	l.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.lookup(name)
}

func (l *Layer) addRemoteTaskTool(t *toolInfo) {
	l.mu.Lock()
	if l.remoteTasks == nil {
		l.remoteTasks = &serverTools{tools: map[string]*toolInfo{}}
	}
	r := l.remoteTasks
	l.mu.Unlock()
	r.add(t)
}

// enableTasks makes r's calls tasks by opts, run through stored.
func (r *remoteTool) enableTasks(opts remote.TaskOptions, stored func(context.Context, json.RawMessage, *remote.Claim) (*mcp.CallToolResult, error)) {
	info := r.info
	info.tasks = TaskOptions{Mode: TaskMode(opts.Mode), After: opts.After, PollInterval: opts.PollInterval, TTL: opts.TTL}.withDefaults()
	info.runStored = func(ctx context.Context, a *attempt, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		params := ""
		if a.task != nil {
			params = a.task.params
		}
		if params == "" {
			p, err := paramsOf(req)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", remote.ErrNotForwarded, err)
			}
			params = p
		}
		var claim *remote.Claim
		if a.recorded() {
			claim = &remote.Claim{Key: a.id.key, CallID: a.uid, RowID: a.callID, Owner: a.owner}
		}
		a.reached = true
		res, err := stored(ctx, json.RawMessage(params), claim)
		for range maxTaskReforwards {
			if !r.reforward(ctx, a, err) {
				break
			}
			res, err = stored(ctx, json.RawMessage(params), claim)
		}
		return res, err
	}
	info.finishStored = func(ctx context.Context, a *attempt, res *mcp.CallToolResult, err error) (mcp.Result, error) {
		if !a.recorded() {
			a.outcome = outcomeExecuted
			if err != nil {
				a.outcome = outcomeNotRecorded
				return nil, err
			}
			return res, nil
		}
		out, err := r.finish(ctx, a, res, err)
		if r.cooperating && a.task != nil {
			// The upstream's commit (the call's outcome) does not know the
			// task's columns: its stored params go now, as the layer's own
			// commit drops them.
			if _, xerr := a.layer.db.Write.ExecContext(background(ctx),
				`UPDATE calls SET task_params = NULL WHERE id = $1 AND state <> 'in_flight'`, a.callID); xerr != nil {
				a.layer.logger.WarnContext(ctx, "clear a finished task's params", "tool", a.tool.name, "error", xerr)
			}
		}
		return out, err
	}
	if info.record {
		r.layer.addRemoteTaskTool(info)
	}
}

// endRemoteTaskCancelled ends a cooperating remote task cancelled, whoever
// owns it: its claim goes with it (the owner is emptied), so the upstream's fence
// (owner and state, schema/README.md) refuses a commit that comes later,
// and the upstream rolls its attempt back. An upstream that committed
// first made the task terminal, and this changes nothing. Like
// endTaskCancelled, it sets the row aside, freeing its key.
const endRemoteTaskCancelled = `
UPDATE calls SET state = 'failed', task_end = 'cancelled', result = $1, completed_at = $2,
    expires_at = $2 + coalesce(task_ttl_ms, expires_at - created_at), owner = '', lease_until = 0, task_params = NULL,
    key = ` + setAsideKey + `
WHERE id = $3 AND state = 'in_flight' AND task_cancel = 1 AND on_lost <> 'unknown'`

// cancelRemoteTask ends a task of a cooperating upstream cancelled at once
// when tasks/cancel reached a process that does not run it: another proxy
// on the database, or one that restarted since. The owner, if alive, is
// not told (it is another process); taking its claim is enough, as the
// upstream fences its commit by the owner. The upstream contract needs no
// change for it: the fence it has already refuses a call whose claim is
// gone. The owner's own wait then ends with the upstream's "claim lost"
// answer, finds the row terminal, and changes nothing.
//
// A non-cooperating upstream's task is left to its owner (its row says
// on_lost 'unknown'): its work may happen whatever the database says, so
// it must not read "cancelled"; the owner's commit fails on task_cancel
// and the call becomes unknown. A task of the layer's own tools is left to
// its owner too, whose commit refuses on task_cancel (endTask).
func (l *Layer) cancelRemoteTask(ctx context.Context, callID int64, tool string) error {
	t := l.remoteTaskTool(tool)
	if t == nil || t.runStored == nil || t.onLost == onLostUnknown {
		return nil
	}
	cancelled, err := encodeResult(toolError(codeNotRecorded, "the task was cancelled before its commit; nothing of it was kept."))
	if err != nil {
		return err
	}
	u, err := l.group.enter(background(ctx), true)
	if err != nil {
		return fmt.Errorf("cancel task: %w", err)
	}
	_, xerr := u.exec(endRemoteTaskCancelled, cancelled, l.nowMS(), callID)
	if err := errors.Join(xerr, u.leave(xerr == nil).wait()); err != nil {
		return fmt.Errorf("cancel task: %w", err)
	}
	return nil
}

// maxTaskReforwards bounds how often a cooperating task whose answer was
// lost is forwarded again within one attempt.
const maxTaskReforwards = 4

// reforward reports whether a task whose forward ended with err may be
// forwarded again at once: its answer was lost (the upstream died or its
// connection broke; the proxy restarts it), the upstream cooperates, and
// its row is still this attempt's and in flight, so nothing committed. The
// same claim goes again: should the first forward still be running in the
// upstream, the fence (owner and state) lets only one of the two commit.
// Otherwise the task would end failed for a fault a client cannot retry
// around (a retry joins the failed task).
func (r *remoteTool) reforward(ctx context.Context, a *attempt, err error) bool {
	var wire *jsonrpc.Error
	if !r.cooperating || a.task == nil || !a.recorded() || err == nil || ctx.Err() != nil ||
		errors.As(err, &wire) || errors.Is(err, remote.ErrNotForwarded) || a.task.cancelled.Load() {
		return false
	}
	row, rerr := a.readRow(background(ctx))
	if rerr != nil || row.state != "in_flight" || row.owner != a.owner {
		return false
	}
	a.layer.logger.WarnContext(ctx, "task's answer lost and nothing committed; forwarding it again",
		"tool", a.tool.name, "call_id", a.uid, "error", err)
	return true
}

// callTask runs a call of a task-enabled remote tool whose request may get
// a task; handled is false when it is a plain call. The proxy marks a
// request of a 2025-11-25 session (remote.WithTasks2025): there the client
// decides, with params.task, as for a tool of the layer's own (call2025).
func (r *remoteTool) callTask(ctx context.Context, req *mcp.CallToolRequest) (res mcp.Result, err error, handled bool) {
	t := r.info
	if t.runStored == nil || t.tasks.Mode == TasksNever || !t.record {
		return nil, nil, false
	}
	if remote.Tasks2025(ctx) {
		// The proxy's session lifts params.task itself, and marks the
		// request as a front's.
		return r.layer.call2025(ctx, t, req)
	}
	switch {
	case declaresTasks(req):
		res, err := r.layer.callAsTask(ctx, t, req, false)
		return res, err, true
	case t.tasks.Mode == TasksRequired:
		return nil, &jsonrpc.Error{Code: CodeTaskRequired, Message: fmt.Sprintf(
			"tool %q runs only as a task: declare the extension %s in _meta[%q].extensions", t.name, ExtensionTasks, mcp.MetaKeyClientCapabilities)}, true
	}
	return nil, nil, false
}

// TaskSupport is the tool's execution.taskSupport for the proxy's
// tools/list at 2025-11-25: "" unless the proxy runs its calls as tasks.
func (r *remoteTool) TaskSupport() string {
	if r.info.runStored == nil {
		return ""
	}
	return r.info.taskSupport()
}

// finishRun decides a task's outcome from what its run returned: a remote
// tool's way (remoteTool.finish), or the handler's (attempt.finish).
func (a *attempt) finishRun(ctx context.Context, res *mcp.CallToolResult, err error) (mcp.Result, error) {
	if a.tool.finishStored != nil {
		return a.tool.finishStored(ctx, a, res, err)
	}
	var r mcp.Result
	if res != nil {
		r = res
	}
	return a.finish(ctx, r, err)
}

func (r remoteLayer) TaskMethod(ctx context.Context, method string, raw json.RawMessage, extra *mcp.RequestExtra) (mcp.Result, error) {
	l := r.l
	var p taskParams
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid params: " + err.Error()}
		}
	}
	who := principalOf(&mcp.CallToolRequest{Extra: extra})
	ctx = withTaskOrigin(ctx, extra)
	if remote.Tasks2025(ctx) {
		var c listTasksParams
		if method == "tasks/list" && len(raw) > 0 {
			if err := json.Unmarshal(raw, &c); err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid params: " + err.Error()}
			}
		}
		return l.taskMethod2025(ctx, who, method, p.TaskID, c.Cursor)
	}
	switch method {
	case "tasks/get":
		return l.getTask(ctx, who, p.TaskID, true)
	case "tasks/update":
		if _, err := l.getTask(ctx, who, p.TaskID, false); err != nil {
			return nil, err
		}
		return ack(), nil
	case "tasks/cancel":
		if err := l.cancelTask(ctx, who, p.TaskID); err != nil {
			return nil, err
		}
		return ack(), nil
	case "tasks/result", "tasks/list":
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("%s is not a method of protocol version %s", method, protocolTasks2026)}
	}
	return nil, nil
}
