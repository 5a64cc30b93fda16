package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/replaynote"
)

// Remote tools run in another process: the tool server behind
// `mcp-outbox proxy`. The layer claims the call as it does for its own
// tools, then a [remote.Forward] function hands the call on, with a
// [remote.Claim] in params._meta under [remote.MetaKeyClaim]. What happens
// when the answer is lost depends on the upstream:
//
//   - A cooperating upstream records the call's outcome itself, in the
//     transaction of its own work and effects, fenced by the claim's owner
//     (schema/README.md). Its commit is the call's commit, so a call whose
//     answer was lost either committed (the row says so, and that is the
//     answer) or did not (the claim is released, and a retry runs it).
//   - Any other upstream does its work outside the call's transaction. The
//     layer records the answer it gets; when the answer is lost the call may
//     or may not have run, so it becomes unknown and is never run again by
//     itself. Its claim is marked (calls.on_lost) before it is handed on, so
//     a process finding it abandoned after a crash knows the same.
//
// None of it is outbox's API: the proxy reaches it through package
// outbox/internal/remote, whose doc says why.

// The proxy needs the layer's unexported parts (the attempt, its claim,
// the commit path), and a library user needs none of them. Package remote
// names what the proxy calls, but cannot import outbox to reach a *Layer,
// since outbox imports it; so outbox hands the way in through a function
// variable, set before any importer of outbox runs.
func init() {
	remote.Of = func(l any) remote.Layer { return remoteLayer{l.(*Layer)} }
}

// remoteLayer is the layer as the proxy sees it (remote.Layer).
type remoteLayer struct{ l *Layer }

func (r remoteLayer) Tool(name string, t *mcp.Tool, opts remote.Options) remote.Tool {
	l := r.l
	info := &toolInfo{name: name, record: true, window: l.opts.FingerprintWindow, sharedClaim: true,
		keyRetention: opts.KeyRetention, outcomeRetention: opts.OutcomeRetention}
	if t != nil {
		info.annotations = annotationsOf(t.Annotations)
		if a := t.Annotations; a != nil && (a.ReadOnlyHint || (a.IdempotentHint && !l.opts.RecordIdempotent)) {
			info.record = false
		}
		if declared, err := declaresKeyArgument(t); err == nil {
			info.keyArgument = declared
		}
		info.structuredNote = replaynote.Allowed(t.OutputSchema)
	} else {
		info.annotations = annotationsOf(nil)
		// Not listed by this process: the client may have its schema from a
		// listing by an earlier proxy process, which amended it if it could
		// (replaynote.AmendTool). Only a schema that could not be amended
		// would refuse the note, and a tool whose structured content is an
		// object rarely has one.
		info.structuredNote = true
	}
	if !opts.Cooperating {
		info.onLost = onLostUnknown
	}
	rt := &remoteTool{layer: l, info: info, cooperating: opts.Cooperating}
	if opts.Tasks.Mode != int(TasksNever) && opts.Stored != nil {
		rt.enableTasks(opts.Tasks, opts.Stored)
	}
	return rt
}

func (r remoteLayer) CheckRetention(key, outcome time.Duration) error {
	return ToolRetention{Key: key, Outcome: outcome}.check(r.l.opts.KeyRetention)
}

func (r remoteLayer) StartToolCallSpan(ctx context.Context, req *mcp.CallToolRequest, describe func() remote.RequestInfo) (_ context.Context, end func(*mcp.CallToolResult, error)) {
	l := r.l
	var meta map[string]any
	var header http.Header
	name := ""
	if req.Params != nil {
		meta, name = req.Params.Meta, req.Params.Name
	}
	if req.Extra != nil {
		header = req.Extra.Header
	}
	ctx, span := startServerSpan(ctx, l.tracer, spanName("tools/call", name), meta, header)
	if span.IsRecording() {
		span.SetAttributes(requestAttributes("tools/call", name, requestInfo(describe()))...)
		if l.opts.LogSensitive && req.Params != nil {
			span.SetAttributes(semconv.GenAIToolCallArgumentsKey.String(string(req.Params.Arguments)))
		}
	}
	return ctx, func(res *mcp.CallToolResult, err error) {
		var r mcp.Result
		if res != nil {
			r = res
		}
		endServerSpan(span, r, err, l.opts.LogSensitive)
	}
}

func (r remoteLayer) TracerProvider() trace.TracerProvider { return r.l.tracerProvider() }

func (r remoteLayer) CallStatus(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	return forProtocol(req, r.l.callStatus(ctx, req))
}

func (r remoteLayer) StatusTool() *mcp.Tool { return statusTool() }

func (r remoteLayer) Capability() map[string]any { return r.l.capability() }

