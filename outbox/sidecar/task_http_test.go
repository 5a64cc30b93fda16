package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// httpTaskPeer is one principal's session with a proxy over Streamable HTTP.
type httpTaskPeer struct {
	t       *testing.T
	url     string
	token   string
	session string
	version string // the Mcp-Protocol-Version header, if set
	id      int
}

func (c *httpTaskPeer) post(method string, params any) map[string]any {
	c.t.Helper()
	c.id++
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+c.token)
	if c.session != "" {
		req.Header.Set(sessionHeader, c.session)
	}
	if c.version != "" {
		req.Header.Set("Mcp-Protocol-Version", c.version)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if id := resp.Header.Get(sessionHeader); id != "" {
		c.session = id
	}
	raw, _ := io.ReadAll(resp.Body)
	text := string(raw)
	// The first event with data: a priming event (an id, no data) may come first.
	if i := strings.Index(text, "data: {"); i >= 0 {
		text = strings.TrimSpace(strings.SplitN(text[i+len("data: "):], "\n", 2)[0])
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		c.t.Fatalf("%s: %s: %s", method, resp.Status, raw)
	}
	return m
}

// TestTaskPrincipalOverHTTP: over the proxy's Streamable HTTP (sessions
// made by initialize at 2025-11-25, whose Tasks the client asks for with
// params.task), a task is its principal's: another principal's tasks/get,
// tasks/result and tasks/cancel get -32602 "Task not found", its tasks/list
// is empty, and the owner reads it to its end.
func TestTaskPrincipalOverHTTP(t *testing.T) {
	url := newTestProxy(t, nil, Options{Upstream: newUpstream(),
		Tasks: map[string]outbox.TaskOptions{"work": {Mode: outbox.TasksAlways}}}).serveHTTP(t)
	open := func(token string) *httpTaskPeer {
		c := &httpTaskPeer{t: t, url: url, token: token}
		c.post("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
			"clientInfo": map[string]any{"name": token, "version": "0"}})
		return c
	}
	alice, bob := open("alice"), open("bob")

	created := alice.post("tools/call", call2025("work", "a-1", 5))
	res, _ := created["result"].(map[string]any)
	task, _ := res["task"].(map[string]any)
	id, _ := task["taskId"].(string)
	if id == "" {
		t.Fatalf("alice's call: %v", created)
	}
	if got := bob.post("tasks/list", map[string]any{}); fmt.Sprint(got["result"]) != "map[tasks:[]]" {
		t.Errorf("bob's tasks/list: %v, want no task", got)
	}
	for _, method := range []string{"tasks/get", "tasks/cancel", "tasks/result"} {
		got := bob.post(method, map[string]any{"taskId": id})
		e, _ := got["error"].(map[string]any)
		if e == nil || e["code"] != float64(-32602) || e["message"] != "Task not found" {
			t.Errorf("bob's %s of alice's task: %v, want -32602 Task not found", method, got)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := alice.post("tasks/get", map[string]any{"taskId": id})
		r, _ := got["result"].(map[string]any)
		if r["status"] == "completed" {
			break
		}
		if r["status"] != "working" || time.Now().After(deadline) {
			t.Fatalf("alice's tasks/get: %v", got)
		}
		time.Sleep(10 * time.Millisecond) // polling, as a client does
	}
	// Bob's identical call is his own: a task of his, not alice's.
	theirs := bob.post("tools/call", call2025("work", "a-1", 5))
	if r, _ := theirs["result"].(map[string]any); r["task"] == nil || r["task"].(map[string]any)["taskId"] == id {
		t.Errorf("bob's call with alice's key: %v", theirs)
	}
}

// TestTaskPrincipalOverStatelessHTTP: 2026-07-28 requests (no session, the
// envelope in _meta) over the proxy's Streamable HTTP, which go-sdk's
// stateful transport would refuse: server/discover lists the extension, a
// task is made and read to its end by its principal, and another
// principal, whose requests carry the same JSON-RPC ids, gets -32602 "Task
// not found" from tasks/get, tasks/update and tasks/cancel.
func TestTaskPrincipalOverStatelessHTTP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := newTestProxy(t, nil, Options{Upstream: newUpstream(),
		Tasks: map[string]outbox.TaskOptions{"work": {Mode: outbox.TasksAlways}}}).serveHTTP(t)
	alice := &httpTaskPeer{t: t, url: url, token: "alice", version: "2026-07-28"}
	bob := &httpTaskPeer{t: t, url: url, token: "bob", version: "2026-07-28"}

	d := alice.post("server/discover", envelope(""))
	dr, _ := d["result"].(map[string]any)
	caps, _ := dr["capabilities"].(map[string]any)
	if ext, _ := caps["extensions"].(map[string]any); ext == nil || ext[outbox.ExtensionTasks] == nil {
		t.Fatalf("server/discover: %v", d)
	}
	created := alice.post("tools/call", taskCall("work", "s-1", 5))
	res, _ := created["result"].(map[string]any)
	id, _ := res["taskId"].(string)
	if res["resultType"] != "task" || id == "" || alice.session != "" {
		t.Fatalf("alice's call: %v (session %q)", created, alice.session)
	}
	for _, method := range []string{"tasks/get", "tasks/cancel", "tasks/update"} {
		got := bob.post(method, envelope(id))
		e, _ := got["error"].(map[string]any)
		if e == nil || e["code"] != float64(-32602) || e["message"] != "Task not found" {
			t.Errorf("bob's %s of alice's task: %v, want -32602 Task not found", method, got)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := alice.post("tasks/get", envelope(id))
		r, _ := got["result"].(map[string]any)
		if r["status"] == "completed" {
			if b, _ := json.Marshal(r["result"]); !strings.Contains(string(b), "work 5 run 1") {
				t.Fatalf("alice's completed task: %s", b)
			}
			break
		}
		if r["status"] != "working" || time.Now().After(deadline) {
			t.Fatalf("alice's tasks/get: %v", got)
		}
		select { // the next poll, as a client makes it
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	// A plain tools/list of bob's, under the id his first request had.
	bob.id = 0
	if got := bob.post("tools/list", envelope("")); got["result"] == nil || got["id"] != float64(1) {
		t.Fatalf("bob's tools/list: %v", got)
	}
}
