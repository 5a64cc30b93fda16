package sidecar

import (
	"context"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// The 2025-11-25 revision's Tasks (experimental in its core), for the
// clients that speak only them: the TypeScript SDK 1.x
// (client.experimental.tasks), Python mcp 1.x (session.experimental), and
// @modelcontextprotocol/ext-tasks on a connection made with initialize.
// They are the same durable rows as the 2026-07-28 extension's; the layer
// shapes the answers (outbox/task_2025_methods.go). What the proxy adds is what a
// go-sdk server would know and the proxy has to find out: which revision
// a session speaks, and the capability and execution.taskSupport that a
// 2025-11-25 client reads before it asks for a task.

// Protocol revisions: a session negotiated in [tasks2025From, tasks2026)
// speaks the 2025-11-25 Tasks.
const (
	tasks2025From = "2025-11-25"
	tasks2026     = "2026-07-28"
)

// tasksCapability2025 is capabilities.tasks of 2025-11-25: tasks/list,
// tasks/cancel, and tools/call made a task. The TypeScript SDK 1.32's
// callToolStream asks for a task only of a server that lists
// requests.tools.call.
var tasksCapability2025 = json.RawMessage(`{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}`)

// speaks2025 reports whether a request of the session, with these params,
// speaks the 2025-11-25 Tasks: the session was negotiated at that revision
// by initialize, and the request does not carry the 2026-07-28 envelope in
// its own _meta (a stdio proxy may see both from one client, as serve does).
func (s *session) speaks2025(params json.RawMessage) bool {
	s.mu.Lock()
	v := s.protocol
	s.mu.Unlock()
	return version2025(v) && !hasEnvelope(params)
}

func version2025(v string) bool { return v >= tasks2025From && v < tasks2026 }

// hasEnvelope reports whether params._meta carries the 2026-07-28
// request's protocol version.
func hasEnvelope(params json.RawMessage) bool {
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	_, ok := p.Meta[mcp.MetaKeyProtocolVersion]
	return ok
}

// taskContext marks ctx for the layer when the request speaks the
// 2025-11-25 Tasks.
func (s *session) taskContext(ctx context.Context, params json.RawMessage) context.Context {
	if s.p.anyTasks() && s.speaks2025(params) {
		return remote.WithTasks2025(ctx)
	}
	return ctx
}

// rewriteInitialize is rewriteCapabilities for initialize: it learns the
// protocol version the upstream agreed to, which is the session's, and at
// 2025-11-25 lists capabilities.tasks when a tool of the proxy may become
// a task. An upstream that agreed to an older revision gets no Tasks:
// its client would not read them.
func (s *session) rewriteInitialize(result json.RawMessage) (json.RawMessage, error) {
	out, err := s.rewriteCapabilities(result)
	if err != nil {
		return nil, err
	}
	r, err := jsonObject(out)
	if err != nil {
		return nil, err
	}
	var version string
	_ = json.Unmarshal(r["protocolVersion"], &version)
	s.mu.Lock()
	s.protocol = version
	s.mu.Unlock()
	if !s.p.anyTasks() || !version2025(version) {
		return out, nil
	}
	caps, err := jsonObject(r["capabilities"])
	if err != nil {
		return nil, err
	}
	// The upstream's own tasks, if it has any, are hidden: tasks/* of
	// this session are answered by the proxy, from the database.
	caps["tasks"] = tasksCapability2025
	if r["capabilities"], err = json.Marshal(caps); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// withTaskSupport sets execution.taskSupport, at 2025-11-25, on the listed
// tools whose calls the proxy makes tasks; the others keep what the
// upstream said. tools[i] is named names[i] ("" if unreadable).
func (s *session) withTaskSupport(tools []json.RawMessage, names []string) error {
	if !s.p.anyTasks() || !s.speaks2025(nil) {
		return nil
	}
	for i, name := range names {
		if name == "" {
			continue
		}
		support := s.p.remoteTool(name).TaskSupport()
		if support == "" {
			continue
		}
		t, err := jsonObject(tools[i])
		if err != nil {
			continue
		}
		exec, _ := jsonObject(t["execution"])
		if exec == nil {
			exec = map[string]json.RawMessage{}
		}
		if exec["taskSupport"], err = json.Marshal(support); err != nil {
			return err
		}
		if t["execution"], err = json.Marshal(exec); err != nil {
			return err
		}
		if tools[i], err = json.Marshal(t); err != nil {
			return err
		}
	}
	return nil
}
