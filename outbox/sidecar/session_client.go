package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
)

// readClient dispatches the client's messages until its connection ends.
func (s *session) readClient() error {
	for {
		msg, err := s.client.Read(s.ctx)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *jsonrpc.Request:
			if m.IsCall() {
				s.onClientCall(m)
			} else {
				s.onClientNotification(m)
			}
		case *jsonrpc.Response:
			// An answer to a request of the upstream (sampling, roots,
			// elicitation), under the id the proxy gave that request.
			s.onClientAnswer(m)
		}
	}
}

func (s *session) onClientCall(m *jsonrpc.Request) {
	s.running(m)
	switch m.Method {
	case "":
		// Written on, a request without a method loses its "method"
		// member and reaches the upstream as an answer to its own request
		// of that id, and this one is never answered.
		s.replyError(m.ID, codeInvalidRequest, "invalid request: the method is empty")
	case "initialize":
		s.mu.Lock()
		s.initParams = m.Params
		s.mu.Unlock()
		s.forward(m, s.rewriteInitialize)
	case "server/discover":
		// 2026-07-28 clients learn the capabilities here, not from
		// initialize: the layer is advertised the same way, and the Tasks
		// extension when a tool may become a task.
		s.forward(m, s.rewriteDiscover)
	case "tasks/get", "tasks/update", "tasks/cancel", "tasks/result", "tasks/list":
		if !s.p.anyTasks() {
			s.forward(m, nil) // the upstream's own tasks, if it has any
			return
		}
		// The proxy's tasks live in the database: answered here, from any
		// proxy process on it, never forwarded. tasks/result of 2025-11-25
		// waits until its task is terminal, for as long as the session
		// lasts.
		extra, _ := m.Extra.(*mcp.RequestExtra)
		ctx := s.taskContext(s.ctx, m.Params)
		s.work.Add(1)
		go func() {
			defer s.work.Done()
			res, err := s.p.layer.TaskMethod(ctx, m.Method, m.Params, extra)
			var wire *jsonrpc.Error
			switch {
			case errors.As(err, &wire):
				s.writeClient(&jsonrpc.Response{ID: m.ID, Error: wire})
			case err != nil:
				s.replyError(m.ID, codeInternal, err.Error())
			default:
				s.replyResult(m.ID, res)
			}
		}()
	case "tools/list":
		s.forward(m, s.rewriteToolsList)
	case "tools/call":
		params, err := decodeCallParams(m.Params)
		if err != nil {
			s.replyError(m.ID, codeInvalidParams, "invalid tools/call params: "+err.Error())
			return
		}
		ctx, cancel := context.WithCancel(s.ctx)
		c := &clientCall{cancel: cancel}
		s.mu.Lock()
		s.calls[m.ID] = c
		s.mu.Unlock()
		s.work.Add(1)
		if s.act != nil {
			s.act.begin()
		}
		go func() {
			defer func() {
				s.mu.Lock()
				delete(s.calls, m.ID)
				s.mu.Unlock()
				s.settled(m.ID)
				cancel()
				if s.act != nil {
					s.act.end()
				}
				s.work.Done()
			}()
			s.callTool(ctx, c, m, params)
		}()
	default:
		s.forward(m, nil)
	}
}

// clientCall is a client's tools/call that the layer runs.
type clientCall struct {
	cancel    context.CancelFunc // ends the call's context
	withheld  atomic.Bool        // the client cancelled it: no answer goes back
	answered  atomic.Bool        // its answer went to the client (the first to set it answers)
	rodeOutOf atomic.Pointer[string]
}

// clientCancelled applies the client's cancel to the call, as the layer's
// default CancelPolicy (outbox.FinishOnTimeout) does for its own tools: a
// client that stopped waiting does not stop the call, which runs on, is
// recorded, and is there for the client's retry to join or replay; any
// other cancel ends it, and the layer's forward passes the cancel on to
// the upstream itself, with the id it used there. Either way the client
// gets no answer.
func (c *clientCall) clientCancelled(reason string) {
	c.withheld.Store(true)
	if cancelnote.TimedOut(reason) {
		c.rodeOutOf.Store(&reason)
		return
	}
	c.cancel()
}

