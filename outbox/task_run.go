package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
)

// taskJoined is what acquire returns to a retry that asks for a task and
// found one for its call (a.joinedTask): it answers with that task.
var taskJoined = &mcp.CallToolResult{}

// callAsTask runs a call whose request declared the Tasks extension, to a
// tool that allows tasks. Its claim commits durably with the task's row
// before anything is answered; then the handler runs detached from the
// request, under the task's own context, which only tasks/cancel (or the
// layer stopping) ends. legacy: the request speaks 2025-11-25, whose client
// asked for the task (params.task) and reads only a CreateTaskResult.
func (l *Layer) callAsTask(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest, legacy bool) (mcp.Result, error) {
	params, err := paramsOf(req)
	if err != nil {
		return nil, err
	}
	task := &attemptTask{opts: t.tasks, params: params, id: newTaskID(), legacy: legacy}
	if legacy {
		task.ttl = askedTTL(req)
	}
	if legacy && asksForTask(req) {
		// params.task reached the layer lifted into _meta, which only the
		// fronts do: they also write the status notification (tasknote).
		task.session = req.Session
	}
	return l.run(ctx, t, req, task, func(ctx context.Context, a *attempt) (mcp.Result, error) {
		if a.task == nil {
			// Not recorded (no key, fingerprints off): no row, no task.
			if t.tasks.Mode == TasksRequired || legacy {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
					"a task of tool %q needs an idempotency key here (fingerprints are off); nothing was executed", t.name)}
			}
			res, err := t.runStored(ctx, a, req)
			res2, err := a.finishRun(ctx, res, err)
			if cr, ok := res2.(*mcp.CallToolResult); ok && err == nil {
				return forProtocol(req, cr), nil
			}
			return res2, err
		}
		done := l.startTask(ctx, a, req)
		if t.tasks.Mode == TasksIfSlow && !legacy {
			timer := time.NewTimer(t.tasks.After)
			defer timer.Stop()
			select {
			case res := <-done:
				a.reqOutcome = a.outcome // the task's goroutine is done with it
				if res.err == nil && res.res != nil {
					if cr, ok := res.res.(*mcp.CallToolResult); ok {
						return forProtocol(req, cr), nil
					}
				}
				return res.res, res.err
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		a.reqOutcome = outcomeTask
		return l.createdAnswer(background(ctx), a.task, a.id.principal, a.task.taskID())
	})
}

type taskEnd struct {
	res mcp.Result
	err error
}

// startTask runs a's handler detached from the request; the returned
// channel gets its answer once the outcome is decided.
func (l *Layer) startTask(ctx context.Context, a *attempt, req *mcp.CallToolRequest) <-chan taskEnd {
	a.detached = true
	tctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	a.task.stop = cancel
	id := a.task.taskID()
	done := make(chan taskEnd, 1)
	l.mu.Lock()
	if l.tasks == nil {
		l.tasks = map[string]*attempt{}
	}
	l.tasks[id] = a
	l.taskRuns.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.taskRuns.Done()
		defer func() {
			cancel(nil)
			l.mu.Lock()
			delete(l.tasks, id)
			l.mu.Unlock()
			l.leave(a)
			l.tickTasks()
			l.notifyTaskEnd(a)
		}()
		res, err := a.tool.runStored(tctx, a, req)
		var wire *jsonrpc.Error
		if errors.As(err, &wire) {
			a.task.rpcErr.Store(&taskError{Code: wire.Code, Message: wire.Message})
		}
		out, err := a.finishRun(tctx, res, err)
		done <- taskEnd{out, err}
	}()
	return done
}

// joinTask answers a retry that found its call's task.
func (l *Layer) joinTask(ctx context.Context, a *attempt) (mcp.Result, error) {
	return l.createdAnswer(ctx, a.task, a.id.principal, a.joinedTask)
}

// taskAnswer reads the task and shapes it as CreateTaskResult
// (resultType "task"): a retry gets the task's current status.
func (l *Layer) taskAnswer(ctx context.Context, principal, id, resultType string) (mcp.Result, error) {
	t, err := l.getTask(ctx, principal, id, false)
	if err != nil {
		return nil, err
	}
	t.ResultType = resultType
	return t, nil
}

