package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// rawClient speaks raw JSON-RPC to a proxy: go-sdk's client has no Tasks.
type rawClient struct {
	t      *testing.T
	conn   mcp.Connection
	nextID int64
	ctx    context.Context
}

// serveTaskProxy starts a proxy with tasks for the named tools in front of
// up, and a raw client of it.
func serveTaskProxy(t *testing.T, up Dialer, cooperating bool, tasks map[string]outbox.TaskOptions) *rawClient {
	t.Helper()
	p := newTestProxy(t, &outbox.Options{InFlightWait: 10 * time.Second},
		Options{Upstream: up, Cooperating: cooperating, MaxBackoff: 10 * time.Millisecond, Tasks: tasks})
	ct, _ := p.serveConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	conn, err := ct.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &rawClient{t: t, conn: conn, ctx: ctx}
}

// request sends method and returns its response, skipping notifications.
func (c *rawClient) request(method string, params any) *jsonrpc.Response {
	c.t.Helper()
	c.nextID++
	b, err := json.Marshal(params)
	if err != nil {
		c.t.Fatal(err)
	}
	id := mustID(c.nextID)
	if err := c.conn.Write(c.ctx, &jsonrpc.Request{ID: id, Method: method, Params: b}); err != nil {
		c.t.Fatal(err)
	}
	for {
		msg, err := c.conn.Read(c.ctx)
		if err != nil {
			c.t.Fatalf("%s: %v", method, err)
		}
		if r, ok := msg.(*jsonrpc.Response); ok && r.ID == id {
			return r
		}
	}
}

// result sends method and decodes its result, failing on an error.
func (c *rawClient) result(method string, params any) map[string]any {
	c.t.Helper()
	r := c.request(method, params)
	if r.Error != nil {
		c.t.Fatalf("%s: %v", method, r.Error)
	}
	var m map[string]any
	if err := json.Unmarshal(r.Result, &m); err != nil {
		c.t.Fatal(err)
	}
	return m
}

// taskCall is tools/call params of a 2026-07-28 request that declare the
// Tasks extension.
func taskCall(tool, key string, n int) map[string]any {
	return map[string]any{"name": tool, "arguments": map[string]any{"n": n}, "_meta": map[string]any{
		outbox.MetaKeyIdempotency:     key,
		mcp.MetaKeyProtocolVersion:    "2026-07-28",
		mcp.MetaKeyClientInfo:         map[string]any{"name": "raw", "version": "0"},
		mcp.MetaKeyClientCapabilities: map[string]any{"extensions": map[string]any{outbox.ExtensionTasks: map[string]any{}}},
	}}
}

// envelope is the params of a 2026-07-28 request: of tasks/* for id, or,
// with id "", of a request without params of its own.
func envelope(id string) map[string]any {
	p := map[string]any{"_meta": map[string]any{mcp.MetaKeyProtocolVersion: "2026-07-28",
		mcp.MetaKeyClientInfo: map[string]any{"name": "raw", "version": "0"}, mcp.MetaKeyClientCapabilities: map[string]any{}}}
	if id != "" {
		p["taskId"] = id
	}
	return p
}

// waitTask polls tasks/get until the task leaves working.
func (c *rawClient) waitTask(id string) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		g := c.result("tasks/get", map[string]any{"taskId": id})
		if g["status"] != "working" {
			return g
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-c.ctx.Done():
		}
	}
	c.t.Fatalf("task %s still working", id)
	return nil
}

// TestTaskThroughProxy: a task-augmented call of an upstream that knows
// nothing of tasks is answered with CreateTaskResult while the upstream
// runs it, completes with the upstream's answer, runs once, and a retry
// with the same key gets the same task.
func TestTaskThroughProxy(t *testing.T) {
	u := newUpstream()
	c := serveTaskProxy(t, u, false, map[string]outbox.TaskOptions{"gate": {Mode: outbox.TasksAlways}})

	created := c.result("tools/call", taskCall("gate", "k1", 1))
	if created["resultType"] != "task" || created["status"] != "working" {
		t.Fatalf("want a working task, got %v", created)
	}
	id, _ := created["taskId"].(string)
	if !strings.HasPrefix(id, "task_") {
		t.Fatalf("taskId %q", id)
	}
	if got := <-u.started; got != "1" {
		t.Fatalf("upstream started %q", got)
	}
	if g := c.result("tasks/get", map[string]any{"taskId": id}); g["status"] != "working" {
		t.Fatalf("tasks/get while running: %v", g)
	}
	again := c.result("tools/call", taskCall("gate", "k1", 1))
	if again["taskId"] != id {
		t.Fatalf("retry got task %v, want %s", again["taskId"], id)
	}
	close(u.release)
	done := c.waitTask(id)
	if done["status"] != "completed" {
		t.Fatalf("task ended %v", done)
	}
	res, _ := done["result"].(map[string]any)
	if b, _ := json.Marshal(res); !strings.Contains(string(b), "gate 1 run 1 cancelled=false") || res["resultType"] != "complete" {
		t.Fatalf("result %s", b)
	}
	if again := c.result("tools/call", taskCall("gate", "k1", 1)); again["taskId"] != id || again["status"] != "completed" {
		t.Fatalf("retry after the end: %v", again)
	}
	if n := u.runs.Load(); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
	if r := c.request("tasks/get", map[string]any{"taskId": "task_NOSUCH"}); r.Error == nil {
		t.Fatal("tasks/get of an unknown task answered")
	}
}