// callParamFields are the members of tools/call params the proxy reads.
var callParamFields = []string{"name", "arguments", "_meta", "inputResponses", "requestState"}

// decodeCallParams reads tools/call params as the upstream will. Go's
// decoder matches member names without regard to case, an upstream in
// another language does not: {"name":"look","Name":"charge"} would be
// recorded as a call of charge and run as one of look. Such params are
// refused.
func decodeCallParams(raw json.RawMessage) (*mcp.CallToolParamsRaw, error) {
	var params mcp.CallToolParamsRaw
	if err := json.Unmarshal(raw, &params); err != nil || params.Name == "" {
		return nil, errors.New("a name and JSON arguments are required")
	}
	var members map[string]json.RawMessage
	_ = json.Unmarshal(raw, &members)
	for k := range members {
		for _, field := range callParamFields {
			if k != field && strings.EqualFold(k, field) {
				return nil, fmt.Errorf("member %q: spell it %q", k, field)
			}
		}
	}
	return &params, nil
}

func (s *session) onClientNotification(m *jsonrpc.Request) {
	switch m.Method {
	case "":
		// Written on, it would be {"jsonrpc":"2.0"}: no JSON-RPC message
		// at all, and nothing for the upstream to act on.
		return
	case "notifications/cancelled":
		var c struct {
			RequestID any    `json:"requestId"`
			Reason    string `json:"reason"`
		}
		_ = json.Unmarshal(m.Params, &c)
		id, err := jsonrpc.MakeID(c.RequestID)
		if err != nil {
			return
		}
		s.mu.Lock()
		call, isCall := s.calls[id]
		upID, isForwarded := s.forwarded[id]
		s.mu.Unlock()
		switch {
		case isCall:
			call.clientCancelled(c.Reason)
			return
		case isForwarded:
			m = cancelNotification(upID, m.Params)
		default:
			return // answered already, or never seen
		}
	}
	s.queue(newOutgoing(m, nil))
}

// cancelNotification is notifications/cancelled for the proxy's id, with the
// client's reason.
func cancelNotification(upID int64, clientParams json.RawMessage) *jsonrpc.Request {
	var params map[string]json.RawMessage
	if json.Unmarshal(clientParams, &params) != nil || params == nil {
		params = map[string]json.RawMessage{}
	}
	params["requestId"], _ = json.Marshal(upID)
	b, _ := json.Marshal(params)
	return &jsonrpc.Request{Method: "notifications/cancelled", Params: b}
}

func (s *session) writeClient(m jsonrpc.Message) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	// Under writeMu, so that no message about a request goes out after
	// its answer, on a stream that is over. Not cancelled with the
	// session: an answer settled as it ends still goes out until the
	// connection closes (the go-sdk's stdio connection refuses a write
	// with a cancelled context).
	var ctx context.Context = context.WithoutCancel(s.ctx)
	switch m := m.(type) {
	case *jsonrpc.Response:
		s.settled(m.ID)
	case *jsonrpc.Request:
		if id, ok := s.relatedTo(m); ok {
			ctx = relatedContext{ctx, id}
		}
	}
	if err := s.client.Write(ctx, m); err != nil && s.ctx.Err() == nil {
		s.p.logger.Warn("write to client", "error", err)
	}
}

func (s *session) replyError(id jsonrpc.ID, code int64, msg string) {
	s.writeClient(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: code, Message: msg}})
}

func (s *session) replyResult(id jsonrpc.ID, res any) {
	b, err := json.Marshal(res)
	if err != nil {
		s.replyError(id, codeInternal, fmt.Sprintf("encode result: %v", err))
		return
	}
	s.writeClient(&jsonrpc.Response{ID: id, Result: b})
}