// writeTask writes the task's columns into the call's row, in the claim's
// unit, so they commit with the claim. A row that is a task already (a
// takeover) keeps its id: the attempt adopts it.
func (a *attempt) writeTask(u *unit, existing string) error {
	if a.task == nil {
		return nil
	}
	if existing != "" {
		a.task.setID(existing)
		// The row keeps the ttl it was granted: the attempt's outcome
		// expires by it, not by what this attempt would be granted.
		var ttl sql.NullInt64
		if err := u.queryRow(`SELECT task_ttl_ms FROM calls WHERE id = $1`, a.callID).Scan(&ttl); err != nil {
			return fmt.Errorf("read task: %w", err)
		}
		if ttl.Valid && ttl.Int64 > 0 {
			a.task.ttl = time.Duration(ttl.Int64) * time.Millisecond
		}
		return nil
	}
	ttl := a.retention().Milliseconds()
	params, err := a.layer.sealer.SealString(context.Background(), u.querier(), callRef(a.callID, "task_params", a.id.principal), a.task.params)
	if err != nil {
		return fmt.Errorf("seal task params: %w", err)
	}
	_, err = u.exec(`UPDATE calls SET task_id = $1, task_params = $2, task_ttl_ms = $3, task_poll_ms = $4 WHERE id = $5`,
		a.task.taskID(), params, ttl, a.task.opts.PollInterval.Milliseconds(), a.callID)
	if err != nil {
		return fmt.Errorf("write task: %w", err)
	}
	return nil
}

// setAsideKey is a row's key set aside: the key and the row's random uid,
// as setAsideUnknownCall (claim.go) moves an unknown call: the key of an
// identical call no longer finds the row.
const setAsideKey = `key || '/' || uid`

// endTaskCancelled ends a task cancelled before its commit. Its row stays,
// as the cancelled task's record that tasks/get reads by task_id, but is
// set aside under a key of its own (the key and the row's uid), as an
// unknown call past its window is (claim.go): nothing of the call was
// kept, so an identical call that comes next, by fingerprint or by the
// same idempotency key, is a new call that runs, not a replay of the cancel.
const endTaskCancelled = `
UPDATE calls SET state = 'failed', task_end = 'cancelled', result = $1, completed_at = $2, expires_at = $3,
    owner = '', lease_until = 0, task_params = NULL, key = ` + setAsideKey + `
WHERE id = $4 AND owner = $5 AND state = 'in_flight' AND (task_cancel = 1 OR $6 = 1)`

// giveTaskBack: a task that ends without an outcome because the store
// failed under it (a connection reset, PostgreSQL restarting, SQLITE_BUSY
// past the deadline, a commit that failed) did nothing wrong: another run
// may well succeed, and failing it for good would make every retry of its
// key replay that failure. endTask then leaves its row in flight with its
// lease passed, so the task runner (or a retry of the key) takes it over
// and runs it again from its stored params, at most maxTaskRuns times in
// all. A statement the layer refuses, one that ended the transaction
// SQLite shares between calls, a result that cannot be encoded, or, on
// PostgreSQL, a statement of the handler's whose error it ignored (the
// error aborted the transaction, so the outcome met 25P02, or COMMIT
// rolled back: the store faults among such errors are a.txErr already,
// see wrapStmt), would fail the same way each time: those end the task
// failed.
func (a *attempt) giveTaskBack(err error) {
	if a.task == nil || errors.Is(err, ErrOwnershipLost) || errors.Is(err, ErrStatementRefused) || errors.Is(err, errTxEnded) ||
		errors.Is(err, errEncodeResult) || errors.Is(err, errOwnTxEnded) || errors.Is(err, errAbortedTx) || pgcode.Of(err) == pgInFailedTx {
		return
	}
	a.task.storeFault = true
}

// pgInFailedTx is PostgreSQL's in_failed_sql_transaction: a statement
// sent after an error aborted the transaction.
const pgInFailedTx = "25P02"

// maxTaskRuns bounds how often a task is run on store failures (see
// giveTaskBack): the row's attempts count every run, takeovers included.
const maxTaskRuns = 10

// giveBackTask passes the attempt's lease, keeping the row in flight.
const giveBackTask = `
UPDATE calls SET lease_until = 0
WHERE id = $1 AND owner = $2 AND state = 'in_flight' AND task_cancel = 0 AND attempts < $3`

const endTaskFailed = `
UPDATE calls SET state = 'failed', task_end = 'failed', task_error_code = $1, result = $2, completed_at = $3, expires_at = $4,
    owner = '', lease_until = 0, task_params = NULL
WHERE id = $5 AND owner = $6 AND state = 'in_flight'`

