package sidecar

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// initialize2025 opens the client's session at 2025-11-25 and returns the
// initialize result.
func (c *rawClient) initialize2025() map[string]any {
	c.t.Helper()
	res := c.result("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "0"}})
	if err := c.conn.Write(c.ctx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)}); err != nil {
		c.t.Fatal(err)
	}
	return res
}

// call2025 is tools/call params of 2025-11-25 asking for a task
// (params.task), sent as a client does: not lifted into _meta.
func call2025(tool, key string, n int) map[string]any {
	return map[string]any{"name": tool, "arguments": map[string]any{"n": n}, "task": map[string]any{"ttl": 60000},
		"_meta": map[string]any{outbox.MetaKeyIdempotency: key}}
}

func errCode(r *jsonrpc.Response) int64 {
	if e, ok := r.Error.(*jsonrpc.Error); ok {
		return e.Code
	}
	return 0
}

// TestTask2025ThroughProxy: a 2025-11-25 session (initialize) gets that
// revision's Tasks from the proxy, as from serve: capabilities.tasks,
// execution.taskSupport, a task when the client sends params.task (with
// its fields under "task"), tasks/get, tasks/list, tasks/result waiting for
// the end and answering the tool's result, tasks/cancel refusing a
// terminal task with -32602, and -32601 for a required tool called without
// a task; the upstream runs the call once, and a retry gets the same task.
func TestTask2025ThroughProxy(t *testing.T) {
	u := newUpstream()
	c := serveTaskProxy(t, u, false, map[string]outbox.TaskOptions{
		"gate": {Mode: outbox.TasksIfSlow, After: time.Hour}, // the client decides at 2025-11-25
		"work": {Mode: outbox.TasksRequired},
	})
	init := c.initialize2025()
	caps, _ := init["capabilities"].(map[string]any)
	if b, _ := json.Marshal(caps["tasks"]); string(b) != `{"cancel":{},"list":{},"requests":{"tools":{"call":{}}}}` {
		t.Fatalf("initialize: capabilities.tasks = %s", b)
	}
	list := c.result("tools/list", map[string]any{})
	support := map[string]any{}
	for _, raw := range list["tools"].([]any) {
		tool := raw.(map[string]any)
		exec, _ := tool["execution"].(map[string]any)
		support[fmt.Sprint(tool["name"])] = exec["taskSupport"]
	}
	if support["gate"] != "optional" || support["work"] != "required" || support["block"] != nil || support["look"] != nil {
		t.Fatalf("execution.taskSupport by tool: %v", support)
	}

	if r := c.request("tools/call", map[string]any{"name": "work", "arguments": map[string]any{"n": 1}}); errCode(r) != -32601 {
		t.Fatalf("a required tool called without params.task: %v %s, want -32601", r.Error, r.Result)
	}
	created := c.result("tools/call", call2025("gate", "g1", 7))
	task, _ := created["task"].(map[string]any)
	id, _ := task["taskId"].(string)
	if !strings.HasPrefix(id, "task_") || task["status"] != "working" || task["ttl"] == nil {
		t.Fatalf("CreateTaskResult = %v", created)
	}
	if got := <-u.started; got != "7" {
		t.Fatalf("upstream started %q", got)
	}
	if again := c.result("tools/call", call2025("gate", "g1", 7)); again["task"].(map[string]any)["taskId"] != id {
		t.Fatalf("retry with the same key: %v, want task %s", again, id)
	}
	if g := c.result("tasks/get", map[string]any{"taskId": id}); g["taskId"] != id || g["status"] != "working" {
		t.Fatalf("tasks/get: %v", g)
	}
	if l := c.result("tasks/list", map[string]any{}); len(l["tasks"].([]any)) != 1 {
		t.Fatalf("tasks/list: %v", l)
	}
	// tasks/result waits for the end: released only after it was sent.
	answered := make(chan *jsonrpc.Response, 1)
	go func() { answered <- c.request("tasks/result", map[string]any{"taskId": id}) }()
	select {
	case r := <-answered:
		t.Fatalf("tasks/result answered a working task: %v %s", r.Error, r.Result)
	case <-time.After(50 * time.Millisecond): // not a wait for a result: that none came yet is the point
	}
	close(u.release)
	r := <-answered
	if r.Error != nil || !strings.Contains(string(r.Result), "gate 7 run 1") || !strings.Contains(string(r.Result), id) {
		t.Fatalf("tasks/result: %v %s, want the tool's result, related to the task", r.Error, r.Result)
	}
	if g := c.result("tasks/get", map[string]any{"taskId": id}); g["status"] != "completed" {
		t.Fatalf("tasks/get after the end: %v", g)
	}
	if r := c.request("tasks/cancel", map[string]any{"taskId": id}); errCode(r) != -32602 {
		t.Fatalf("tasks/cancel of a completed task: %v %s, want -32602", r.Error, r.Result)
	}
	// The key with other arguments: no task is made, and the client, which
	// reads only a CreateTaskResult or an error, gets an error saying so.
	if r := c.request("tools/call", call2025("gate", "g1", 8)); errCode(r) != -32602 ||
		!strings.Contains(r.Error.Error(), "nothing was executed") {
		t.Fatalf("a key conflict with params.task: %v %s, want -32602 saying nothing was executed", r.Error, r.Result)
	}
	if r := c.request("tasks/update", map[string]any{"taskId": id}); errCode(r) != -32601 {
		t.Fatalf("tasks/update at 2025-11-25: %v %s, want -32601", r.Error, r.Result)
	}
	if n := u.runs.Load(); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}
