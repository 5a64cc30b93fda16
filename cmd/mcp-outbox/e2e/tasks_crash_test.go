package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// crashTaskPeer posts 2026-07-28 requests (stateless Streamable HTTP,
// per-request _meta) to a serve, as @modelcontextprotocol/ext-tasks does.
type crashTaskPeer struct {
	t   *testing.T
	url string
	id  atomic.Int64
}

func (p *crashTaskPeer) do(method string, params map[string]any, tasks bool) (map[string]any, error) {
	caps := map[string]any{}
	if tasks {
		caps["extensions"] = map[string]any{outbox.ExtensionTasks: map[string]any{}}
	}
	meta, _ := params["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
	meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "tasks-crash", "version": "0"}
	meta["io.modelcontextprotocol/clientCapabilities"] = caps
	params["_meta"] = meta
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": p.id.Add(1), "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, p.url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name, ok := params["name"].(string); ok {
		req.Header.Set("Mcp-Name", name)
	} else if id, ok := params["taskId"].(string); ok {
		req.Header.Set("Mcp-Name", id)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	text := string(raw)
	if i := strings.Index(text, "data: "); i >= 0 {
		text = strings.TrimSpace(strings.SplitN(text[i+len("data: "):], "\n", 2)[0])
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		p.t.Fatalf("%s: %s: %s", method, resp.Status, raw)
	}
	r, ok := m["result"].(map[string]any)
	if !ok {
		p.t.Fatalf("%s: no result: %s", method, raw)
	}
	return r, nil
}

// TestTasks_SurviveSIGKILL: a charge made as a task; serve is SIGKILLed
// at a point of the task's path; a new serve on the same database takes
// over what is left (the owner's process is gone), and the task completes
// with exactly one charge and one delivery:
//
//   - call.after_claim: the task is durable but its CreateTaskResult never
//     left; the client's retry with the same key recovers the handle;
//   - call.before_commit: inside the task's handler, after the answer;
//     the new serve runs the task again from its stored params;
//   - call.after_commit: the task committed; nothing runs again.
func TestTasks_SurviveSIGKILL(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"sqlite", "postgres"} {
		for _, fp := range []string{failpoint.CallAfterClaim, failpoint.CallBeforeCommit, failpoint.CallAfterCommit} {
			t.Run(store+"/"+fp, func(t *testing.T) {
				t.Parallel()
				testTaskSIGKILL(t, store, fp)
			})
		}
	}
}

// testTaskSIGKILL runs the case on store. On PostgreSQL the second serve
// stands for another replica: it cannot see the first one's process, so it
// takes the task over when its lease (1 s here) has passed.
func testTaskSIGKILL(t *testing.T, store, fp string) {
	fake := downstream.Start(t, nil)
	dest := paymentsDest(fake, "timeout=1s")
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	var env []string
	if store == "postgres" {
		if testing.Short() {
			t.Skip("starts PostgreSQL")
		}
		dbPath = pgtest.Database(t)
		env = []string{"MCP_OUTBOX_LEASE=1s"}
	}
	charge := func() map[string]any {
		return map[string]any{"name": "charge", "arguments": map[string]any{"amount": 4200},
			"_meta": map[string]any{outbox.MetaKeyIdempotency: "task-crash-1"}}
	}

	url, cmd := startHTTP(t, failpointBin, dbPath, append(env, failpoint.EnvVar+"="+fp+"=crash"),
		// The delay keeps the handler (and a kill in it) after the answer is out.
		"--task", "charge=always", "--demo-delay", "1s", "--dest", dest)
	p := &crashTaskPeer{t: t, url: url}
	created, err := p.do("tools/call", charge(), true)
	id, _ := created["taskId"].(string)
	switch {
	case fp == failpoint.CallAfterClaim:
		if err == nil {
			t.Fatalf("answered despite the kill: %v", created)
		}
	case err != nil:
		t.Fatal(err)
	case created["resultType"] != "task" || id == "":
		t.Fatalf("CreateTaskResult = %v", created)
	}
	_ = cmd.Wait()
	wantKilled(t, cmd)
	db := openLedgerDB(t, dbPath)
	if fp != failpoint.CallAfterCommit {
		if n := countRows(t, db, `SELECT count(*) FROM calls WHERE task_id IS NOT NULL AND state = 'in_flight' AND task_params IS NOT NULL`); n != 1 {
			t.Fatalf("after the kill the task is not in flight with its params (%d rows)", n)
		}
		if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 0 {
			t.Fatalf("charges = %d after a kill before the commit", n)
		}
	}

	url2, _ := startHTTP(t, bin, dbPath, env, "--task", "charge=always", "--dest", dest)
	p2 := &crashTaskPeer{t: t, url: url2}
	// A retry of the same call, as a client whose handle was lost makes:
	// the same task, never a second one.
	again, err := p2.do("tools/call", charge(), true)
	if err != nil {
		t.Fatal(err)
	}
	if id == "" {
		id, _ = again["taskId"].(string)
	}
	if again["resultType"] != "task" || again["taskId"] != id {
		t.Fatalf("retry after restart = %v, want task %q", again, id)
	}
	deadline := time.Now().Add(30 * time.Second)
	var got map[string]any
	for {
		if got, err = p2.do("tasks/get", map[string]any{"taskId": id}, true); err != nil {
			t.Fatal(err)
		}
		if got["status"] != "working" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling, as a client does
	}
	if got["status"] != "completed" {
		t.Fatalf("task after restart = %v", got)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE task_id IS NOT NULL`); n != 1 {
		t.Errorf("%d tasks, want 1", n)
	}
	if store == "sqlite" {
		waitEffects(t, db, 1, 30*time.Second, "delivered")
		wantExactlyOnce(t, db, fake, 1) // its checks read the effect's body with SQLite's json_extract
		return
	}
	// On PostgreSQL the killed replica's dispatcher may have leased the
	// effect (after call.after_commit), which another replica reclaims only
	// when the dispatcher's lease passes: the dispatcher's tests cover that.
	// Here: one charge, one effect, and no second key at the destination.
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges = %d, want 1", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if keys := fake.Keys(); len(keys) > 1 {
		t.Errorf("the destination saw keys %v, want at most one", keys)
	}
}
