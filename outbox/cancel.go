package outbox

import (
	"context"
	"fmt"
	"sync"

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
// call stopped by a cancel is not just "not_recorded" in the log.
func (a *attempt) logStopped(ctx context.Context) {
	var why string
	switch reason, cancelled := a.note.Cancelled(); {
	case a.note == nil:
		why = "the call's context ended: a client's cancel, or its connection closing (the transport does not tell which, nor a cancel's reason: " +
			"serve stdio through mcpstdio.NewTransport and HTTP through mcphttp.NewHandler, and a client's timeout no longer stops a call)"
	case cancelled:
		why = fmt.Sprintf("the client cancelled the call (%q), which the tool's CancelPolicy (%s) does not ride out", reason, a.tool.onCancel)
	default:
		why = "the call's context ended without a cancel: the client's connection closed, or the server is stopping"
	}
	a.layer.logger.InfoContext(ctx, "call stopped before its commit; nothing recorded, a retry runs it",
		"tool", a.tool.name, "call_id", a.uid, "why", why)
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
