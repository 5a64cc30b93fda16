package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
)

type localKey struct{ principal, key string }

// testHookAfterCommit runs where call.after_commit is; tests set it to cancel
// a call whose outcome is already committed.
var testHookAfterCommit func(context.Context)

// attempt is one execution of a call, from its claim to its outcome. It is
// the Tx the handler sees.
type attempt struct {
	layer *Layer
	tool  *toolInfo
	id    callIdentity
	owner string
	// toolCallID is the model's id for this request's tool call
	// (toolcall.go), "" if the host sent none. Never part of the key.
	toolCallID string

	// The claimed row; zero for unrecorded calls.
	callID    int64
	uid       string
	createdAt int64

	reached  bool      // the tool handler was called (arguments passed the schema)
	unit     *unit     // the call's turn in the writer's transaction
	readConn *sql.Conn // a read-only tool's connection
	tx       handlerTx // where the handler's statements run: the unit's or the read transaction
	txErr    error     // the database failed under the handler
	// failedStmt: on PostgreSQL, the handler's first statement that the
	// server refused, which aborted the transaction; nil after discardWork.
	failedStmt *stmtError
	// returned: errors the Tx gave the handler (noteReturned).
	returned []error
	// handlerErr: the handler returned an error not marked Final, which
	// is logged and never recorded or shown to the client.
	handlerErr error
	effects    int // effects enqueued so far
	// pending: on PostgreSQL, the effects enqueued and not yet written,
	// which the outcome's statement inserts (effects_postgres.go).
	pending []pendingEffect
	// sealKey is the principal's data key as tx found it (sealed.go).
	sealKey   *sealing.DataKey
	sealKeyTx handlerTx

	completedAt int64  // unix ms of the recorded outcome
	stored      string // the result as recorded (see confirmCommit)

	outcome string // the calls_total outcome, set where it is decided
	waited  bool   // a replay after waiting for another attempt is a join, not a retry

	done chan struct{} // closed when the attempt leaves Layer.local

	// cancel: the client cancelled the call and it ran on (CancelPolicy).
	cancel riddenCancel
	// note: what the transport learned of the request's cancel; nil when
	// it could not tell (see cancelnote).
	note *cancelnote.Note

	// fenced: the handler's transaction passed the fence and, on
	// PostgreSQL, holds the call's row lock, so its lease needs no renewal.
	fenced atomic.Bool
	// claimed: the claim committed to its unit; callID is set.
	claimed atomic.Bool
	// claimedAt: when the claim was made, by the monotonic clock (see
	// enterBusy); zero until then.
	claimedAt time.Time
	// claimInTx: the claim rode in the call's transaction, uncommitted
	// (claim_tx_postgres.go); reclaimArgs insert it again after a rollback.
	claimInTx   bool
	reclaimArgs []any
	// claimExpires: the expiry the claim in the transaction wrote, which
	// its outcome keeps if it can (settledExpiry).
	claimExpires int64
	// inTx: the unit's transaction, kept alive by the renewal loop
	// while the handler runs (keepAlive); read by that loop.
	inTx atomic.Pointer[pipedTx]

	// task: the call runs as a task (task.go); nil for a plain call.
	task *attemptTask
	// joinedTask: the id of the task a retry found, whose
	// CreateTaskResult it answers with (taskJoined).
	joinedTask string
	// detached: the attempt runs on after the request's answer (a task);
	// whoever runs it leaves Layer.local at its end.
	detached bool
	// reqOutcome: the outcome of the request that created a detached
	// attempt's task, written by the request's goroutine only.
	reqOutcome string
}

func (a *attempt) recorded() bool { return a.tool.record && a.id.source != "" }

// retention is how long the call's key names it: the tool's fingerprint
// window for a derived key, the tool's key retention or else the layer's
// for a client's key.
func (a *attempt) retention() time.Duration {
	d := a.layer.opts.KeyRetention
	switch {
	case a.task != nil && a.task.opts.TTL > 0:
		d = a.task.opts.TTL
	case a.id.source == callkey.SourceFingerprint:
		d = a.tool.window
	case a.tool.keyRetention > 0:
		d = a.tool.keyRetention
	}
	if a.task != nil && a.task.ttl > 0 {
		return grantTTL(a.task.ttl, d)
	}
	return d
}

type attemptKey struct{}