// endTask ends a task whose attempt committed no outcome, in u: cancelled
// if tasks/cancel asked for it (here or in the row), left in flight for the
// task runner if the layer stops or the attempt was a plain retry, given
// back to run again if the store failed under it (giveTaskBack), failed
// otherwise (a handler fault, a protocol error, too many runs: the task is
// not run again by itself). Every write names the attempt as owner, so an attempt that lost
// the call changes nothing.
func (a *attempt) endTask(ctx context.Context, u *unit) error {
	now := a.layer.nowMS()
	expires := now + a.retention().Milliseconds()
	asked := 0
	if a.task.cancelled.Load() {
		asked = 1
	}
	cancelled, _ := encodeResult(toolError(codeNotRecorded, "the task was cancelled before its commit; nothing of it was kept."))
	cancelled, err := a.layer.sealer.SealString(context.Background(), u.querier(), callRef(a.callID, "result", a.id.principal), cancelled)
	if err != nil {
		return err
	}
	r, err := u.exec(endTaskCancelled, cancelled, now, expires, a.callID, a.owner, asked)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 1 {
		a.layer.logger.InfoContext(ctx, "task cancelled before its commit; nothing kept: tasks/get answers cancelled, and an identical call runs as a new one",
			"tool", a.tool.name, "call_id", a.uid, "task_id", a.task.taskID(), "why", a.taskCancelCause())
		return nil
	}
	if a.task.shutdown.Load() || !a.detached {
		// The layer stops, or a plain retry that took the task over
		// ended without an outcome (its client cancelled it, say): the
		// row stays in flight, and the task runner (or the next process)
		// takes it over and runs it as the task it is.
		return nil
	}
	if a.task.storeFault {
		r, err := u.exec(giveBackTask, a.callID, a.owner, maxTaskRuns)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 1 {
			a.layer.logger.WarnContext(ctx, "task's run ended on a store failure; given back to run again",
				"tool", a.tool.name, "call_id", a.uid)
			return nil
		}
	}
	code, msg := int64(jsonrpc.CodeInternalError), fmt.Sprintf("the task ended without an outcome; nothing of it was kept. The server's log has the cause under call id %s.", a.uid)
	if e := a.task.rpcErr.Load(); e != nil {
		code, msg = e.Code, e.Message
	} else if a.handlerErr != nil && a.tool.showErrors && a.showable(a.handlerErr) {
		// ShowErrors: the handler's own words (a validation error) are
		// the task's failure, as they are a plain call's answer.
		msg = fmt.Sprintf("%v\n\n(Nothing of this task was kept. Call id %s.)", a.handlerErr, a.uid)
	}
	failed, _ := encodeResult(toolError(codeNotRecorded, "%s", msg))
	if failed, err = a.layer.sealer.SealString(context.Background(), u.querier(), callRef(a.callID, "result", a.id.principal), failed); err != nil {
		return err
	}
	_, err = u.exec(endTaskFailed, code, failed, now, expires, a.callID, a.owner)
	return err
}

// storedRunner makes the function that runs a tool's handler for a task
// without the SDK, as mcp.AddTool's own wrapper would: the arguments are
// validated against the input schema (defaults applied), decoded into In,
// and the handler's Out becomes the structured content and, when the
// handler set no content, its JSON text. A plain error becomes an isError
// result (invoke keeps an unmarked one from the client), a *jsonrpc.Error
// stays one. Unlike the SDK it does not validate the output against the
// output schema.
func storedRunner[In, Out any](t *mcp.Tool, invoke func(context.Context, *attempt, *mcp.CallToolRequest, In) (*mcp.CallToolResult, Out, error)) (
	func(context.Context, *attempt, *mcp.CallToolRequest) (*mcp.CallToolResult, error), error) {
	var resolved *jsonschema.Resolved
	if t.InputSchema != nil {
		b, err := json.Marshal(t.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("input schema: %w", err)
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("input schema: %w", err)
		}
		if resolved, err = s.Resolve(nil); err != nil {
			return nil, fmt.Errorf("input schema: %w", err)
		}
	}
	anyOut := reflect.TypeFor[Out]() == reflect.TypeFor[any]()
	return func(ctx context.Context, a *attempt, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		invalid := func(err error) (*mcp.CallToolResult, error) {
			// The SDK's own answer to bad arguments, an isError result,
			// is the task's outcome: a retry would fail the same way.
			a.reached = true
			var res mcp.CallToolResult
			res.SetError(fmt.Errorf("validating \"arguments\": %v", err))
			return &res, nil
		}
		args := req.Params.Arguments
		if len(args) == 0 {
			args = json.RawMessage(`{}`)
		}
		if resolved != nil {
			var m map[string]any
			if err := json.Unmarshal(args, &m); err != nil {
				return invalid(err)
			}
			if err := resolved.ApplyDefaults(&m); err != nil {
				return invalid(err)
			}
			if err := resolved.Validate(m); err != nil {
				return invalid(err)
			}
			b, err := json.Marshal(m)
			if err != nil {
				return invalid(err)
			}
			args = b
		}
		var in In
		if err := json.Unmarshal(args, &in); err != nil {
			return invalid(err)
		}
		res, out, err := invoke(ctx, a, req, in)
		if err != nil {
			var wire *jsonrpc.Error
			if errors.As(err, &wire) {
				return nil, wire
			}
			var r mcp.CallToolResult
			r.SetError(err)
			return &r, nil
		}
		if res == nil {
			res = &mcp.CallToolResult{}
		}
		if res.InputRequests == nil && !(anyOut && any(out) == nil) {
			b, err := json.Marshal(out)
			if err != nil {
				return nil, fmt.Errorf("marshal output: %w", err)
			}
			res.StructuredContent = json.RawMessage(b)
			if res.Content == nil {
				res.Content = []mcp.Content{&mcp.TextContent{Text: string(b)}}
			}
		}
		return res, nil
	}, nil
}
