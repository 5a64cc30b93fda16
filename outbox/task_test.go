package outbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// taskPeer speaks 2026-07-28 JSON-RPC to a server: per-request _meta, no
// initialize, as @modelcontextprotocol/ext-tasks does. Over stdio
// (mcpstdio) or stateless Streamable HTTP (mcphttp.NewHandler).
type taskPeer struct {
	t    testing.TB
	next atomic.Int64
	// one of:
	w     io.Writer
	r     *bufio.Scanner
	url   string
	token string
}

func stdioPeer(t testing.TB, s *mcp.Server) *taskPeer {
	t.Helper()
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	ss, err := s.Connect(context.Background(), mcpstdio.NewTransport(&mcp.IOTransport{Reader: sr, Writer: sw}, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The client goes away whole: a session whose client stopped reading
	// (a task's status notification nobody reads) closes only once its
	// writes fail.
	t.Cleanup(func() { cw.Close(); cr.Close(); ss.Close() })
	p := &taskPeer{t: t, w: cw, r: bufio.NewScanner(cr)}
	p.r.Buffer(nil, 1<<20)
	return p
}

// httpTaskServer serves s statelessly for 2026-07-28, behind bearer tokens
// "alice" and "bob".
func httpTaskServer(t *testing.T, s *mcp.Server) string {
	t.Helper()
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token != "alice" && token != "bob" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	srv := httptest.NewServer(auth.RequireBearerToken(verify, nil)(mcphttp.NewHandler(s, nil)))
	t.Cleanup(srv.Close)
	return srv.URL
}

func httpPeer(t *testing.T, url, token string) *taskPeer {
	return &taskPeer{t: t, url: url, token: token}
}

// meta is a 2026-07-28 request's _meta; tasks declares the extension.
func meta(tasks bool, key string) map[string]any {
	caps := map[string]any{}
	if tasks {
		caps["extensions"] = map[string]any{outbox.ExtensionTasks: map[string]any{}}
	}
	m := map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "task-test", "version": "0"},
		"io.modelcontextprotocol/clientCapabilities": caps,
	}
	if key != "" {
		m["idempotencyKey"] = key
	}
	return m
}

// request sends one request and returns its response (result or error).
func (p *taskPeer) request(method string, params map[string]any) map[string]any {
	p.t.Helper()
	if _, ok := params["_meta"]; !ok {
		params["_meta"] = meta(false, "")
	}
	id := p.next.Add(1)
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if p.url != "" {
		return p.post(method, params, body)
	}
	if _, err := p.w.Write(append(body, '\n')); err != nil {
		p.t.Fatal(err)
	}
	for p.r.Scan() {
		var m map[string]any
		if err := json.Unmarshal(p.r.Bytes(), &m); err != nil {
			p.t.Fatalf("response %s: %v", p.r.Bytes(), err)
		}
		if m["id"] == float64(id) {
			return m
		}
	}
	p.t.Fatalf("read response: %v", p.r.Err())
	return nil
}

func (p *taskPeer) post(method string, params map[string]any, body []byte) map[string]any {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+p.token)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	switch {
	case method == "tools/call":
		req.Header.Set("Mcp-Name", params["name"].(string))
	case strings.HasPrefix(method, "tasks/"):
		req.Header.Set("Mcp-Name", params["taskId"].(string))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	return readResponse(p.t, method, resp)
}

// readResponse reads the JSON-RPC response of a POST of method, as JSON or
// as the first event of an SSE stream, and closes the body.
func readResponse(t testing.TB, method string, resp *http.Response) map[string]any {
	t.Helper()
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	text := string(raw)
	if i := strings.Index(text, "data: "); i >= 0 { // an SSE answer
		text = strings.TrimSpace(strings.SplitN(text[i+len("data: "):], "\n", 2)[0])
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatalf("POST %s: %s: %s", method, resp.Status, raw)
	}
	return m
}

func result(t testing.TB, resp map[string]any) map[string]any {
	t.Helper()
	r, ok := resp["result"].(map[string]any)
	if !ok {
		t.Fatalf("no result: %v", resp)
	}
	return r
}

func rpcError(t *testing.T, resp map[string]any) (float64, string) {
	t.Helper()
	e, ok := resp["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error: %v", resp)
	}
	return e["code"].(float64), fmt.Sprint(e["message"])
}

func (p *taskPeer) charge(tasks bool, key string, amount int) map[string]any {
	return p.request("tools/call", map[string]any{"name": "charge", "arguments": map[string]any{"amount": amount}, "_meta": meta(tasks, key)})
}

func (p *taskPeer) task(method, id string) map[string]any {
	return p.request(method, map[string]any{"taskId": id})
}

// waitTask polls tasks/get until the task is no longer working.
func (p *taskPeer) waitTask(id string) map[string]any {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := result(p.t, p.task("tasks/get", id))
		if r["status"] != "working" {
			return r
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("task %s still working", id)
		}
		time.Sleep(10 * time.Millisecond) // polling, as the client does (pollIntervalMs)
	}
}

