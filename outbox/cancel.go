package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
)

// CancelPolicy says what a client's cancel (notifications/cancelled) does
// to a call of a tool once its handler runs. Before that, while a call
// waits for the database or for another attempt of the same call, a cancel
// always ends it: nothing has run. After the commit nothing can undo it.
//
// The layer learns a cancel's reason from the transports of this module
// (mcpstdio.NewTransport, mcphttp.NewHandler, the proxy); the go-sdk alone
// drops it. Through any other transport every cancel stops the call, as
// under StopOnCancel. Whatever the policy, the cancelled request gets no
// answer over stdio or through the proxy, as the spec asks of a receiver.
//
// No policy can act on a cancel that never reaches the call: over
// stateless Streamable HTTP (2026-07-28) a request belongs to no session,
// so a client's notifications/cancelled, in a POST of its own (the go-sdk
// client sends one), names an id the server cannot tie to the call, and
// the go-sdk does not end a call whose POST the client aborted. There a
// call always runs to its end, even under StopOnCancel.
//
// The handler's context is not cancelled by a cancel the call rides out;
// a cancel that stops the call cancels it, with context.Canceled whatever
// the client's reason.
type CancelPolicy int

const (
	// FinishOnTimeout, the default, lets a call run to its end when its
	// cancel says that the client stopped waiting (a timeout: see
	// "Cancellation" in the package doc for the reasons clients send): the
	// call commits and is recorded, and the client's retry joins it while
	// it runs, or replays its outcome. Any other cancel stops the call:
	// its work rolls back and nothing is recorded.
	//
	// A timeout is no decision about the call. Claude Code cancels at its
	// tool timeout over stdio, and its model retries under the same
	// timeout: if every timeout rolled the call back, a tool slower than
	// the timeout could never succeed, where over HTTP, which sends no
	// cancel, it does.
	FinishOnTimeout CancelPolicy = iota
	// StopOnCancel stops the call on every cancel before its commit,
	// timeouts included: for a tool whose late result is worth nothing.
	StopOnCancel
	// FinishOnCancel lets the call run to its end whatever the cancel
	// says: the cancel only withholds the answer, and a retry gets the
	// outcome.
	FinishOnCancel
)

func (p CancelPolicy) String() string {
	switch p {
	case FinishOnTimeout:
		return "FinishOnTimeout"
	case StopOnCancel:
		return "StopOnCancel"
	case FinishOnCancel:
		return "FinishOnCancel"
	}
	return "CancelPolicy(invalid)"
}

func (p CancelPolicy) valid() bool { return p >= FinishOnTimeout && p <= FinishOnCancel }

// ridesOut reports whether the call goes on after a cancel with reason.
func (p CancelPolicy) ridesOut(reason string) bool {
	switch p {
	case FinishOnCancel:
		return true
	case FinishOnTimeout:
		return cancelnote.TimedOut(reason)
	}
	return false
}

