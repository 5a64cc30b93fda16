package sidecar

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// httpTaskPeer is one principal's session with a proxy over Streamable HTTP.
type httpTaskPeer struct {
	t       *testing.T
	url     string
	token   string
	session string
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

// TestTaskPrincipalOverHTTP: over the proxy's Streamable HTTP, a task is
// its principal's: another principal's tasks/get and tasks/cancel get
// -32602 "Task not found", and the owner reads it to its end.
func TestTaskPrincipalOverHTTP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := schema.Open(ctx, filepath.Join(t.TempDir(), "proxy.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	layer, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Layer: layer, Upstream: newUpstream(), Logger: testLogger(t), MinBackoff: time.Millisecond,
		Tasks: map[string]outbox.TaskOptions{"work": {Mode: outbox.TasksAlways}}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	srv := httptest.NewServer(auth.RequireBearerToken(verify, nil)(p.HTTPHandler(ctx)))
	defer srv.Close()
	open := func(token string) *httpTaskPeer {
		c := &httpTaskPeer{t: t, url: srv.URL, token: token}
		c.post("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
			"clientInfo": map[string]any{"name": token, "version": "0"}})
		return c
	}
	alice, bob := open("alice"), open("bob")

	created := alice.post("tools/call", taskCall("work", "a-1", 5))
	res, _ := created["result"].(map[string]any)
	id, _ := res["taskId"].(string)
	if res["resultType"] != "task" || id == "" {
		t.Fatalf("alice's call: %v", created)
	}
	for _, method := range []string{"tasks/get", "tasks/cancel", "tasks/update"} {
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
	theirs := bob.post("tools/call", taskCall("work", "a-1", 5))
	if r, _ := theirs["result"].(map[string]any); r["taskId"] == id || r["resultType"] != "task" {
		t.Errorf("bob's call with alice's key: %v", theirs)
	}
}