// taskSetup is a layer with the ledger's charge allowing tasks.
func taskSetup(t testing.TB, db *schema.DB, mode outbox.TaskMode, lopts *ledger.Options) *bundle {
	t.Helper()
	if lopts == nil {
		lopts = &ledger.Options{}
	}
	// After is long enough for a fast call under -race on a loaded machine
	// (50 ms was not: CI saw a fast call become a task); a slow call holds
	// on a gate, so it costs TestTask_IfSlow one second.
	lopts.Tasks = map[string]outbox.TaskOptions{"charge": {Mode: mode, After: time.Second, PollInterval: 20 * time.Millisecond}}
	return setupOn(t, mustLedger(t, db), nil, lopts)
}

// gate holds charge before its first statement until released (or the
// call's context ends), and says when a call reached it.
type taskGate struct {
	reached chan struct{}
	release chan struct{}
}

func newGate() *taskGate {
	return &taskGate{reached: make(chan struct{}, 16), release: make(chan struct{})}
}

func (g *taskGate) hold(ctx context.Context) error {
	g.reached <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *taskGate) waitReached(t *testing.T) {
	t.Helper()
	select {
	case <-g.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("charge not reached")
	}
}

func TestTask_DiscoverAdvertisesTheExtension(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	caps := result(t, stdioPeer(t, b.server).request("server/discover", map[string]any{}))["capabilities"].(map[string]any)
	ext, _ := caps["extensions"].(map[string]any)
	if v, ok := ext[outbox.ExtensionTasks]; !ok || fmt.Sprint(v) != "map[]" {
		t.Fatalf("extensions = %v, want %s as {}", caps["extensions"], outbox.ExtensionTasks)
	}
	plain := setupOn(t, db, nil, nil) // no tool allows tasks
	caps = result(t, stdioPeer(t, plain.server).request("server/discover", map[string]any{}))["capabilities"].(map[string]any)
	if ext, _ := caps["extensions"].(map[string]any); ext[outbox.ExtensionTasks] != nil {
		t.Errorf("a server without tasks advertises them: %v", caps)
	}
}

func TestTask_CreatedDurablyThenCompletes(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	b := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	p := stdioPeer(t, b.server)
	created := result(t, p.charge(true, "task-1", 700))
	if created["resultType"] != "task" || created["status"] != "working" {
		t.Fatalf("CreateTaskResult = %v", created)
	}
	id, _ := created["taskId"].(string)
	for _, f := range []string{"createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"} {
		if _, ok := created[f]; !ok {
			t.Errorf("CreateTaskResult lacks %s: %v", f, created)
		}
	}
	if created["pollIntervalMs"] != float64(20) || created["ttlMs"] != float64(defaults.KeyRetention.Milliseconds()) {
		t.Errorf("pollIntervalMs, ttlMs = %v, %v", created["pollIntervalMs"], created["ttlMs"])
	}
	g.waitReached(t)
	// The handler holds before its first statement, so nothing has
	// committed since the claim: the task row seen from another
	// connection is the claim's commit, made before the answer.
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE task_id = $1 AND state = 'in_flight' AND task_params IS NOT NULL`, id); n != 1 {
		t.Fatalf("task row before the answer: %d rows", n)
	}
	// tasks/get from another connection, and from another layer on the
	// same database, while it works.
	other := stdioPeer(t, b.server)
	if r := result(t, other.task("tasks/get", id)); r["status"] != "working" || r["resultType"] != "complete" {
		t.Fatalf("tasks/get while working = %v", r)
	}
	second := taskSetup(t, db, outbox.TasksAlways, nil)
	close(g.release)
	done := stdioPeer(t, second.server).waitTask(id)
	if done["status"] != "completed" || done["resultType"] != "complete" {
		t.Fatalf("tasks/get from a second layer = %v", done)
	}
	inner, _ := done["result"].(map[string]any)
	if inner["resultType"] != "complete" || inner["isError"] == true {
		t.Fatalf("task result = %v", inner)
	}
	if sc, _ := inner["structuredContent"].(map[string]any); sc["amount"] != float64(700) {
		t.Errorf("structuredContent = %v", inner["structuredContent"])
	}
	// A recorded result carries the layer's outcome, under a task too.
	if call, _ := inner["_meta"].(map[string]any)[outbox.MetaKeyCall].(map[string]any); call["state"] != "completed" || call["replayed"] != false || call["callId"] == nil {
		t.Errorf("task result _meta[%s] = %v", outbox.MetaKeyCall, call)
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE task_params IS NOT NULL`); n != 0 {
		t.Errorf("stored params kept after the task ended")
	}
	// tasks/update acknowledges; tasks/result is not a method of 2026-07-28.
	if r := result(t, p.task("tasks/update", id)); r["resultType"] != "complete" {
		t.Errorf("tasks/update = %v", r)
	}
	if code, _ := rpcError(t, p.task("tasks/result", id)); code != -32601 {
		t.Errorf("tasks/result code = %v, want -32601", code)
	}
	if code, msg := rpcError(t, p.task("tasks/get", "task_nope")); code != -32602 || msg != "Task not found" {
		t.Errorf("unknown task: %v %q", code, msg)
	}
}

