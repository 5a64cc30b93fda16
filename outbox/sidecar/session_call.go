package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// callTool runs a client's tools/call: the status tool here, every other
// tool through the layer and on to the upstream.
func (s *session) callTool(ctx context.Context, c *clientCall, m *jsonrpc.Request, params *mcp.CallToolParamsRaw) {
	extra, _ := m.Extra.(*mcp.RequestExtra)
	req := &mcp.CallToolRequest{Params: params, Extra: extra}
	ctx, endSpan := s.p.layer.StartToolCallSpan(ctx, req, func() remote.RequestInfo { return s.requestInfo(req) }) // trace.go
	if ctx = s.taskContext(ctx, m.Params); remote.Tasks2025(ctx) {
		liftTask(params, m.Params)
	}
	if params.Name == outbox.StatusToolName {
		res := s.p.layer.CallStatus(ctx, req)
		endSpan(res, nil)
		if c.answered.CompareAndSwap(false, true) {
			s.replyResult(m.ID, res)
		}
		return
	}
	res, err := s.p.remoteTool(params.Name).Call(ctx, req, func(ctx context.Context, claim *remote.Claim) (*mcp.CallToolResult, error) {
		// Once a recorded call has reached an upstream that does not record
		// its own outcome, the client's cancel is not passed on: the
		// upstream may have done the work already, and a cancel cannot undo
		// it. Forwarded, the cancel lets the upstream stay silent (the spec
		// allows a server not to answer a cancelled request; the TypeScript
		// SDK does not), which would turn a result that arrives a moment
		// later into an unknown call. Waiting records the answer, and a
		// retry that joined the call gets it. Only the end of the session
		// (its upstream goes with it) or CallTimeout ends the wait: an
		// upstream that never answers must not hold the call, its row and
		// the session forever, whether or not a client still waits.
		waitCtx := ctx
		if claim != nil && !s.p.opts.Cooperating {
			waitCtx = s.ctx
		}
		waitCtx = context.WithValue(waitCtx, callTimeoutKey{}, s.p.opts.CallTimeout)
		return s.forwardTraced(ctx, waitCtx, m.Params, claim, params.Name)
	})
	cr, _ := res.(*mcp.CallToolResult)
	endSpan(cr, err)
	if c.withheld.Load() && s.ctx.Err() == nil {
		if reason := c.rodeOutOf.Load(); reason != nil {
			s.p.logger.Info("client cancelled a running call; it ran to its end and is recorded, and a retry gets its outcome",
				"tool", params.Name, "reason", *reason)
		}
		return // cancelled by the client, which expects no answer
	}
	if !c.answered.CompareAndSwap(false, true) {
		return // answered at the session's end (answerEnded)
	}
	var wire *jsonrpc.Error
	switch {
	case errors.As(err, &wire):
		s.writeClient(&jsonrpc.Response{ID: m.ID, Error: wire})
	case err != nil:
		s.replyError(m.ID, codeInternal, err.Error())
	default:
		s.replyResult(m.ID, res)
	}
}

// liftTask copies a 2025-11-25 tools/call's params.task into
// params._meta, where the layer looks for it (paramskey.TaskMetaKey): the
// fronts of the mcp-outbox command lift it from the raw message before the
// proxy reads it, but a library's connection passed to Serve may not. It
// marks params as a front's (paramskey.FrontMetaKey), as mcpstdio and
// mcphttp mark a session's initialize: the layer sees no go-sdk session of
// the proxy's to find the mark on. params (decoded) gets both; raw, which
// is forwarded, is not changed.
func liftTask(params *mcp.CallToolParamsRaw, raw json.RawMessage) {
	if params.Meta == nil {
		params.Meta = mcp.Meta{}
	}
	params.Meta[paramskey.FrontMetaKey] = true
	if _, ok := params.Meta[paramskey.TaskMetaKey]; ok {
		return
	}
	var p struct {
		Task json.RawMessage `json:"task"`
	}
	if json.Unmarshal(raw, &p) != nil || len(p.Task) == 0 || string(p.Task) == "null" {
		return
	}
	params.Meta[paramskey.TaskMetaKey] = p.Task
}

// forwardCall sends a tools/call to the upstream, with the claim in _meta,
// and waits for its answer. ctx ending before the call is written withdraws
// it; once written, waitCtx ending gives up on the answer and passes a
// cancel on to the upstream. See [remote.Forward] for what its errors mean.
func (s *session) forwardCall(ctx, waitCtx context.Context, clientParams json.RawMessage, claim *remote.Claim) (*mcp.CallToolResult, error) {
	params, err := withClaim(clientParams, claim)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", remote.ErrNotForwarded, err)
	}
	p := s.newWaiter(0)
	o := newOutgoing(&jsonrpc.Request{ID: mustID(p.id), Method: "tools/call", Params: params}, p)
	s.queue(o)
	select {
	case <-o.sent:
	case <-ctx.Done():
		if o.abandon() {
			return nil, fmt.Errorf("%w: %v", remote.ErrNotForwarded, ctx.Err())
		}
	}
	if o.err != nil {
		return nil, fmt.Errorf("%w: %v", remote.ErrNotForwarded, o.err)
	}
	if err := failpoint.Inject(failpoint.ProxyAfterForward); err != nil {
		return nil, err
	}
	// The call timeout runs from the write, not from the client's request:
	// a call queued while the upstream restarts is not given up on the
	// moment it is sent.
	if d, ok := waitCtx.Value(callTimeoutKey{}).(time.Duration); ok {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeoutCause(waitCtx, d, errCallTimeout(d))
		defer cancel()
	}
	select {
	case resp, ok := <-p.reply:
		if !ok {
			return nil, errUpstreamGone
		}
		if resp.Error != nil {
			var wire *jsonrpc.Error
			if errors.As(resp.Error, &wire) {
				return nil, wire
			}
			return nil, resp.Error
		}
		var res mcp.CallToolResult
		if err := json.Unmarshal(resp.Result, &res); err != nil {
			return nil, fmt.Errorf("the tool server's answer is not a tool result: %v", err)
		}
		return &res, nil
	case <-waitCtx.Done():
		s.dropPending(p)
		// Say why: the call timeout, the session's end, or the client's
		// cancel.
		err, reason := context.Cause(waitCtx), "cancelled by the client"
		switch {
		case errors.As(err, new(errCallTimeout)):
			reason = "the proxy's call timeout passed"
		case s.ctx.Err() != nil:
			err, reason = errSessionEnded, "the proxy's session ended"
		}
		note, _ := json.Marshal(map[string]string{"reason": reason})
		s.queue(newOutgoing(cancelNotification(p.id, note), nil))
		return nil, err
	}
}

// callTimeoutKey carries, in a forward's waitCtx, how long it waits for
// the answer once written (Options.CallTimeout); a task's forward has none.
type callTimeoutKey struct{}

// withClaim adds the claim to params._meta, keeping everything else of the
// client's params as it was.
func withClaim(clientParams json.RawMessage, claim *remote.Claim) (json.RawMessage, error) {
	if claim == nil {
		return clientParams, nil
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(clientParams, &params); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(claim)
	if err != nil {
		return nil, err
	}
	return paramskey.SetMeta(params, map[string]json.RawMessage{remote.MetaKeyClaim: raw})
}