func attemptFrom(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// call runs a tools/call of t. note is what the transport learned of the
// request's cancellation, nil when it could not tell (see cancelnote).
func (l *Layer) call(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest, method string, next mcp.MethodHandler, note *cancelnote.Note) (mcp.Result, error) {
	if speaks2025(req) {
		if res, err, done := l.call2025(ctx, t, req); done {
			return res, err
		}
	} else if t.tasks.Mode != TasksNever {
		switch {
		case declaresTasks(req):
			return l.callAsTask(ctx, t, req, false)
		case t.tasks.Mode == TasksRequired:
			return nil, &jsonrpc.Error{Code: CodeTaskRequired, Message: fmt.Sprintf(
				"tool %q runs only as a task: declare the extension %s in _meta[%q].extensions", t.name, ExtensionTasks, mcp.MetaKeyClientCapabilities)}
		}
	}
	var handlers mcp.Result // what the SDK's handler answered, if it ran
	res, err := l.run(ctx, t, req, nil, func(ctx context.Context, a *attempt) (mcp.Result, error) {
		ctx, release := a.handlerContext(ctx, note)
		defer release()
		res, err := next(context.WithValue(ctx, attemptKey{}, a), method, req)
		handlers = res
		return a.finish(ctx, res, err)
	})
	if cr, ok := res.(*mcp.CallToolResult); ok && err == nil && res != handlers {
		return forProtocol(req, cr), nil
	}
	return res, err
}

// run identifies and claims a call, then has exec carry it out and decide
// its outcome. An answer decided before exec (a replay, a conflict, a bad
// key, a number the tool would not get as sent) is returned without running
// it.
//
// task, when not nil, makes the call a task: its claim commits durably
// with the task's columns, and a retry that finds the task answers with it.
func (l *Layer) run(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest, task *attemptTask, exec func(context.Context, *attempt) (mcp.Result, error)) (mcp.Result, error) {
	start := time.Now()
	if t.floatArgs {
		if res := checkNumbers(req.Params.Arguments); res != nil {
			return l.refuse(ctx, t, req, start, res)
		}
	}
	// A tool that is never recorded needs no key: skip canonicalising and
	// hashing its arguments on every call.
	id, err := callIdentity{principal: t.principalOf(req)}, error(nil)
	if t.record {
		id, err = identify(req, t, t.window > 0, l.sealer)
	}
	if err != nil {
		return l.refuse(ctx, t, req, start, toolError(codeInvalidKey, "%v; nothing was executed.", err))
	}
	a := &attempt{layer: l, tool: t, id: id, uid: randomUID(), toolCallID: toolCallIDOf(req), task: task}
	defer func() {
		d := time.Since(start)
		logged := a
		if a.detached {
			// The task's goroutine owns a now: the request's event is
			// about the answer it got (reqOutcome), from a copy of what
			// no longer changes.
			logged = &attempt{layer: l, tool: t, id: a.id, uid: a.uid, toolCallID: a.toolCallID, outcome: a.reqOutcome}
		}
		metrics.Call(l.opts.Metrics, t.name, logged.outcome, d)
		l.logCall(ctx, logged, req, d)
	}()
	if !a.recorded() {
		a.task = nil // no row, so no task: a plain call
	}
	if a.recorded() {
		a.owner = l.newOwner()
		if res := l.acquire(ctx, a); res != nil {
			if res == taskJoined {
				return l.joinTask(ctx, a)
			}
			return res, nil
		}
		defer func() {
			if !a.detached {
				l.leave(a)
			}
		}()
		if err := failpoint.Inject(failpoint.CallAfterClaim); err != nil {
			a.outcome = outcomeNotRecorded
			a.abandon(ctx)
			return toolError(codeNotRecorded, "%v; nothing was executed.", err), nil
		}
	}
	return exec(ctx, a)
}

// refuse answers a call refused before its key was known (so its event
// carries no hash of the key), and counts it.
func (l *Layer) refuse(ctx context.Context, t *toolInfo, req *mcp.CallToolRequest, start time.Time, res *mcp.CallToolResult) (mcp.Result, error) {
	d := time.Since(start)
	metrics.Call(l.opts.Metrics, t.name, outcomeNotRecorded, d)
	l.logCall(ctx, &attempt{tool: t, id: callIdentity{principal: t.principalOf(req)}, outcome: outcomeNotRecorded,
		toolCallID: toolCallIDOf(req)}, req, d)
	return res, nil
}
