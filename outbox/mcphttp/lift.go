package mcphttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/internal/tasknote"
)

// LiftParamsKey is HTTP middleware for a Streamable HTTP endpoint: it
// lifts a top-level params.idempotencyKey of tools/call requests (SEP-3182)
// in a POST body, a single message or a batch, into a _meta member of the
// layer's own, where the layer finds it: the go-sdk would drop it. It lifts
// params.task (a 2025-11-25 client asking for a task) the same way. Bodies it cannot parse pass through unchanged, for the SDK to
// reject. It also writes a task's status notification, which the layer
// cannot send through go-sdk, as itself (see writer): the layer sends one
// only to a session whose task request came through it.
//
// [NewHandler] applies it already. Wrap it around an endpoint of your own,
// such as an mcp.StreamableHTTPHandler whose getServer picks a server per
// tenant.
func LiftParamsKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w = &noteWriter{ResponseWriter: w}
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		// Read at most the SDK's own limit: a larger body is refused by
		// the SDK anyway, and must not be buffered whole here first.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes))
		r.Body.Close()
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit), http.StatusRequestEntityTooLarge)
			return
		}
		if err != nil {
			http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if out, changed := liftBody(body); changed {
			body = out
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

func liftBody(body []byte) ([]byte, bool) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return body, false
	}
	if trimmed[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil {
			return body, false
		}
		changed := false
		for i, m := range batch {
			if out, ok := liftMessage(m); ok {
				batch[i], changed = out, true
			}
		}
		if !changed {
			return body, false
		}
		out, err := json.Marshal(batch)
		return out, err == nil
	}
	return liftMessage(trimmed)
}

func liftMessage(m json.RawMessage) (json.RawMessage, bool) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(m, &msg) != nil {
		return m, false
	}
	var method string
	if json.Unmarshal(msg["method"], &method) != nil {
		return m, false
	}
	var p json.RawMessage
	changed := false
	switch method {
	case "tools/call":
		p, changed = paramskey.LiftCall(msg["params"])
	case "initialize":
		p, changed = paramskey.MarkFront(msg["params"])
	case "subscriptions/listen":
		p, changed = paramskey.LiftListen(msg["id"], msg["params"])
	}
	if !changed {
		return m, false
	}
	msg["params"] = p
	out, err := json.Marshal(msg)
	if err != nil {
		return m, false
	}
	return out, true
}

// noteWriter writes the layer's marker notifications (tasknote) as the
// notifications they stand for. go-sdk writes each Server-Sent Event in
// one Write (writeEvent in its event.go), so an event is rewritten whole.
// A task's notifications/tasks/status of a 2025-11-25 session goes out on
// the session's standalone stream (the client's GET), which is where
// go-sdk puts a notification related to no request.
type noteWriter struct {
	http.ResponseWriter
}

func (w *noteWriter) Write(p []byte) (int, error) {
	out, changed := tasknote.RewriteEvent(p)
	if !changed {
		return w.ResponseWriter.Write(p)
	}
	if _, err := w.ResponseWriter.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush and Unwrap keep http.ResponseController working through the
// wrapper: go-sdk flushes every event with it.
func (w *noteWriter) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *noteWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