// remoteTool is a tool of the upstream, as the layer treats it.
type remoteTool struct {
	layer       *Layer
	info        *toolInfo
	cooperating bool
}

func (r *remoteTool) Recorded() bool { return r.info.record }

func (r *remoteTool) Call(ctx context.Context, req *mcp.CallToolRequest, fwd remote.Forward) (mcp.Result, error) {
	if res, err, ok := r.callTask(ctx, req); ok {
		return res, err
	}
	var upstreams *mcp.CallToolResult // the upstream's answer, if it came
	res, err := r.layer.run(ctx, r.info, req, nil, func(ctx context.Context, a *attempt) (mcp.Result, error) {
		if !a.recorded() {
			res, err := fwd(ctx, nil)
			upstreams = res
			a.outcome = outcomeExecuted
			if err != nil {
				a.outcome = outcomeNotRecorded
			}
			return res, err
		}
		claim := &remote.Claim{Key: a.id.key, CallID: a.uid, RowID: a.callID, Owner: a.owner}
		res, err := fwd(ctx, claim)
		upstreams = res
		return r.finish(ctx, a, res, err)
	})
	cr, _ := res.(*mcp.CallToolResult)
	if cr != nil && cr != upstreams {
		cr = forProtocol(req, cr)
	}
	if cr == nil {
		return nil, err
	}
	return cr, err
}
func (r *remoteTool) finish(ctx context.Context, a *attempt, res *mcp.CallToolResult, err error) (mcp.Result, error) {
	var wire *jsonrpc.Error
	switch {
	case errors.As(err, &wire), errors.Is(err, remote.ErrNotForwarded):
		// The tool did not run: the upstream refused the request, or it
		// never left. A cooperating upstream cannot have committed either.
		a.outcome = outcomeNotRecorded
		a.abandon(ctx)
		if wire != nil {
			return nil, wire
		}
		return toolError(codeNotRecorded, "the tool server is not available (%v); nothing was executed, a retry will run the call.", err), nil
	case err == nil && res == nil:
		err = errors.New("empty answer")
	}

	if r.cooperating {
		// The upstream's own commit may be the call's outcome, whether or
		// not its answer arrived.
		row, rerr := a.readRow(background(ctx))
		switch {
		case rerr != nil:
			a.layer.logger.ErrorContext(ctx, "read forwarded call", "tool", a.tool.name, "error", rerr)
		case row.state == "completed" || row.state == "failed":
			return r.upstreamOutcome(a, row, res), nil
		case row.state != "in_flight" || row.owner != a.owner:
			a.outcome = outcomeInProgress
			return a.notCommitted(ErrOwnershipLost), nil
		}
		if err != nil {
			// Nothing committed. Releasing the claim also fences the
			// upstream: should it still try to commit, its update no longer
			// matches the owner, and it rolls back.
			a.outcome = outcomeNotRecorded
			a.abandon(ctx)
			return toolError(codeNotRecorded, "the tool server's answer was lost (%v) and it recorded nothing; nothing of the call committed, a retry will run it.", err), nil
		}
		// The upstream answered without recording: record its answer, as
		// for an upstream that does not cooperate. But this tool does not
		// keep the contract --cooperating promised, and a crash while it
		// runs would have a retry run it again (a stranger's plain tool
		// behind --cooperating ran twice so): say so, once per tool.
		if _, seen := r.layer.unrecordingTools.LoadOrStore(a.tool.name, struct{}{}); !seen {
			r.layer.logger.WarnContext(ctx, "a tool of a cooperating tool server answered without recording its outcome: "+
				"the proxy records it, but if the proxy or the tool server dies while it runs, a retry runs it again; "+
				"make the tool keep the contract (schema/README.md), or run the proxy without --cooperating", "tool", a.tool.name)
		}
	}

	if err != nil {
		a.markUnknown(ctx)
		a.outcome = outcomeUnknown
		return toolError(codeUnknown,
			"the tool server's answer was lost (%v). The call may or may not have run, so it is recorded as unknown and will not run again. "+
				"Ask the %s tool for its state; an operator settles it (mcp-outbox outbox resolve-call).", err, StatusToolName), nil
	}
	if res.InputRequests != nil || isRetryable(res.GetError()) {
		a.outcome = outcomeNotRecorded
		a.abandon(ctx)
		return res, nil
	}
	if cerr := a.commit(background(ctx), res); cerr != nil {
		// A commit that failed before it committed leaves its unit open,
		// holding SQLite's writer: a retry of the key, the dispatcher and
		// markUnknown below would wait behind it for ever. Nothing of the
		// unit is the upstream's work (that ran in the upstream), so it is
		// rolled back.
		if a.tx != nil {
			a.closeTx(false)
		}
		if errors.Is(cerr, ErrOwnershipLost) && a.task == nil {
			if res, ok := r.recordedByUpstream(ctx, a); ok {
				return res, nil
			}
		}
		// The upstream ran the call, but its outcome is not recorded.
		a.layer.logger.ErrorContext(ctx, "record forwarded call", "tool", a.tool.name, "call_id", a.uid, "error", cerr)
		if !errors.Is(cerr, ErrOwnershipLost) || a.task != nil {
			// A task's commit also fails its fence when tasks/cancel came
			// first; the upstream did the work all the same, so the call
			// is unknown, not cancelled. (markUnknown changes nothing if
			// the claim really went to another owner.)
			a.markUnknown(ctx)
		}
		a.outcome = outcomeUnknown
		// cerr may be the driver's: the log has it, under the call id.
		return toolError(codeUnknown, "the tool server answered, but its answer could not be recorded; the call is unknown. "+
			"Ask the %s tool for its state. The server's log has the cause under call id %s.", StatusToolName, a.uid), nil
	}
	a.outcome = outcomeExecuted
	if res.IsError {
		a.outcome = outcomeFailed
	}
	setCallMeta(res, a.id, a.uid, stateOf(res), false, a.createdAt, a.completedAt)
	return res, nil
}

