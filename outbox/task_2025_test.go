package outbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// The 2025-11-25 generation of Tasks, as the TypeScript SDK 1.x and Python
// mcp 1.x speak it: initialize at 2025-11-25, then params.task on
// tools/call, and tasks/get, tasks/result, tasks/list, tasks/cancel.

// peer2025 is a 2025-11-25 session: over stdio (a taskPeer whose requests
// carry no 2026 _meta) or over stateful Streamable HTTP (url, with the
// session's id).
type peer2025 struct {
	t     testing.TB
	stdio *taskPeer
	url   string
	token string
	sid   string
	next  atomic.Int64
}

func stdio2025(t testing.TB, s *mcp.Server) *peer2025 {
	t.Helper()
	p := &peer2025{t: t, stdio: stdioPeer(t, s)}
	p.initialize()
	return p
}

func http2025(t *testing.T, url, token string) *peer2025 {
	t.Helper()
	p := &peer2025{t: t, url: url, token: token}
	p.initialize()
	return p
}

func (p *peer2025) initialize() map[string]any {
	p.t.Helper()
	r := result(p.t, p.request("initialize", map[string]any{
		"protocolVersion": "2025-11-25", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "0"}}))
	p.notify("notifications/initialized")
	return r
}

func (p *peer2025) notify(method string) {
	p.t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","method":%q}`, method)
	if p.stdio != nil {
		if _, err := p.stdio.w.Write([]byte(body + "\n")); err != nil {
			p.t.Fatal(err)
		}
		return
	}
	resp := p.post(body)
	resp.Body.Close()
}

func (p *peer2025) post(body string) *http.Response {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+p.token)
	if p.sid != "" {
		req.Header.Set("Mcp-Session-Id", p.sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		p.sid = sid
	}
	return resp
}

