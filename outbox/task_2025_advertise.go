package outbox

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// tasksCapability2025 is capabilities.tasks of 2025-11-25: tasks/list,
// tasks/cancel, and tools/call made a task.
var tasksCapability2025 = json.RawMessage(`{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}`)

// initializeResult2025 is an initialize answer with capabilities.tasks,
// which go-sdk v1.8.0's ServerCapabilities has no field for. The SDK does
// nothing with the answer after the middleware but marshal it.
type initializeResult2025 struct{ *mcp.InitializeResult }

func (r initializeResult2025) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.InitializeResult)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	caps := map[string]json.RawMessage{}
	if raw, ok := m["capabilities"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &caps); err != nil {
			return nil, err
		}
	}
	caps["tasks"] = tasksCapability2025
	if m["capabilities"], err = json.Marshal(caps); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// advertiseTasks2025 adds capabilities.tasks to an initialize answer at
// 2025-11-25 when a tool of the server may become a task.
func advertiseTasks2025(r *serverTools, res mcp.Result, err error) (mcp.Result, error) {
	ir, ok := res.(*mcp.InitializeResult)
	if err != nil || !ok || !version2025(ir.ProtocolVersion) || !r.anyTasks() {
		return res, err
	}
	return initializeResult2025{ir}, nil
}

// listTools2025 is a tools/list answer with execution.taskSupport on the
// tools that may become tasks: go-sdk v1.8.0's Tool has no such field.
type listTools2025 struct {
	*mcp.ListToolsResult
	support map[string]string
}

func (r listTools2025) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.ListToolsResult)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	var tools []map[string]json.RawMessage
	if err := json.Unmarshal(m["tools"], &tools); err != nil {
		return nil, err
	}
	for i, t := range r.ListToolsResult.Tools {
		if s := r.support[t.Name]; s != "" && i < len(tools) {
			tools[i]["execution"] = json.RawMessage(`{"taskSupport":"` + s + `"}`)
		}
	}
	if m["tools"], err = json.Marshal(tools); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func advertiseToolTasks2025(r *serverTools, res mcp.Result, err error) (mcp.Result, error) {
	lr, ok := res.(*mcp.ListToolsResult)
	if err != nil || !ok {
		return res, err
	}
	support := map[string]string{}
	for _, t := range lr.Tools {
		if ti := r.lookup(t.Name); ti != nil {
			if s := ti.taskSupport(); s != "" {
				support[t.Name] = s
			}
		}
	}
	if len(support) == 0 {
		return res, err
	}
	return listTools2025{lr, support}, nil
}
