package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/replaynote"
)

// rewriteCapabilities advertises, in an initialize or server/discover
// result, the layer, and tools (the status tool is
// one even when the upstream has none). Everything else passes member by
// member as raw JSON, exactly as the upstream wrote it (through any,
// numbers beyond 2^53 would round).
func (s *session) rewriteCapabilities(result json.RawMessage) (json.RawMessage, error) {
	r, err := jsonObject(result)
	if err != nil {
		return nil, err
	}
	caps, _ := jsonObject(r["capabilities"])
	if caps == nil {
		caps = map[string]json.RawMessage{}
	}
	if tools, _ := jsonObject(caps["tools"]); tools == nil {
		caps["tools"] = json.RawMessage(`{}`)
	}
	exp, _ := jsonObject(caps["experimental"])
	if exp == nil {
		exp = map[string]json.RawMessage{}
	}
	if exp[outbox.CapabilityName], err = json.Marshal(s.p.layer.Capability()); err != nil {
		return nil, err
	}
	if caps["experimental"], err = json.Marshal(exp); err != nil {
		return nil, err
	}
	if r["capabilities"], err = json.Marshal(caps); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// rewriteDiscover is rewriteCapabilities for server/discover, which also
// lists the Tasks extension when a tool of the proxy may become a task:
// exactly {}, as @modelcontextprotocol/ext-tasks 0.2.2 reads anything else
// as "no Tasks".
func (s *session) rewriteDiscover(result json.RawMessage) (json.RawMessage, error) {
	out, err := s.rewriteCapabilities(result)
	if err != nil || !s.p.anyTasks() {
		return out, err
	}
	r, err := jsonObject(out)
	if err != nil {
		return nil, err
	}
	caps, err := jsonObject(r["capabilities"])
	if err != nil {
		return nil, err
	}
	ext, _ := jsonObject(caps["extensions"])
	if ext == nil {
		ext = map[string]json.RawMessage{}
	}
	ext[outbox.ExtensionTasks] = json.RawMessage(`{}`)
	if caps["extensions"], err = json.Marshal(ext); err != nil {
		return nil, err
	}
	if r["capabilities"], err = json.Marshal(caps); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// jsonObject decodes raw as a JSON object, keeping its members raw; null
// and anything else that is not an object is an error.
func jsonObject(raw json.RawMessage) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("not a JSON object")
	}
	return m, nil
}

// rewriteToolsList learns the tools' annotations, lists the replay note in
// the output schema of every recorded tool, and appends the status tool to
// the last page.
func (s *session) rewriteToolsList(result json.RawMessage) (json.RawMessage, error) {
	r, err := jsonObject(result)
	if err != nil {
		return nil, err
	}
	var listed []json.RawMessage
	if raw, ok := r["tools"]; ok {
		if err := json.Unmarshal(raw, &listed); err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
	}
	tools := make([]json.RawMessage, 0, len(listed)+1)
	defs := make([]*mcp.Tool, 0, len(listed))
	names := make([]string, 0, len(listed)) // of tools[i], "" if unreadable
	for _, raw := range listed {
		var t mcp.Tool
		name := ""
		if json.Unmarshal(raw, &t) == nil {
			if t.Name == outbox.StatusToolName {
				// The proxy answers calls of this name itself; listing the
				// upstream's too would give the client two tools of one name.
				continue
			}
			defs = append(defs, &t)
			name = t.Name
		}
		tools = append(tools, raw)
		names = append(names, name)
	}
	s.p.learnTools(defs)
	for i, name := range names {
		// A replay of a recorded tool carries the layer's note in its
		// structured content too (outbox.ReplayNoteProperty): the schema
		// the client validates it against must list it. The upstream's
		// own tool is not changed: it never sets the property.
		if name != "" && s.p.remoteTool(name).Recorded() {
			tools[i] = replaynote.AmendTool(tools[i])
		}
	}
	if err := s.withTaskSupport(tools, names); err != nil {
		return nil, err
	}
	var cursor string
	if raw, ok := r["nextCursor"]; ok {
		_ = json.Unmarshal(raw, &cursor)
	}
	if cursor == "" {
		status, err := json.Marshal(s.p.layer.StatusTool())
		if err != nil {
			return nil, err
		}
		tools = append(tools, status)
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return nil, err
	}
	r["tools"] = b
	return json.Marshal(r)
}