func TestTask_NoExtensionNoTask(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	p := stdioPeer(t, b.server)
	r := result(t, p.charge(false, "plain-1", 5))
	if r["resultType"] != "complete" || r["taskId"] != nil {
		t.Fatalf("a request without the extension got %v", r)
	}
	req := taskSetup(t, db, outbox.TasksRequired, nil)
	code, msg := rpcError(t, stdioPeer(t, req.server).charge(false, "plain-2", 5))
	if code != outbox.CodeTaskRequired {
		t.Errorf("TasksRequired without the extension: %v %s", code, msg)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE key = 'plain-2'`); n != 0 {
		t.Errorf("a refused call was recorded")
	}
}

func TestTask_IfSlow(t *testing.T) {
	t.Parallel()
	g := newGate()
	b := taskSetup(t, openDB(t), outbox.TasksIfSlow, nil)
	p := stdioPeer(t, b.server)
	if r := result(t, p.charge(true, "fast", 5)); r["resultType"] != "complete" || r["isError"] == true {
		t.Fatalf("a fast call = %v, want a plain answer", r)
	}
	slow := taskSetup(t, openDB(t), outbox.TasksIfSlow, &ledger.Options{Gate: g.hold})
	sp := stdioPeer(t, slow.server)
	r := result(t, sp.charge(true, "slow", 5))
	if r["resultType"] != "task" {
		t.Fatalf("a slow call = %v, want a task", r)
	}
	close(g.release)
	if done := sp.waitTask(r["taskId"].(string)); done["status"] != "completed" {
		t.Fatalf("slow task = %v", done)
	}
}

// TestTask_CancelBeforeCommit: a task cancelled before its commit keeps
// nothing and stays cancelled to tasks/get, but no longer names its call:
// the next identical call, by the same idempotency key or, without one, by
// the same tool and arguments (its fingerprint), runs anew as a new task,
// as a retry of a plain call stopped by a cancel does. Over stdio and
// stateless Streamable HTTP (mcphttp); the log says that tasks/cancel, over
// which transport, cancelled it.
func TestTask_CancelBeforeCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, key, via string }{
		{"KeyStdio", "cancel-1", "tasks/cancel over stdio"},
		{"FingerprintStdio", "", "tasks/cancel over stdio"},
		{"KeyHTTP", "cancel-1", "tasks/cancel over Streamable HTTP"},
		{"FingerprintHTTP", "", "tasks/cancel over Streamable HTTP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := mustLedger(t, openDB(t))
			g := newGate()
			logs := &outboxtest.LogBuffer{}
			b := setupOn(t, db, &outbox.Options{Logger: logs.Logger()}, &ledger.Options{Gate: g.hold,
				Tasks: map[string]outbox.TaskOptions{"charge": {Mode: outbox.TasksAlways, PollInterval: 20 * time.Millisecond}}})
			p := stdioPeer(t, b.server)
			if strings.Contains(tc.name, "HTTP") {
				p = httpPeer(t, httpTaskServer(t, b.server), "alice")
			}
			id := result(t, p.charge(true, tc.key, 5))["taskId"].(string)
			g.waitReached(t)
			if r := result(t, p.task("tasks/cancel", id)); r["resultType"] != "complete" {
				t.Fatalf("tasks/cancel = %v", r)
			}
			if done := p.waitTask(id); done["status"] != "cancelled" {
				t.Fatalf("after cancel: %v", done)
			}
			if got := charges(t, b); got != 0 {
				t.Errorf("charges = %d after a cancel before the commit", got)
			}
			stopped := logs.Records(t, "task cancelled before its commit; nothing kept: tasks/get answers cancelled, and an identical call runs as a new one")
			if len(stopped) != 1 || !strings.HasPrefix(fmt.Sprint(stopped[0]["why"]), tc.via) {
				t.Errorf("cancel logged as %v, want one record whose why starts %q", stopped, tc.via)
			}
			if n := len(logs.Records(t, "call stopped before its commit; nothing recorded, a retry runs it")); n != 0 {
				t.Errorf("the task's cancel was also logged as a plain call's stop, blaming the transport: %s", logs)
			}

			// Asked again: the handler runs a second time, and its result
			// is the new task's.
			close(g.release)
			again := result(t, p.charge(true, tc.key, 5))
			next, _ := again["taskId"].(string)
			if next == "" || next == id {
				t.Fatalf("the same call after the cancel = %v, want a new task (the cancelled one is %s)", again, id)
			}
			done := p.waitTask(next)
			if done["status"] != "completed" {
				t.Fatalf("the new task = %v", done)
			}
			if sc, _ := done["result"].(map[string]any)["structuredContent"].(map[string]any); sc["amount"] != float64(5) {
				t.Errorf("the new task's result = %v", done["result"])
			}
			if got := charges(t, b); got != 1 {
				t.Errorf("charges = %d after the call ran again, want 1", got)
			}
			// The cancelled task is still its client's record, cancelled.
			if r := result(t, p.task("tasks/get", id)); r["status"] != "cancelled" {
				t.Errorf("tasks/get of the cancelled task after the new call = %v", r)
			}
			// Once more: the completed task answers (a replay), nothing runs.
			if r := result(t, p.charge(true, tc.key, 5)); r["taskId"] != next {
				t.Errorf("the call asked a third time = %v, want the completed task %s", r, next)
			}
			if got := charges(t, b); got != 1 {
				t.Errorf("charges = %d after a replay, want 1", got)
			}
		})
	}
}

// TestTask_CancelledTaskIsNotJoined: a task tasks/cancel stopped whose
// handler has not returned yet (it ignores its context) is not handed to
// the same call asked again in the meantime: that call waits for the
// cancelled task to end, as a duplicate waits for a running call, and once
// it has ended runs anew.
func TestTask_CancelledTaskIsNotJoined(t *testing.T) {
	t.Parallel()
	db := mustLedger(t, openDB(t))
	reached, release := make(chan struct{}, 4), make(chan struct{})
	var gateOnce atomic.Bool
	stubborn := func(context.Context) error {
		if gateOnce.CompareAndSwap(false, true) { // only the first run
			reached <- struct{}{}
			<-release
		}
		return nil
	}
	b := setupOn(t, db, &outbox.Options{InFlightWait: 300 * time.Millisecond}, &ledger.Options{Gate: stubborn,
		Tasks: map[string]outbox.TaskOptions{"charge": {Mode: outbox.TasksAlways, PollInterval: 20 * time.Millisecond}}})
	p := stdioPeer(t, b.server)
	id := result(t, p.charge(true, "", 8))["taskId"].(string)
	<-reached
	if r := result(t, p.task("tasks/cancel", id)); r["resultType"] != "complete" {
		t.Fatalf("tasks/cancel = %v", r)
	}
	// The first run still holds its call: the same call waits, then says
	// it is in progress; it is never answered with the cancelled task.
	r := result(t, p.charge(true, "", 8))
	if r["taskId"] == id {
		t.Fatalf("the same call, while the cancelled task's handler had not returned, got the cancelled task: %v", r)
	}
	if r["isError"] != true {
		t.Errorf("the same call while the cancelled task ends = %v, want the in-progress error", r)
	}
	close(release)
	if done := p.waitTask(id); done["status"] != "cancelled" {
		t.Fatalf("after cancel: %v", done)
	}
	next := result(t, p.charge(true, "", 8))["taskId"].(string)
	if done := p.waitTask(next); next == id || done["status"] != "completed" {
		t.Fatalf("the call asked again after the cancelled task ended: task %s (the cancelled one is %s): %v", next, id, done)
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

func TestTask_CancelAfterCommit(t *testing.T) {
	t.Parallel()
	b := taskSetup(t, openDB(t), outbox.TasksAlways, nil)
	p := stdioPeer(t, b.server)
	id := result(t, p.charge(true, "cancel-2", 5))["taskId"].(string)
	p.waitTask(id)
	if r := result(t, p.task("tasks/cancel", id)); r["resultType"] != "complete" {
		t.Fatalf("tasks/cancel = %v", r)
	}
	if r := result(t, p.task("tasks/get", id)); r["status"] != "completed" {
		t.Errorf("a committed task after cancel: %v", r)
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d", got)
	}
}

func TestTask_LostHandleRecovered(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	b := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	p := stdioPeer(t, b.server)
	first := result(t, p.charge(true, "lost-1", 5))
	g.waitReached(t)
	// The answer was lost; the retry, on another connection, with the same key.
	again := result(t, stdioPeer(t, b.server).charge(true, "lost-1", 5))
	if again["resultType"] != "task" || again["taskId"] != first["taskId"] || again["status"] != "working" {
		t.Fatalf("retry while working = %v, want task %v", again, first["taskId"])
	}
	// Without a key: the fingerprint finds the same task.
	nokey := result(t, p.charge(true, "", 6))
	g.waitReached(t)
	nokey2 := result(t, p.charge(true, "", 6))
	if nokey2["taskId"] != nokey["taskId"] {
		t.Fatalf("keyless retry got task %v, want %v", nokey2["taskId"], nokey["taskId"])
	}
	close(g.release)
	p.waitTask(first["taskId"].(string))
	p.waitTask(nokey["taskId"].(string))
	done := result(t, p.charge(true, "lost-1", 5))
	if done["taskId"] != first["taskId"] || done["status"] != "completed" {
		t.Errorf("retry after the end = %v", done)
	}
	// A retry that does not ask for a task replays the call.
	plain := result(t, p.charge(false, "lost-1", 5))
	if plain["isError"] == true || plain["taskId"] != nil {
		t.Errorf("plain retry = %v", plain)
	}
	if got := charges(t, b); got != 2 {
		t.Errorf("charges = %d, want 2 (one per logical call)", got)
	}
	// call_status names the task and its status.
	st := result(t, p.request("tools/call", map[string]any{"name": outbox.StatusToolName, "arguments": map[string]any{"key": "lost-1"}}))
	sc, _ := st["structuredContent"].(map[string]any)
	if sc["taskId"] != first["taskId"] || sc["taskStatus"] != "completed" {
		t.Errorf("call_status = %v", sc)
	}
}

func TestTask_OtherPrincipalGetsNotFound(t *testing.T) {
	t.Parallel()
	b := taskSetup(t, openDB(t), outbox.TasksAlways, nil)
	url := httpTaskServer(t, b.server)
	alice, bob := httpPeer(t, url, "alice"), httpPeer(t, url, "bob")
	created := result(t, alice.charge(true, "http-1", 5))
	id, _ := created["taskId"].(string)
	if created["resultType"] != "task" || id == "" {
		t.Fatalf("over HTTP: %v", created)
	}
	if done := alice.waitTask(id); done["status"] != "completed" {
		t.Fatalf("alice's task = %v", done)
	}
	for _, m := range []string{"tasks/get", "tasks/cancel", "tasks/update"} {
		if code, msg := rpcError(t, bob.task(m, id)); code != -32602 || msg != "Task not found" {
			t.Errorf("bob's %s: %v %q", m, code, msg)
		}
	}
}

func TestTask_RecoveredWhenOwnerIsGone(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	a := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	p := stdioPeer(t, a.server)
	id := result(t, p.charge(true, "recover-1", 9))["taskId"].(string)
	g.waitReached(t)
	// The attempt of layer a, still held at the gate, fails its fence
	// when released: it no longer owns the call.
	orphanTask(t, db, id)
	done := takeOverTask(t, db, id)
	if done["status"] != "completed" {
		t.Fatalf("recovered task = %v", done)
	}
	close(g.release) // the old attempt wakes and must not commit
	outbox.WaitTasks(a.layer)
	if got := charges(t, a); got != 1 {
		t.Errorf("charges = %d, want exactly 1", got)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects = %d, want exactly 1", n)
	}
}

// orphanTask makes the owner of task id gone: on SQLite its process is
// dead; on PostgreSQL its lease passed.
func orphanTask(t *testing.T, db *schema.DB, id string) {
	t.Helper()
	if onPostgres() {
		mustExec(t, db, `UPDATE calls SET owner = 'gone/1#1', lease_until = 0 WHERE task_id = $1`, id)
	} else {
		mustExec(t, db, `UPDATE calls SET owner = $1 WHERE task_id = $2`, deadOwner(t), id)
	}
}

// takeOverTask starts another layer on db, which takes over the
// orphaned task id, and returns the task once it has ended.
func takeOverTask(t *testing.T, db *schema.DB, id string) map[string]any {
	t.Helper()
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	running, err := b.layer.Start(context.Background(), &outbox.StartOptions{NoDispatcher: true, ReapInterval: outbox.ReaperOff})
	if err != nil {
		t.Fatal(err)
	}
	done := stdioPeer(t, b.server).waitTask(id)
	if err := running.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	return done
}

func mustExec(t *testing.T, db *schema.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Write.Exec(q, args...); err != nil {
		t.Fatal(err)
	}
}

// TestTask_CancelReachesAnOwnerElsewhere: tasks/cancel on a layer that
// does not run the task (another process, another replica) records the
// request in the row; the owner's commit is refused and the task ends
// cancelled, with nothing of its work kept.
func TestTask_CancelReachesAnOwnerElsewhere(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	owner := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	id := result(t, stdioPeer(t, owner.server).charge(true, "cancel-far", 5))["taskId"].(string)
	g.waitReached(t)
	other := taskSetup(t, db, outbox.TasksAlways, nil)
	p := stdioPeer(t, other.server)
	if r := result(t, p.task("tasks/cancel", id)); r["resultType"] != "complete" {
		t.Fatalf("tasks/cancel = %v", r)
	}
	if r := result(t, p.task("tasks/get", id)); r["status"] != "working" || r["statusMessage"] == nil {
		t.Errorf("while the owner runs on: %v", r)
	}
	close(g.release)
	outbox.WaitTasks(owner.layer)
	if r := result(t, p.task("tasks/get", id)); r["status"] != "cancelled" {
		t.Fatalf("after the owner's commit was refused: %v", r)
	}
	if got := charges(t, owner); got != 0 {
		t.Errorf("charges = %d, want 0", got)
	}
}

// TestTask_PlainRetryFinishesAnOrphanedTask: a retry without the
// extension that takes over a task whose owner is gone runs it as that
// task: tasks/get then reports it completed, under its id.
func TestTask_PlainRetryFinishesAnOrphanedTask(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	a := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	id := result(t, stdioPeer(t, a.server).charge(true, "orphan-1", 5))["taskId"].(string)
	g.waitReached(t)
	orphanTask(t, db, id)
	b := taskSetup(t, db, outbox.TasksAlways, nil)
	p := stdioPeer(t, b.server)
	if r := result(t, p.charge(false, "orphan-1", 5)); r["isError"] == true || r["taskId"] != nil {
		t.Fatalf("plain retry = %v", r)
	}
	if r := result(t, p.task("tasks/get", id)); r["status"] != "completed" {
		t.Errorf("the task after the plain retry ran it: %v", r)
	}
	close(g.release)
	outbox.WaitTasks(a.layer)
	if got := charges(t, a); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

func TestTask_AddToolRefusesTasksOnUnrecordedTools(t *testing.T) {
	t.Parallel()
	l, err := outbox.New(openDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "not recorded") {
			t.Errorf("recovered %v, want a panic naming the mistake", r)
		}
	}()
	outbox.AddTool(l, s, &mcp.Tool{Name: "look", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, outbox.Tx, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, struct{}, error) {
			return nil, struct{}{}, nil
		}, &outbox.ToolOptions{Tasks: outbox.TaskOptions{Mode: outbox.TasksAlways}})
}

// faultyTaskLayer is a started layer whose charge allows tasks, on a
// database whose handler statement (INSERT INTO charges) fails with a
// store error of the current store, at most max times (0: always). Its
// task runner scans every 20 ms.
func faultyTaskLayer(t *testing.T, max int) (*bundle, *faultdb.Injector) {
	t.Helper()
	in, target, kind := faultdb.New(1), filepath.Join(t.TempDir(), "tasks.db"), faultdb.IOErr
	if onPostgres() {
		in, target, kind = faultdb.NewPostgres(1), testTarget(t), faultdb.PgConnFailure
	}
	db, err := schema.Open(context.Background(), target, &schema.Options{Driver: in.DriverName()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := taskSetup(t, mustLedger(t, db), outbox.TasksAlways, nil)
	in.Set(faultdb.Rule{Name: "handler", Stmt: faultdb.Contains("INSERT INTO charges"), Kind: kind, Rate: 1, Max: max})
	running, err := b.layer.Start(context.Background(), &outbox.StartOptions{NoDispatcher: true, ReapInterval: outbox.ReaperOff,
		TaskScanInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Stop(context.Background()) })
	return b, in
}

// runFaultyTask makes charge a task on faultyTaskLayer(t, max) by key,
// and returns the task once it has ended, with its id.
func runFaultyTask(t *testing.T, max int, key string, amount int) (*bundle, *faultdb.Injector, *taskPeer, string, map[string]any) {
	t.Helper()
	b, in := faultyTaskLayer(t, max)
	p := stdioPeer(t, b.server)
	id := result(t, p.charge(true, key, amount))["taskId"].(string)
	return b, in, p, id, p.waitTask(id)
}

// A task whose run fails because the store failed under it (a connection
// reset, an I/O error) is run again, not failed for good: its key would
// otherwise replay that failure to every retry.
func TestTask_StoreFaultRunsAgain(t *testing.T) {
	t.Parallel()
	b, in, p, id, done := runFaultyTask(t, 2, "fault-1", 11)
	if done["status"] != "completed" {
		t.Fatalf("task after two store faults = %v; want completed", done)
	}
	if n := in.Faults("handler"); n != 2 {
		t.Fatalf("faults injected = %d, want 2", n)
	}
	if n := count(t, b.db.Read, `SELECT attempts FROM calls WHERE task_id = $1`, id); n != 3 {
		t.Errorf("runs = %d, want 3", n)
	}
	// The key now replays the success, running nothing more.
	if r := result(t, p.charge(false, "fault-1", 11)); r["isError"] == true {
		t.Errorf("retry of the key = %v; want the recorded success", r)
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// A store that fails every run fails the task in the end: it is not run
// for ever.
func TestTask_StoreFaultRunsBounded(t *testing.T) {
	t.Parallel()
	b, in, _, id, done := runFaultyTask(t, 0, "fault-2", 12)
	if done["status"] != "failed" {
		t.Fatalf("task whose every run fails = %v; want failed", done)
	}
	runs := count(t, b.db.Read, `SELECT attempts FROM calls WHERE task_id = $1`, id)
	if runs != outbox.MaxTaskRuns || in.Faults("handler") != runs {
		t.Errorf("runs = %d, faults = %d; want %d of each", runs, in.Faults("handler"), outbox.MaxTaskRuns)
	}
	if got := charges(t, b); got != 0 {
		t.Errorf("charges = %d, want 0", got)
	}
}

// A task whose outcome cannot be encoded (a handler's structured content
// JSON cannot hold) failed for a reason of its own, not the store's: it
// fails, and is not run again, which would only fail the same way.
func TestTask_EncodeErrorFailsTask(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	done := runTaskOf(t, "nan", func(context.Context, outbox.Tx, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		runs.Add(1)
		return &mcp.CallToolResult{StructuredContent: map[string]any{"x": math.NaN()}}, nil, nil
	})
	if done["status"] != "failed" {
		t.Fatalf("task = %v; want failed", done)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("runs = %d, want 1", n)
	}
}

// A task whose handler ignores the error of one of its statements (here
// a table that does not exist) is not given back as if the store had
// failed: on PostgreSQL the error aborted the transaction, so its outcome
// cannot commit, and a run again would fail the same way.
func TestTask_IgnoredStatementErrorNotRunAgain(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	done := runTaskOf(t, "ignore", func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		runs.Add(1)
		_, _ = tx.ExecContext(ctx, `INSERT INTO no_such_table VALUES (1)`)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	want := "completed" // SQLite keeps the rest of the handler's work
	if onPostgres() {
		want = "failed"
	}
	if done["status"] != want {
		t.Errorf("task = %v; want %s", done, want)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("runs = %d, want 1", n)
	}
}

// With ShowErrors, a task whose handler returns a plain error ends failed
// with the error's text, as a plain call answers it; without, with the
// generic words.
func TestTask_ShowErrors(t *testing.T) {
	t.Parallel()
	invalid := func(context.Context, outbox.Tx, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return nil, nil, fmt.Errorf("unsupported currency %q", "XYZ")
	}
	for _, show := range []bool{false, true} {
		done := runTaskWith(t, "invoice", invalid, outbox.ToolOptions{ShowErrors: show})
		b, _ := json.Marshal(done)
		if done["status"] != "failed" || strings.Contains(string(b), `unsupported currency`) != show {
			t.Errorf("ShowErrors %v: task = %s; want failed, the handler's text shown %v", show, b, show)
		}
	}
}

// A task's handler can tell why its context ended: context.Cause is
// ErrTaskCancelled after tasks/cancel, ErrLayerStopped after Runner.Stop.
func TestTask_HandlerContextSaysWhy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, p *taskPeer, r *outbox.Runner, id string)
		want error
	}{
		{"tasks/cancel", func(t *testing.T, p *taskPeer, _ *outbox.Runner, id string) { result(t, p.task("tasks/cancel", id)) }, outbox.ErrTaskCancelled},
		{"Runner.Stop", func(t *testing.T, _ *taskPeer, r *outbox.Runner, _ string) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // no patience: the running task is stopped at once
			_ = r.Stop(ctx)
		}, outbox.ErrLayerStopped},
	} {
		t.Run(strings.ReplaceAll(tc.name, "/", "_"), func(t *testing.T) {
			t.Parallel()
			reached, causes := make(chan struct{}, 1), make(chan error, 1)
			l, err := outbox.New(openDB(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
			outbox.AddTool(l, s, &mcp.Tool{Name: "wait"}, func(ctx context.Context, _ outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				reached <- struct{}{}
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return nil, nil, ctx.Err()
			}, &outbox.ToolOptions{Tasks: outbox.TaskOptions{Mode: outbox.TasksAlways, PollInterval: 20 * time.Millisecond}})
			r, err := l.Start(context.Background(), &outbox.StartOptions{NoDispatcher: true, ReapInterval: outbox.ReaperOff})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Stop(context.Background()) })
			p := stdioPeer(t, s)
			id := result(t, p.request("tools/call", map[string]any{"name": "wait", "arguments": map[string]any{}, "_meta": meta(true, "why-1")}))["taskId"].(string)
			select {
			case <-reached:
			case <-time.After(10 * time.Second):
				t.Fatal("handler not reached")
			}
			tc.end(t, p, r, id)
			select {
			case got := <-causes:
				if !errors.Is(got, tc.want) {
					t.Errorf("context.Cause = %v, want %v", got, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the handler's context did not end")
			}
		})
	}
}

// runTaskOf serves tool name, always a task run by h, with the task
// runner on, calls it once and returns the task as it ended.
func runTaskOf(t *testing.T, name string, h outbox.HandlerFor[struct{}, any]) map[string]any {
	t.Helper()
	return runTaskWith(t, name, h, outbox.ToolOptions{})
}

// runTaskWith is runTaskOf with the tool's options (Tasks aside).
func runTaskWith(t *testing.T, name string, h outbox.HandlerFor[struct{}, any], o outbox.ToolOptions) map[string]any {
	t.Helper()
	l, err := outbox.New(openDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	o.Tasks = outbox.TaskOptions{Mode: outbox.TasksAlways, PollInterval: 20 * time.Millisecond}
	outbox.AddTool(l, s, &mcp.Tool{Name: name}, h, &o)
	running, err := l.Start(context.Background(), &outbox.StartOptions{NoDispatcher: true, ReapInterval: outbox.ReaperOff,
		TaskScanInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Stop(context.Background()) })
	p := stdioPeer(t, s)
	id := result(t, p.request("tools/call", map[string]any{"name": name, "arguments": map[string]any{}, "_meta": meta(true, name+"-1")}))["taskId"].(string)
	return p.waitTask(id)
}

// TestTask_StopLogsTheShutdown: a task stopped by Runner.Stop before its
// commit is logged as stopped by the layer stopping, to run again at the
// next start, not as a cancel nor as a plain call whose transport could
// not tell; its row stays in flight.
func TestTask_StopLogsTheShutdown(t *testing.T) {
	t.Parallel()
	db := mustLedger(t, openDB(t))
	g := newGate()
	logs := &outboxtest.LogBuffer{}
	b := setupOn(t, db, &outbox.Options{Logger: logs.Logger()}, &ledger.Options{Gate: g.hold,
		Tasks: map[string]outbox.TaskOptions{"charge": {Mode: outbox.TasksAlways, PollInterval: 20 * time.Millisecond}}})
	r, err := b.layer.Start(context.Background(), &outbox.StartOptions{NoDispatcher: true})
	if err != nil {
		t.Fatal(err)
	}
	p := stdioPeer(t, b.server)
	id := result(t, p.charge(true, "stop-1", 3))["taskId"].(string)
	g.waitReached(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no patience: the running task is stopped at once
	if err := r.Stop(ctx); err == nil || !strings.Contains(err.Error(), "tasks in flight were stopped") {
		t.Fatalf("Stop = %v, want it to say the tasks were stopped", err)
	}
	// The wait is said before it begins, so a process waiting for a long
	// task does not look hung.
	waiting := logs.Records(t, "stop: waiting for the tasks in flight to finish; "+
		"those still running then stop, roll back and run again at the next start")
	if len(waiting) != 1 || waiting[0]["running"] != float64(1) {
		t.Errorf("wait records %v, want one with running=1: %s", waiting, logs)
	}
	stopped := logs.Records(t, "task stopped before its commit by the layer stopping; nothing recorded, it stays in flight and runs again at the next start")
	if len(stopped) != 1 || stopped[0]["task_id"] != id {
		t.Errorf("stop records %v, want one naming task %s: %s", stopped, id, logs)
	}
	if n := len(logs.Records(t, "call stopped before its commit; nothing recorded, a retry runs it")); n != 0 {
		t.Errorf("the task's stop was logged as a plain call's: %s", logs)
	}
	if r := result(t, p.task("tasks/get", id)); r["status"] != "working" {
		t.Errorf("the stopped task = %v, want it still working, for the next start", r)
	}
}

// TestTask_CancelledElsewhereIsNotJoined: tasks/cancel reached a process
// that does not run the task, whose owner runs on until its commit is
// refused. The same call asked again meanwhile, in either process, is not
// handed the task whose cancel is recorded: it waits for the task to end,
// as for a running call, and once the owner has ended it, runs anew.
func TestTask_CancelledElsewhereIsNotJoined(t *testing.T) {
	t.Parallel()
	db := mustLedger(t, openDB(t))
	g := newGate()
	opts := func(gate func(context.Context) error) *ledger.Options {
		return &ledger.Options{Gate: gate, Tasks: map[string]outbox.TaskOptions{"charge": {Mode: outbox.TasksAlways, PollInterval: 20 * time.Millisecond}}}
	}
	owner := setupOn(t, db, &outbox.Options{InFlightWait: 300 * time.Millisecond}, opts(g.hold))
	op := stdioPeer(t, owner.server)
	id := result(t, op.charge(true, "far-again", 4))["taskId"].(string)
	g.waitReached(t)
	other := setupOn(t, db, &outbox.Options{InFlightWait: 300 * time.Millisecond}, opts(nil))
	p := stdioPeer(t, other.server)
	if r := result(t, p.task("tasks/cancel", id)); r["resultType"] != "complete" {
		t.Fatalf("tasks/cancel = %v", r)
	}
	for name, peer := range map[string]*taskPeer{"another process": p, "the owner's process": op} {
		if r := result(t, peer.charge(true, "far-again", 4)); r["taskId"] == id || r["isError"] != true {
			t.Errorf("in %s, the same call while the cancelled task's owner runs on = %v, want the in-progress error, not the task", name, r)
		}
	}
	close(g.release)
	outbox.WaitTasks(owner.layer)
	if r := result(t, p.task("tasks/get", id)); r["status"] != "cancelled" {
		t.Fatalf("after the owner's commit was refused: %v", r)
	}
	next := result(t, p.charge(true, "far-again", 4))["taskId"].(string)
	if done := p.waitTask(next); next == id || done["status"] != "completed" {
		t.Fatalf("the call asked again after the cancelled task ended: task %s (the cancelled one is %s): %v", next, id, done)
	}
	if got := charges(t, other); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}