func (p *peer2025) request(method string, params map[string]any) map[string]any {
	p.t.Helper()
	if p.stdio != nil {
		if _, ok := params["_meta"]; !ok {
			params["_meta"] = map[string]any{} // no 2026 _meta: the session's version rules
		}
		return p.stdio.request(method, params)
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": p.next.Add(1), "method": method, "params": params})
	return readResponse(p.t, method, p.post(string(body)))
}

// charge calls charge; task sends params.task (as the SDKs do, at the top of
// params), key _meta.idempotencyKey.
func (p *peer2025) charge(task bool, key string, amount int) map[string]any {
	params := map[string]any{"name": "charge", "arguments": map[string]any{"amount": amount}}
	if key != "" {
		params["_meta"] = map[string]any{"idempotencyKey": key}
	}
	if task {
		params["task"] = map[string]any{"ttl": 60000}
	}
	return p.request("tools/call", params)
}

func (p *peer2025) task(method, id string) map[string]any {
	// The TypeScript SDK sends params.task on tasks/* too: it is ignored.
	return p.request(method, map[string]any{"taskId": id, "task": map[string]any{}})
}

// created checks a 2025-11-25 CreateTaskResult and returns its task.
func created2025(t *testing.T, resp map[string]any) map[string]any {
	t.Helper()
	r := result(t, resp)
	task, ok := r["task"].(map[string]any)
	if !ok || r["resultType"] != nil || r["taskId"] != nil {
		t.Fatalf("CreateTaskResult = %v, want the task under \"task\" and nothing at the top", r)
	}
	for _, f := range []string{"taskId", "status", "createdAt", "lastUpdatedAt", "ttl", "pollInterval"} {
		if _, ok := task[f]; !ok {
			t.Errorf("task lacks %s: %v", f, task)
		}
	}
	for _, f := range []string{"ttlMs", "pollIntervalMs", "resultType"} {
		if _, ok := task[f]; ok {
			t.Errorf("task has the 2026 field %s: %v", f, task)
		}
	}
	return task
}

func TestTask2025_InitializeAndToolsList(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	for _, tc := range []struct {
		mode outbox.TaskMode
		want string
	}{{outbox.TasksIfSlow, "optional"}, {outbox.TasksAlways, "optional"}, {outbox.TasksRequired, "required"}} {
		b := taskSetup(t, db, tc.mode, nil)
		p := &peer2025{t: t, stdio: stdioPeer(t, b.server)}
		caps := p.initialize()["capabilities"].(map[string]any)
		if got, _ := json.Marshal(caps["tasks"]); string(got) != `{"cancel":{},"list":{},"requests":{"tools":{"call":{}}}}` {
			t.Errorf("capabilities.tasks = %s", got)
		}
		for _, tool := range result(t, p.request("tools/list", map[string]any{}))["tools"].([]any) {
			tool := tool.(map[string]any)
			ex, _ := tool["execution"].(map[string]any)
			switch {
			case tool["name"] == "charge" && (ex == nil || ex["taskSupport"] != tc.want):
				t.Errorf("mode %v: charge execution = %v, want taskSupport %s", tc.mode, tool["execution"], tc.want)
			case tool["name"] != "charge" && ex != nil:
				t.Errorf("%v: execution = %v, want none (forbidden)", tool["name"], ex)
			}
		}
	}
	plain := setupOn(t, db, nil, nil)
	p := &peer2025{t: t, stdio: stdioPeer(t, plain.server)}
	if caps := p.initialize()["capabilities"].(map[string]any); caps["tasks"] != nil {
		t.Errorf("a server without tasks advertises them: %v", caps)
	}
}

func TestTask2025_CreateResultGetList(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	// TasksIfSlow: the client asked for a task, so it gets one at once,
	// however fast the call would be.
	b := taskSetup(t, db, outbox.TasksIfSlow, &ledger.Options{Gate: g.hold})
	p := stdio2025(t, b.server)
	task := created2025(t, p.charge(true, "t25-1", 700))
	id, _ := task["taskId"].(string)
	// charge asks for a ttl of 60 s, which it gets (TestTask2025_TTL).
	if task["status"] != "working" || task["pollInterval"] != float64(20) || task["ttl"] != float64(60000) {
		t.Fatalf("task = %v", task)
	}
	g.waitReached(t)
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE task_id = $1 AND state = 'in_flight'`, id); n != 1 {
		t.Fatalf("task row before the answer: %d rows", n)
	}
	if r := result(t, p.task("tasks/get", id)); r["status"] != "working" || r["taskId"] != id || r["resultType"] != nil {
		t.Fatalf("tasks/get while working = %v", r)
	}
	// tasks/result blocks until the task ends; a second layer on the same
	// database answers it from the row.
	second := stdio2025(t, taskSetup(t, db, outbox.TasksIfSlow, nil).server)
	got := make(chan map[string]any, 1)
	go func() { got <- second.task("tasks/result", id) }()
	select {
	case r := <-got:
		t.Fatalf("tasks/result answered while the task works: %v", r)
	case <-time.After(100 * time.Millisecond): // a bound on an answer that must not come
	}
	close(g.release)
	var res map[string]any
	select {
	case r := <-got:
		res = result(t, r)
	case <-time.After(10 * time.Second):
		t.Fatal("tasks/result did not answer once the task ended")
	}
	if sc, _ := res["structuredContent"].(map[string]any); sc["amount"] != float64(700) || res["isError"] == true {
		t.Fatalf("tasks/result = %v", res)
	}
	if rel, _ := res["_meta"].(map[string]any)["io.modelcontextprotocol/related-task"].(map[string]any); rel["taskId"] != id {
		t.Errorf("tasks/result _meta = %v, want the related task", res["_meta"])
	}
	// And the layer's outcome, as every recorded result has it.
	call, _ := res["_meta"].(map[string]any)[outbox.MetaKeyCall].(map[string]any)
	if call["key"] != "t25-1" || call["keySource"] != "meta" || call["state"] != "completed" || call["replayed"] != false ||
		!strings.HasPrefix(fmt.Sprint(call["callId"]), "call_") || call["completedAt"] == nil {
		t.Errorf("tasks/result _meta[%s] = %v", outbox.MetaKeyCall, call)
	}
	if r := result(t, p.task("tasks/get", id)); r["status"] != "completed" {
		t.Errorf("tasks/get = %v", r)
	}
	list := result(t, p.request("tasks/list", map[string]any{}))
	if tasks := list["tasks"].([]any); len(tasks) != 1 || tasks[0].(map[string]any)["taskId"] != id || list["nextCursor"] != nil {
		t.Errorf("tasks/list = %v", list)
	}
	// The retry of the same call gets the same task, completed.
	if again := created2025(t, p.charge(true, "t25-1", 700)); again["taskId"] != id || again["status"] != "completed" {
		t.Errorf("retry = %v, want task %s completed", again, id)
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	// Terminal: cancel refuses.
	if code, _ := rpcError(t, p.task("tasks/cancel", id)); code != -32602 {
		t.Errorf("tasks/cancel of a completed task: code %v, want -32602", code)
	}
}

func TestTask2025_Cancel(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	b := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	p := stdio2025(t, b.server)
	id := created2025(t, p.charge(true, "t25-cancel", 9))["taskId"].(string)
	g.waitReached(t)
	r := result(t, p.task("tasks/cancel", id))
	if r["status"] != "cancelled" || r["taskId"] != id {
		t.Fatalf("tasks/cancel = %v, want the task cancelled", r)
	}
	if r := result(t, p.task("tasks/get", id)); r["status"] != "cancelled" {
		t.Errorf("tasks/get after cancel = %v", r)
	}
	// A cancelled request has no answer to give back: a clear -32602 about
	// the task, not the -32603 of a server fault.
	if code, msg := rpcError(t, p.task("tasks/result", id)); code != -32602 || !strings.Contains(msg, "cancelled before its commit") {
		t.Errorf("tasks/result of a cancelled task: %v %s, want -32602 saying it was cancelled", code, msg)
	}
	if code, _ := rpcError(t, p.task("tasks/cancel", id)); code != -32602 {
		t.Errorf("second tasks/cancel: code %v, want -32602", code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for count(t, db.Read, `SELECT count(*) FROM calls WHERE task_id = $1 AND task_end = 'cancelled'`, id) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the cancelled task's row did not end cancelled")
		}
		time.Sleep(10 * time.Millisecond) // polling the row, as a client polls tasks/get
	}
	if got := charges(t, b); got != 0 {
		t.Errorf("charges = %d after a cancel, want 0", got)
	}
	// The key names no call any more: the cancelled task's row is set
	// aside, and a retry runs the call (TestTask2025_CancelThenAskAgain).
	st := result(t, p.request("tools/call", map[string]any{"name": outbox.StatusToolName, "arguments": map[string]any{"key": "t25-cancel"}}))
	sc, _ := st["structuredContent"].(map[string]any)
	if msg := fmt.Sprint(sc["message"]); sc["state"] != "not_found" || !strings.Contains(msg, "cancelled before its commit") ||
		!strings.Contains(msg, "A retry would run it") {
		t.Errorf("call_status of a cancelled task's key = %v", sc)
	}
}

// TestTask2025_CancelThenAskAgain: over 2025-11-25, on stdio and on a
// stateful Streamable HTTP session, a task cancelled before its commit
// stays cancelled to tasks/get, and the same call asked again, by its key
// or by its fingerprint, runs the handler a second time: tasks/result
// gives the new run's result.
func TestTask2025_CancelThenAskAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, key string
		http      bool
	}{
		{"KeyStdio", "t25-again", false},
		{"FingerprintStdio", "", false},
		{"KeyHTTP", "t25-again", true},
		{"FingerprintHTTP", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			g := newGate()
			b := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
			var p *peer2025
			if tc.http {
				p = http2025(t, httpTaskServer(t, b.server), "alice")
			} else {
				p = stdio2025(t, b.server)
			}
			id := created2025(t, p.charge(true, tc.key, 17))["taskId"].(string)
			g.waitReached(t)
			if r := result(t, p.task("tasks/cancel", id)); r["status"] != "cancelled" {
				t.Fatalf("tasks/cancel = %v", r)
			}
			close(g.release)
			next := created2025(t, p.charge(true, tc.key, 17))["taskId"].(string)
			if next == id {
				t.Fatalf("the same call after the cancel got the cancelled task %s back", id)
			}
			res := result(t, p.task("tasks/result", next))
			if sc, _ := res["structuredContent"].(map[string]any); res["isError"] == true || sc["amount"] != float64(17) {
				t.Fatalf("tasks/result of the call asked again = %v", res)
			}
			if n := len(g.reached); n != 1 { // the first run took its token in waitReached
				t.Errorf("the handler ran %d more times after the cancel, want 1", n)
			}
			if got := charges(t, b); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
			if r := result(t, p.task("tasks/get", id)); r["status"] != "cancelled" {
				t.Errorf("tasks/get of the cancelled task = %v", r)
			}
		})
	}
}

func TestTask2025_LostHandleWithoutKey(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	b := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	first := created2025(t, stdio2025(t, b.server).charge(true, "", 31))
	g.waitReached(t)
	// Another session, the same tool and arguments within the fingerprint
	// window: the same task, not a second one.
	retry := created2025(t, stdio2025(t, b.server).charge(true, "", 31))
	if retry["taskId"] != first["taskId"] {
		t.Fatalf("retry got task %v, want %v", retry["taskId"], first["taskId"])
	}
	close(g.release)
	if res := result(t, stdio2025(t, b.server).task("tasks/result", first["taskId"].(string))); res["isError"] == true {
		t.Fatalf("tasks/result = %v", res)
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

func TestTask2025_Refusals(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	req := stdio2025(t, taskSetup(t, db, outbox.TasksRequired, nil).server)
	if code, msg := rpcError(t, req.charge(false, "t25-req", 5)); code != -32601 {
		t.Errorf("taskSupport required, no params.task: %v %s, want -32601", code, msg)
	}
	never := stdio2025(t, setupOn(t, db, nil, nil).server)
	if code, msg := rpcError(t, never.charge(true, "t25-never", 5)); code != -32601 {
		t.Errorf("taskSupport forbidden, params.task: %v %s, want -32601", code, msg)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE key IN ('t25-req', 't25-never')`); n != 0 {
		t.Errorf("a refused call was recorded")
	}
	// Without params.task an optional tool answers plainly.
	plain := stdio2025(t, taskSetup(t, db, outbox.TasksAlways, nil).server)
	if r := result(t, plain.charge(false, "t25-plain", 5)); r["task"] != nil || r["isError"] == true {
		t.Errorf("plain call = %v", r)
	}
	// What the layer answers instead of a task is a JSON-RPC error: the
	// client, having sent params.task, takes only a CreateTaskResult or an
	// error (the TypeScript SDK failed a CallToolResult with its own -32603).
	for _, tc := range []struct {
		name, key string
		amount    int
		code      string
	}{
		{"key conflict", "t25-plain", 6, "key_conflict"},
		{"invalid key", "t25\x01bad", 5, "invalid_key"},
		{"replay of a call made without a task", "t25-plain", 5, "not_a_task"},
	} {
		resp := plain.charge(true, tc.key, tc.amount)
		e, ok := resp["error"].(map[string]any)
		if !ok {
			t.Errorf("%s with params.task: %v, want a JSON-RPC error", tc.name, resp)
			continue
		}
		data, _ := e["data"].(map[string]any)
		if e["code"] != float64(-32602) || data["code"] != tc.code || !strings.Contains(fmt.Sprint(e["message"]), "nothing was executed") {
			t.Errorf("%s with params.task: error %v, want -32602 with data.code %s saying nothing was executed", tc.name, e, tc.code)
		}
		if _, ok := data["result"].(map[string]any); !ok {
			t.Errorf("%s: data = %v, want the plain call's result under result", tc.name, data)
		}
	}
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE key LIKE 't25%' AND task_id IS NOT NULL`); n != 0 {
		t.Errorf("a refused task request made %d tasks", n)
	}
	// tasks/update is the 2026 generation's.
	if code, _ := rpcError(t, plain.task("tasks/update", "task_x")); code != -32601 {
		t.Errorf("tasks/update at 2025-11-25: code %v, want -32601", code)
	}
}

func TestTask2025_ListPages(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	p := stdio2025(t, b.server)
	const n = 52 // a page holds 50
	want := map[string]bool{}
	for i := range n {
		want[created2025(t, p.charge(true, fmt.Sprintf("t25-list-%d", i), i+1))["taskId"].(string)] = true
	}
	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		page := result(t, p.request("tasks/list", params))
		pages++
		for _, task := range page["tasks"].([]any) {
			id := task.(map[string]any)["taskId"].(string)
			if seen[id] || !want[id] {
				t.Fatalf("tasks/list: %s repeated or not ours", id)
			}
			seen[id] = true
		}
		next, _ := page["nextCursor"].(string)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(seen) != n || pages != 2 {
		t.Errorf("tasks/list: %d tasks in %d pages, want %d in 2", len(seen), pages, n)
	}
	if code, _ := rpcError(t, p.request("tasks/list", map[string]any{"cursor": "nope"})); code != -32602 {
		t.Errorf("bad cursor: code %v, want -32602", code)
	}
}

// Over stateful Streamable HTTP, by principal: another principal's task is
// not found by any method, and not listed.
func TestTask2025_HTTPOtherPrincipal(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	b := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	url := httpTaskServer(t, b.server)
	alice := http2025(t, url, "alice")
	if alice.sid == "" {
		t.Fatal("no session id: not a stateful 2025-11-25 session")
	}
	id := created2025(t, alice.charge(true, "t25-http", 12))["taskId"].(string)
	g.waitReached(t)
	bob := http2025(t, url, "bob")
	for _, m := range []string{"tasks/get", "tasks/result", "tasks/cancel"} {
		if code, msg := rpcError(t, bob.task(m, id)); code != -32602 || msg != "Task not found" {
			t.Errorf("%s by another principal: %v %q", m, code, msg)
		}
	}
	if tasks := result(t, bob.request("tasks/list", map[string]any{}))["tasks"].([]any); len(tasks) != 0 {
		t.Errorf("another principal lists %v", tasks)
	}
	close(g.release)
	if res := result(t, alice.task("tasks/result", id)); res["isError"] == true {
		t.Fatalf("tasks/result = %v", res)
	}
	if tasks := result(t, alice.request("tasks/list", map[string]any{}))["tasks"].([]any); len(tasks) != 1 {
		t.Errorf("owner lists %v", tasks)
	}
}

// Both generations on one server: a request's own 2026-07-28 _meta decides
// its generation, a 2025-11-25 session its own; the task is the same row.
func TestTask2025_BothGenerationsOneServer(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	old := stdio2025(t, b.server)
	id := created2025(t, old.charge(true, "t25-both", 3))["taskId"].(string)
	modern := stdioPeer(t, b.server)
	done := modern.waitTask(id)
	if done["status"] != "completed" || done["resultType"] != "complete" || done["ttlMs"] == nil {
		t.Fatalf("2026 tasks/get of a 2025 task = %v", done)
	}
	if code, _ := rpcError(t, modern.request("tasks/list", map[string]any{})); code != -32601 {
		t.Errorf("2026 tasks/list: code %v, want -32601", code)
	}
	if code, _ := rpcError(t, modern.task("tasks/result", id)); code != -32601 {
		t.Errorf("2026 tasks/result: code %v, want -32601", code)
	}
	// A 2026 retry of the same call finds the same task, in its shape.
	again := result(t, modern.charge(true, "t25-both", 3))
	if again["resultType"] != "task" || again["taskId"] != id {
		t.Errorf("2026 retry = %v, want task %s", again, id)
	}
	if r := result(t, old.task("tasks/get", id)); r["status"] != "completed" || r["ttl"] == nil {
		t.Errorf("2025 tasks/get = %v", r)
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestTask2025_TTL: a requested params.task.ttl is granted within
// [1 minute, the task's retention without one], the answer says what was
// granted, and the call's row (its key with it) expires by it.
func TestTask2025_TTL(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	p := stdio2025(t, b.server)
	for i, tc := range []struct {
		asked any
		want  time.Duration
	}{
		{90_000, 90 * time.Second},
		{1, defaults.MinTaskTTL},
		{(10 * defaults.KeyRetention).Milliseconds(), defaults.KeyRetention},
		{nil, defaults.KeyRetention}, // params.task without a ttl
		{"soon", defaults.KeyRetention},
	} {
		key := fmt.Sprintf("t25-ttl-%d", i)
		params := map[string]any{"name": "charge", "arguments": map[string]any{"amount": 100 + i},
			"_meta": map[string]any{"idempotencyKey": key}, "task": map[string]any{}}
		if tc.asked != nil {
			params["task"] = map[string]any{"ttl": tc.asked}
		}
		task := created2025(t, p.request("tools/call", params))
		if task["ttl"] != float64(tc.want.Milliseconds()) {
			t.Errorf("asked %v: ttl %v, want %d", tc.asked, task["ttl"], tc.want.Milliseconds())
		}
		id := task["taskId"].(string)
		if r := result(t, p.task("tasks/result", id)); r["isError"] == true {
			t.Fatalf("tasks/result = %v", r)
		}
		if got := result(t, p.task("tasks/get", id)); got["ttl"] != task["ttl"] {
			t.Errorf("asked %v: tasks/get ttl %v, want %v", tc.asked, got["ttl"], task["ttl"])
		}
		if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE task_id = $1 AND expires_at = completed_at + $2`, id, tc.want.Milliseconds()); n != 1 {
			t.Errorf("asked %v: the row does not expire %v after it completed", tc.asked, tc.want)
		}
	}
}

