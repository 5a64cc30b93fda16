// Package tasknote carries a notification that go-sdk cannot send, such as
// a task's notifications/tasks/status, from the outbox layer to the
// transport front (mcpstdio, mcphttp) that writes it.
//
// go-sdk v1.8.0 sends a server's notifications only through its own
// methods (ServerSession.NotifyProgress, Log, ...): there is no method to
// send another one, and a sending middleware cannot rename one either
// (defaultSendingMethodHandler looks the method up among the client's
// methods and drops one it does not know). So the layer sends a
// notifications/progress whose _meta holds the real notification under
// [MetaKey] ([Progress]), and the front replaces it with the real one as
// it is written ([Rewrite] on a connection, [RewriteEvent] on a
// Server-Sent Events stream). The layer only sends one for a request that
// came through a front: one that carried a lifted params.task, which only
// the fronts put in _meta.
package tasknote

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MetaKey is the _meta member of a notifications/progress that holds the
// notification to write instead.
const MetaKey = "io.github.mcp-outbox/notification"

const progress = "notifications/progress"

// note is the notification a marker stands for.
type note struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// Progress returns the params of the notifications/progress that a front
// writes as the notification method with params.
func Progress(method string, params any) (*mcp.ProgressNotificationParams, error) {
	b, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("tasknote: %s params: %w", method, err)
	}
	return &mcp.ProgressNotificationParams{
		Meta:          mcp.Meta{MetaKey: note{Method: method, Params: b}},
		ProgressToken: MetaKey,
	}, nil
}

// Rewrite returns the notification msg stands for when it is a marker,
// and msg itself otherwise.
func Rewrite(msg jsonrpc.Message) jsonrpc.Message {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || req.Method != progress || req.ID.IsValid() || !bytes.Contains(req.Params, []byte(MetaKey)) {
		return msg
	}
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return msg
	}
	raw, ok := p.Meta[MetaKey]
	if !ok {
		return msg
	}
	var n note
	if json.Unmarshal(raw, &n) != nil || n.Method == "" {
		return msg
	}
	return &jsonrpc.Request{Method: n.Method, Params: n.Params}
}

// RewriteEvent rewrites one Server-Sent Event, as go-sdk writes it in one
// Write ("event: message\nid: …\ndata: {…}\n\n"), whose data is a marker;
// changed is false, and p comes back, for any other bytes.
func RewriteEvent(p []byte) (out []byte, changed bool) {
	if !bytes.Contains(p, []byte(MetaKey)) {
		return p, false
	}
	lines := bytes.Split(p, []byte("\n"))
	for i, line := range lines {
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		msg, err := jsonrpc.DecodeMessage(data)
		if err != nil {
			continue
		}
		out := Rewrite(msg)
		if out == msg {
			continue
		}
		b, err := jsonrpc.EncodeMessage(out)
		if err != nil {
			continue
		}
		lines[i] = append([]byte("data: "), b...)
		changed = true
	}
	if !changed {
		return p, false
	}
	return bytes.Join(lines, []byte("\n")), true
}