// TestTaskRequiredThroughProxy: without the extension a required-task tool
// is refused with -32021 and nothing is forwarded; an after: tool that
// finishes in time answers plainly.
func TestTaskModesThroughProxy(t *testing.T) {
	u := newUpstream()
	c := serveTaskProxy(t, u, false, map[string]outbox.TaskOptions{
		"gate": {Mode: outbox.TasksRequired},
		"work": {Mode: outbox.TasksIfSlow, After: 10 * time.Second},
	})
	r := c.request("tools/call", map[string]any{"name": "gate", "arguments": map[string]any{"n": 1}})
	if r.Error == nil || r.Error.(*jsonrpc.Error).Code != outbox.CodeTaskRequired {
		t.Fatalf("want -32021, got %v %s", r.Error, r.Result)
	}
	plain := c.result("tools/call", taskCall("work", "w1", 2))
	if plain["resultType"] == "task" || !strings.Contains(fmt.Sprint(plain["content"]), "work 2 run 1") {
		t.Fatalf("want a plain answer, got %v", plain)
	}
	if n := u.runs.Load(); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

// TestTaskCancelThroughProxy: tasks/cancel of a task the upstream runs
// passes a cancel on to it; the upstream does not record its work, so it
// may have happened, and the task ends failed with the outcome unknown,
// never cancelled.
func TestTaskCancelThroughProxy(t *testing.T) {
	u := newUpstream()
	c := serveTaskProxy(t, u, false, map[string]outbox.TaskOptions{"block": {Mode: outbox.TasksAlways}})
	created := c.result("tools/call", taskCall("block", "b1", 1))
	id, _ := created["taskId"].(string)
	<-u.started
	if ack := c.result("tasks/cancel", map[string]any{"taskId": id}); ack["resultType"] != "complete" {
		t.Fatalf("tasks/cancel: %v", ack)
	}
	select {
	case <-u.stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream never got the cancel")
	}
	done := c.waitTask(id)
	errObj, _ := done["error"].(map[string]any)
	if done["status"] != "failed" || !strings.Contains(fmt.Sprint(errObj["message"]), "unknown") {
		t.Fatalf("task ended %v", done)
	}
}

// TestTaskDiscover: server/discover lists the Tasks extension, as exactly
// {}, once a tool may become a task.
func TestTaskDiscover(t *testing.T) {
	u := newUpstream()
	c := serveTaskProxy(t, u, false, map[string]outbox.TaskOptions{"gate": {Mode: outbox.TasksAlways}})
	d := c.result("server/discover", map[string]any{"_meta": map[string]any{mcp.MetaKeyProtocolVersion: "2026-07-28",
		mcp.MetaKeyClientCapabilities: map[string]any{}, mcp.MetaKeyClientInfo: map[string]any{"name": "raw", "version": "0"}}})
	caps, _ := d["capabilities"].(map[string]any)
	ext, _ := caps["extensions"].(map[string]any)
	if b, _ := json.Marshal(ext[outbox.ExtensionTasks]); string(b) != "{}" {
		t.Fatalf("server/discover: %v", d)
	}
}

// TestHandshakeEra: a task's stored params lose the 2026-07-28 envelope
// before they go over the task session, and keep everything else.
func TestHandshakeEra(t *testing.T) {
	in := `{"name":"charge","arguments":{"n":1},"_meta":{"idempotencyKey":"k","io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"c"}}}`
	out, err := handshakeEra(json.RawMessage(in))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"_meta":{"idempotencyKey":"k"},"arguments":{"n":1},"name":"charge"}`; string(out) != want {
		t.Errorf("got %s, want %s", out, want)
	}
	plain := `{"name":"charge","arguments":{}}`
	if out, err := handshakeEra(json.RawMessage(plain)); err != nil || string(out) != plain {
		t.Errorf("params without _meta: %s %v", out, err)
	}
}