// TestTask2025_NoFront: a server of the layer on a bare go-sdk transport
// (no mcpstdio.NewTransport around it) offers 2025-11-25 Tasks to no one:
// go-sdk would drop a client's params.task, and the client, which asked
// for a task, would get a plain result it cannot read after the call had
// run. 2026-07-28 Tasks need no front.
func TestTask2025_NoFront(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	for _, mode := range []outbox.TaskMode{outbox.TasksAlways, outbox.TasksRequired} {
		b := taskSetup(t, db, mode, nil)
		cr, sw := io.Pipe()
		sr, cw := io.Pipe()
		ss, err := b.server.Connect(context.Background(), &mcp.IOTransport{Reader: sr, Writer: sw}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cw.Close(); cr.Close(); ss.Close() })
		tp := &taskPeer{t: t, w: cw, r: bufio.NewScanner(cr)}
		tp.r.Buffer(nil, 1<<20)
		p := &peer2025{t: t, stdio: tp}
		if caps := p.initialize()["capabilities"].(map[string]any); caps["tasks"] != nil {
			t.Errorf("%v: initialize without a front offers tasks: %v", mode, caps["tasks"])
		}
		for _, tool := range result(t, p.request("tools/list", map[string]any{}))["tools"].([]any) {
			if ex := tool.(map[string]any)["execution"]; ex != nil {
				t.Errorf("%v: tools/list without a front: %v has execution %v", mode, tool.(map[string]any)["name"], ex)
			}
		}
		key := fmt.Sprintf("t25-nofront-%d", mode)
		r := p.charge(true, key, 9)
		if mode == outbox.TasksRequired {
			// go-sdk v1.8.0 sends any -32601 as `method not found:
			// "tools/call"`, whatever its message said.
			if code, msg := rpcError(t, r); code != -32601 {
				t.Errorf("TasksRequired without a front: %v %s", code, msg)
			}
			if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE key = $1`, key); n != 0 {
				t.Errorf("a refused call was recorded")
			}
			continue
		}
		if res := result(t, r); res["task"] != nil || res["isError"] == true {
			t.Errorf("TasksAlways without a front: %v, want the plain result", res)
		}
	}
}

// TestTask2025_TTLSurvivesTakeover: a task taken over after its owner died
// keeps the ttl it was granted, not the one its new runner would grant.
func TestTask2025_TTLSurvivesTakeover(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	a := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	params := map[string]any{"name": "charge", "arguments": map[string]any{"amount": 11},
		"_meta": map[string]any{"idempotencyKey": "t25-ttl-takeover"}, "task": map[string]any{"ttl": 120_000}}
	task := created2025(t, stdio2025(t, a.server).request("tools/call", params))
	id := task["taskId"].(string)
	if task["ttl"] != float64(120_000) {
		t.Fatalf("ttl %v, want 120000", task["ttl"])
	}
	g.waitReached(t)
	orphanTask(t, db, id)
	done := takeOverTask(t, db, id)
	close(g.release)
	outbox.WaitTasks(a.layer)
	if done["status"] != "completed" {
		t.Fatalf("recovered task = %v", done)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE task_id = $1 AND expires_at = completed_at + 120000`, id); n != 1 {
		t.Errorf("the recovered task's row does not expire 2 minutes after it completed")
	}
}

