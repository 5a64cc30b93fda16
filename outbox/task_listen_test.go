package outbox_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// listen opens a 2026-07-28 subscriptions/listen for taskIds over
// stateless HTTP and returns the messages of its SSE stream as they come;
// the channel closes when the stream ends.
func listen(t *testing.T, url, token string, taskIDs ...string) <-chan map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "listen:1", "method": "subscriptions/listen",
		"params": map[string]any{"_meta": meta(false, ""), "notifications": map[string]any{"taskIds": taskIDs}}})
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan map[string]any, 16)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var m map[string]any
			if json.Unmarshal([]byte(data), &m) == nil {
				out <- m
			}
		}
	}()
	return out
}

func nextMsg(t *testing.T, msgs <-chan map[string]any) map[string]any {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			t.Fatal("the listen stream ended")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("nothing on the listen stream")
	}
	return nil
}

// TestTask_Listen: a 2026-07-28 client that opens subscriptions/listen
// with the extension's filter ({taskIds}) gets the acknowledgement with the
// ids it may watch, then notifications/tasks as its task changes, the
// result with the terminal one, and a graceful end; another principal's id
// is left out of the acknowledgement.
func TestTask_Listen(t *testing.T) {
	t.Parallel()
	g := newGate()
	b := taskSetup(t, openDB(t), outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	url := httpTaskServer(t, b.server)
	created := result(t, httpPeer(t, url, "alice").charge(true, "listen-1", 7))
	id, _ := created["taskId"].(string)
	if created["resultType"] != "task" || id == "" {
		t.Fatalf("charge = %v, want a task", created)
	}
	g.waitReached(t)

	// bob may not watch alice's task: acknowledged without it, and the
	// listen, watching nothing, ends.
	bob := listen(t, url, "bob", id)
	ack := nextMsg(t, bob)
	if ack["method"] != "notifications/subscriptions/acknowledged" {
		t.Fatalf("first message %v, want the acknowledgement", ack)
	}
	if got, _ := json.Marshal(ack["params"].(map[string]any)["notifications"]); string(got) != `{"taskIds":[]}` {
		t.Errorf("bob's acknowledgement: %s, want no task", got)
	}
	if end := nextMsg(t, bob); end["id"] != "listen:1" || end["result"] == nil {
		t.Errorf("bob's listen ended with %v, want its result", end)
	}

	alice := listen(t, url, "alice", id, "task_unknown")
	ack = nextMsg(t, alice)
	params := ack["params"].(map[string]any)
	if got, _ := json.Marshal(params["notifications"]); ack["method"] != "notifications/subscriptions/acknowledged" || string(got) != `{"taskIds":["`+id+`"]}` {
		t.Fatalf("alice's acknowledgement: %v", ack)
	}
	if sub := params["_meta"].(map[string]any)["io.modelcontextprotocol/subscriptionId"]; sub != "listen:1" {
		t.Errorf("acknowledgement's subscriptionId %v, want the listen's id", sub)
	}
	if n := nextMsg(t, alice); n["method"] != "notifications/tasks" || n["params"].(map[string]any)["status"] != "working" {
		t.Fatalf("got %v, want the task working", n)
	}
	close(g.release)
	n := nextMsg(t, alice)
	p, _ := n["params"].(map[string]any)
	if n["method"] != "notifications/tasks" || p["status"] != "completed" || p["taskId"] != id || p["resultType"] != nil {
		t.Fatalf("got %v, want the task completed", n)
	}
	if res, _ := p["result"].(map[string]any); res["resultType"] != "complete" || res["structuredContent"].(map[string]any)["amount"] != float64(7) {
		t.Errorf("the terminal notification's result: %v", p["result"])
	}
	if end := nextMsg(t, alice); end["id"] != "listen:1" || end["result"] == nil {
		t.Errorf("alice's listen ended with %v, want its result", end)
	}
}

// TestTask_ListenOtherReplica: a listen served by one layer reports a task
// that another layer on the same database runs and ends (another process,
// or a replica on PostgreSQL), from the row, within listenPoll.
func TestTask_ListenOtherReplica(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	g := newGate()
	runner := taskSetup(t, db, outbox.TasksAlways, &ledger.Options{Gate: g.hold})
	other := taskSetup(t, db, outbox.TasksAlways, nil)
	created := result(t, httpPeer(t, httpTaskServer(t, runner.server), "alice").charge(true, "listen-replica", 8))
	id, _ := created["taskId"].(string)
	g.waitReached(t)
	msgs := listen(t, httpTaskServer(t, other.server), "alice", id)
	if ack := nextMsg(t, msgs); ack["method"] != "notifications/subscriptions/acknowledged" {
		t.Fatalf("first message %v, want the acknowledgement", ack)
	}
	if n := nextMsg(t, msgs); n["params"].(map[string]any)["status"] != "working" {
		t.Fatalf("got %v, want the task working", n)
	}
	close(g.release)
	if n := nextMsg(t, msgs); n["method"] != "notifications/tasks" || n["params"].(map[string]any)["status"] != "completed" {
		t.Fatalf("got %v, want the task completed", n)
	}
}