// readRow reads the attempt's call row as it is now.
func (a *attempt) readRow(ctx context.Context) (callRow, error) {
	r := callRow{id: a.callID}
	err := a.layer.db.Read.QueryRowContext(ctx,
		`SELECT uid, tool, args_hash, state, owner, lease_until, result, created_at, completed_at, expires_at, on_lost
		 FROM calls WHERE id = $1`, a.callID).Scan(
		&r.uid, &r.tool, &r.argsHash, &r.state, &r.owner, &r.leaseUntil,
		&r.result, &r.createdAt, &r.completedAt, &r.expiresAt, &r.onLost)
	if errors.Is(err, sql.ErrNoRows) {
		return callRow{}, nil
	}
	if err != nil {
		return callRow{}, fmt.Errorf("read call: %w", err)
	}
	a.layer.openResult(ctx, a.layer.db.Read, a.id.principal, &r)
	return r, nil
}

// markUnknown records that the attempt's call may or may not have run.
func (a *attempt) markUnknown(ctx context.Context) {
	_, err := a.layer.db.Write.ExecContext(background(ctx), markUnknown, a.layer.nowMS(), a.callID, a.owner)
	if err != nil {
		// The claim stays in_flight with on_lost 'unknown': whoever finds
		// it abandoned marks it then.
		a.layer.logger.ErrorContext(ctx, "mark call unknown", "tool", a.tool.name, "error", err)
	}
}

// recordedByUpstream answers a call whose outcome the upstream recorded
// itself, behind a proxy not told it cooperates (no --cooperating): the
// claim in _meta reaches every upstream, and one built on the
// cooperating contract fences it and commits the outcome, so the proxy's
// own record then finds the row ended. That outcome is the call's, with
// the upstream's effects beside it. Without this, a stranger's
// cooperating Python server behind a plain proxy answered every call
// "unknown" though it had committed.
func (r *remoteTool) recordedByUpstream(ctx context.Context, a *attempt) (*mcp.CallToolResult, bool) {
	row, err := a.readRow(background(ctx))
	if err != nil || (row.state != "completed" && row.state != "failed") {
		return nil, false
	}
	if r.layer.warnedCooperating.CompareAndSwap(false, true) {
		r.layer.logger.WarnContext(ctx, "the tool server records its calls' outcomes itself: it cooperates, "+
			"but the proxy runs without --cooperating; its outcomes are answered all the same, but run the proxy "+
			"with --cooperating, so that a crash before the tool server's commit runs the call again instead of "+
			"leaving it unknown", "tool", a.tool.name)
	}
	return r.upstreamOutcome(a, row, nil), true
}

// upstreamOutcome answers the outcome the upstream committed on the call's
// row, with the upstream's answer res, or the record when res was lost
// (nil), and wakes the dispatcher for the effects it committed with it.
func (r *remoteTool) upstreamOutcome(a *attempt, row callRow, res *mcp.CallToolResult) *mcp.CallToolResult {
	a.outcome = outcomeExecuted
	if row.state == "failed" {
		a.outcome = outcomeFailed
	}
	if res == nil {
		res = recorded(row, a.id)
	}
	setCallMeta(res, a.id, a.uid, row.state, false, row.createdAt, row.completedAt.Int64)
	r.layer.enqueued()
	return res
}

// recorded is a call's recorded result, answered as its own outcome (not a
// replay) when the answer of the attempt that recorded it was lost.
func recorded(r callRow, id callIdentity) *mcp.CallToolResult {
	res, err := decodeRecorded(r)
	if err != nil {
		return unreadableResult(r, id, err)
	}
	return res
}