// logStopped says why a call's context ended before its commit, so that a
// call stopped by a cancel is not just "not_recorded" in the log. What
// stopped it is said only as far as it is known: a task's own context ends
// only by tasks/cancel or the layer stopping, a request's by a cancel the
// transport noted, or by the connection, whose cause go-sdk gives the
// context (the read error, say EOF, when the peer went away).
func (a *attempt) logStopped(ctx context.Context) {
	if a.detached {
		// A task's run: endTask logs a cancelled task's end, with what
		// cancelled it (taskCancelCause).
		if a.task.shutdown.Load() {
			a.layer.logger.InfoContext(ctx, "task stopped before its commit by the layer stopping; nothing recorded, it stays in flight and runs again at the next start",
				"tool", a.tool.name, "call_id", a.uid, "task_id", a.task.taskID())
		}
		return
	}
	var why string
	cause := context.Cause(ctx)
	switch reason, cancelled := a.note.Cancelled(); {
	case cancelled:
		why = fmt.Sprintf("the client's notifications/cancelled (reason %q), which the tool's CancelPolicy (%s) does not ride out", reason, a.tool.onCancel)
	case errors.Is(cause, io.EOF):
		why = "the client's connection closed (EOF) while the call ran, without a cancel"
	case cause != nil && !errors.Is(cause, context.Canceled):
		why = fmt.Sprintf("the request ended without a cancel: %v (the client's connection breaking, or the server stopping)", cause)
	case a.note == nil:
		why = "the request's context was cancelled: a client's notifications/cancelled, its connection closing, or the server stopping; " +
			"this transport does not report which, nor a cancel's reason (serve stdio through mcpstdio.NewTransport and HTTP through " +
			"mcphttp.NewHandler: then a client's timeout no longer stops a call)"
	default:
		why = "the request ended without a cancel: the client's connection closed, or the server is stopping"
	}
	a.layer.logger.InfoContext(ctx, "call stopped before its commit; nothing recorded, a retry runs it",
		"tool", a.tool.name, "call_id", a.uid, "why", why)
}

// taskOriginKey carries, from the layer's middleware to cancelTask, how a
// tasks/* request reached the layer: the log of a cancel names it.
type taskOriginKey struct{}

// withTaskOrigin notes in ctx how a tasks/* request with extra came. The
// go-sdk tells no transport: only its HTTP transports set Extra.Header.
func withTaskOrigin(ctx context.Context, extra *mcp.RequestExtra) context.Context {
	via := "stdio (or another pipe)"
	if extra != nil && extra.Header != nil {
		via = "Streamable HTTP"
	}
	return context.WithValue(ctx, taskOriginKey{}, via)
}

// taskCancelOrigin is what cancelled a task, for its log, as cancelTask
// learns it from ctx.
func taskCancelOrigin(ctx context.Context) string {
	if via, ok := ctx.Value(taskOriginKey{}).(string); ok {
		return "tasks/cancel over " + via
	}
	return "tasks/cancel"
}

// taskCancelCause says what cancelled a's task, which ends cancelled.
func (a *attempt) taskCancelCause() string {
	if via := a.task.cancelVia.Load(); via != nil {
		return *via
	}
	// The row's task_cancel: written by a process that does not run the
	// task (cancelTask).
	return "tasks/cancel received by another process or replica, recorded in the task's row"
}

// riddenCancel is a client's cancel that a running call rode out.
type riddenCancel struct {
	mu     sync.Mutex
	reason string
	ridden bool
}

func (r *riddenCancel) set(reason string) {
	r.mu.Lock()
	r.reason, r.ridden = reason, true
	r.mu.Unlock()
}

// get returns the reason of the cancel the call rode out, if it did.
func (r *riddenCancel) get() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reason, r.ridden
}

// handlerContext is the context a's handler runs under: ctx, except that a
// client's cancel which a's tool rides out does not reach it. The end of
// ctx for any other reason (another cancel, the connection closing) still
// does. release frees what it holds once the call's outcome is decided.
func (a *attempt) handlerContext(ctx context.Context, note *cancelnote.Note) (hctx context.Context, release func()) {
	a.note = note
	if note == nil || a.tool.onCancel == StopOnCancel {
		return ctx, func() {}
	}
	hctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	// The transport notes a cancel before the SDK sees it, and the SDK
	// ends ctx only then: when ctx is done, the note already says why.
	stop := context.AfterFunc(ctx, func() {
		if reason, ok := note.Cancelled(); ok && a.tool.onCancel.ridesOut(reason) {
			a.cancel.set(reason)
			a.layer.logger.InfoContext(ctx, "client cancelled a running call; it runs to its end and is recorded, and a retry gets its outcome",
				"tool", a.tool.name, "call_id", a.uid, "reason", reason, "policy", a.tool.onCancel.String())
			return
		}
		cancel(context.Cause(ctx))
	})
	return hctx, func() {
		stop()
		cancel(nil)
	}
}
