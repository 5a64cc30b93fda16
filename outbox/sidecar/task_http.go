package sidecar

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxTaskBody bounds the body of a POST read to see whether it is a
// tasks/* request.
const maxTaskBody = 1 << 20

// serveTaskMethod answers a POST of a tasks/* method (tasks/get,
// tasks/update and tasks/cancel; tasks/result and tasks/list too, for a
// 2025-11-25 session) itself, and reports whether it did. go-sdk v1.8.0's
// StreamableServerTransport refuses, before the proxy's session sees it,
// every method it does not know (400 "JSON RPC not handled: \"tasks/get\"
// unsupported"): it takes custom methods only from a go-sdk server's
// AddReceivingCustomMethod, and the proxy has no server. These methods
// need no session, only the principal of the request's token (a 2026-07-28
// client sends them without one), so they are answered here, from the
// database; a request naming a session must still name one of its
// principal's.
func (h *httpSessions) serveTaskMethod(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPost || !h.p.anyTasks() {
		return false
	}
	// The transport reads the body after this: it gets what was read here,
	// then the rest.
	body, ok := peekBody(r)
	if !ok {
		return false // the transport reports it
	}
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.ID) == 0 {
		return false // a batch, a notification, or not JSON: not ours
	}
	switch req.Method {
	case "tasks/get", "tasks/update", "tasks/cancel", "tasks/result", "tasks/list":
	default:
		return false
	}
	var rawID any
	if json.Unmarshal(req.ID, &rawID) != nil {
		return false
	}
	id, err := jsonrpc.MakeID(rawID)
	if err != nil {
		return false
	}
	ctx := r.Context()
	if sid := r.Header.Get(sessionHeader); sid != "" {
		h.mu.Lock()
		s := h.sessions[sid]
		var ps *session
		if s != nil {
			ps = s.s
		}
		h.mu.Unlock()
		switch {
		case s == nil:
			http.Error(w, "session not found", http.StatusNotFound)
			return true
		case s.user != userOf(r):
			http.Error(w, "session belongs to another principal", http.StatusForbidden)
			return true
		case ps != nil:
			// A session made by initialize at 2025-11-25 speaks that
			// revision's Tasks (tasks/result, tasks/list, its shapes).
			ctx = ps.taskContext(ctx, req.Params)
		}
	}
	extra := &mcp.RequestExtra{TokenInfo: auth.TokenInfoFromContext(r.Context()), Header: r.Header}
	res, err := h.p.layer.TaskMethod(ctx, req.Method, req.Params, extra)
	resp := &jsonrpc.Response{ID: id}
	var wire *jsonrpc.Error
	switch {
	case errors.As(err, &wire):
		resp.Error = wire
	case err != nil:
		resp.Error = &jsonrpc.Error{Code: codeInternal, Message: err.Error()}
	default:
		if resp.Result, err = json.Marshal(res); err != nil {
			resp.Error = &jsonrpc.Error{Code: codeInternal, Message: err.Error()}
		}
	}
	b, err := jsonrpc.EncodeMessage(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
	return true
}