// A tool result with isError ends a task failed at 2025-11-25 ("For tool
// calls specifically, this includes cases where the tool call result has
// isError set to true"), but completed in the 2026-07-28 extension, whose
// failed is for JSON-RPC errors only; tasks/result answers the
// CallToolResult either way, and call_status follows the asker's revision.
func TestTask2025_ToolErrorFails(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	p := stdio2025(t, b.server)
	id := created2025(t, p.charge(true, "t25-err", 0))["taskId"].(string)
	res := result(t, p.task("tasks/result", id))
	if res["isError"] != true {
		t.Fatalf("tasks/result = %v, want the CallToolResult with isError", res)
	}
	if call, _ := res["_meta"].(map[string]any)[outbox.MetaKeyCall].(map[string]any); call["state"] != "failed" || call["key"] != "t25-err" {
		t.Errorf("tasks/result _meta[%s] = %v, want state failed", outbox.MetaKeyCall, call)
	}
	get := result(t, p.task("tasks/get", id))
	if get["status"] != "failed" || !strings.Contains(fmt.Sprint(get["statusMessage"]), "amount must be greater than 0") {
		t.Errorf("tasks/get = %v, want failed with the tool's error as statusMessage", get)
	}
	if tasks := result(t, p.request("tasks/list", map[string]any{}))["tasks"].([]any); len(tasks) != 1 || tasks[0].(map[string]any)["status"] != "failed" {
		t.Errorf("tasks/list = %v", tasks)
	}
	if again := created2025(t, p.charge(true, "t25-err", 0)); again["taskId"] != id || again["status"] != "failed" {
		t.Errorf("retry = %v, want task %s failed", again, id)
	}
	if code, _ := rpcError(t, p.task("tasks/cancel", id)); code != -32602 {
		t.Errorf("tasks/cancel of a failed task: code %v, want -32602", code)
	}
	st := result(t, p.request("tools/call", map[string]any{"name": outbox.StatusToolName, "arguments": map[string]any{"key": "t25-err"}}))
	if sc, _ := st["structuredContent"].(map[string]any); sc["taskStatus"] != "failed" || sc["state"] != "failed" {
		t.Errorf("call_status at 2025-11-25 = %v, want taskStatus failed", sc)
	}
	// The same task read through the extension: completed, with the result.
	p26 := stdioPeer(t, b.server)
	if r := result(t, p26.task("tasks/get", id)); r["status"] != "completed" || r["result"].(map[string]any)["isError"] != true {
		t.Errorf("tasks/get at 2026-07-28 = %v, want completed with the isError result", r)
	}
	st = result(t, p26.request("tools/call", map[string]any{"name": outbox.StatusToolName, "arguments": map[string]any{"key": "t25-err"}, "_meta": meta(false, "")}))
	if sc, _ := st["structuredContent"].(map[string]any); sc["taskStatus"] != "completed" {
		t.Errorf("call_status at 2026-07-28 = %v, want taskStatus completed", sc)
	}
}
