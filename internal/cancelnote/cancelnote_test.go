package cancelnote

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func call(t *testing.T, id int, params string) *jsonrpc.Request {
	t.Helper()
	jid, err := jsonrpc.MakeID(float64(id))
	if err != nil {
		t.Fatal(err)
	}
	return &jsonrpc.Request{ID: jid, Method: "tools/call", Params: json.RawMessage(params)}
}

func cancel(requestID any, reason string) *jsonrpc.Request {
	b, _ := json.Marshal(map[string]any{"requestId": requestID, "reason": reason})
	return &jsonrpc.Request{Method: "notifications/cancelled", Params: b}
}

// meta decodes the _meta the SDK would hand the layer.
func meta(t *testing.T, req *jsonrpc.Request) mcp.Meta {
	t.Helper()
	var p struct {
		Meta mcp.Meta `json:"_meta"`
	}
	if err := json.Unmarshal(req.Params, &p); err != nil {
		t.Fatal(err)
	}
	return p.Meta
}

func TestTracker_CancelReachesTheLayer(t *testing.T) {
	tr := NewTracker()
	req := call(t, 7, `{"name":"charge","_meta":{"io.github.mcp-outbox/request":"forged","k":1}}`)
	tr.Read(req)
	m := meta(t, req)
	if m["k"] != float64(1) {
		t.Errorf("the client's _meta lost a member: %v", m)
	}
	note := Take(m)
	if note == nil {
		t.Fatal("no note for a tracked call: the client's forged handle was kept")
	}
	if _, ok := m[MetaKey]; ok {
		t.Error("Take left the handle in _meta, where the handler would see it")
	}
	if Take(meta(t, req)) != nil {
		t.Error("a handle was taken twice")
	}
	tr.Read(cancel(8, "not this one"))
	if _, ok := note.Cancelled(); ok {
		t.Error("a cancel of another id reached the call")
	}
	tr.Read(cancel(7, "SdkError: Request timed out"))
	if reason, ok := note.Cancelled(); !ok || reason != "SdkError: Request timed out" {
		t.Errorf("Cancelled() = %q, %v", reason, ok)
	}
	if !tr.Answer(&jsonrpc.Response{ID: req.ID}) {
		t.Error("the answer to a cancelled request is not withheld")
	}
	if tr.Len() != 0 {
		t.Errorf("%d requests tracked after the answer", tr.Len())
	}
}

func TestTracker_DuplicateIDKeepsTheFirst(t *testing.T) {
	tr := NewTracker()
	first := call(t, 1, `{"name":"a"}`)
	second := call(t, 1, `{"name":"b"}`)
	tr.Read(first)
	tr.Read(second)
	if Take(meta(t, second)) != nil {
		t.Error("the duplicate's handle is live")
	}
	n := Take(meta(t, first))
	tr.Read(cancel(1, "x"))
	if _, ok := n.Cancelled(); !ok {
		t.Error("the cancel did not reach the first request")
	}
}

func TestSessionTracker_EndsWhenTheLayerIsDone(t *testing.T) {
	emptied := 0
	tr := NewSessionTracker(func(*Tracker) { emptied++ })
	taken := call(t, 1, `{"name":"a"}`)
	untaken := call(t, 2, `{"name":"b"}`)
	tr.Read(taken)
	tr.Read(untaken)
	note := Take(meta(t, taken))
	// The POSTs end: the call the layer never took goes, the other stays,
	// so that a later cancel still finds it.
	tr.Drop(taken.ID, untaken.ID)
	if tr.Len() != 1 || emptied != 0 {
		t.Fatalf("after Drop: %d tracked, emptied %d times; want 1, 0", tr.Len(), emptied)
	}
	tr.Read(cancel(1, "timeout"))
	if _, ok := note.Cancelled(); !ok {
		t.Error("a cancel after the POST ended did not reach the call")
	}
	note.Done()
	note.Done()
	if tr.Len() != 0 || emptied != 1 {
		t.Errorf("after Done: %d tracked, emptied %d times; want 0, 1", tr.Len(), emptied)
	}
	var none *Note
	none.Done() // a request that came through no tracker
	if _, ok := none.Cancelled(); ok {
		t.Error("a nil note reports a cancel")
	}
}

func TestTimedOut(t *testing.T) {
	for reason, want := range map[string]bool{
		"SdkError: Request timed out":                   true,
		"McpError: MCP error -32001: Request timed out": true,
		"context deadline exceeded":                     true,
		"Timeout":                                       true,
		"context canceled":                              false,
		"AbortError: This operation was aborted":        false,
		"":                                              false,
	} {
		if got := TimedOut(reason); got != want {
			t.Errorf("TimedOut(%q) = %v, want %v", reason, got, want)
		}
	}
}

// BenchmarkTrackerRead is what tracking costs a tools/call on stdio: the
// params decoded and encoded once more, to carry the handle.
func BenchmarkTrackerRead(b *testing.B) {
	tr := NewTracker()
	const params = `{"name":"charge","arguments":{"amount":4200,"currency":"usd"},"_meta":{"progressToken":3,"claudecode/toolUseId":"toolu_01xxxxxxxxxxxxxxxxxxxx","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}`
	id, _ := jsonrpc.MakeID(float64(1))
	for b.Loop() {
		req := &jsonrpc.Request{ID: id, Method: "tools/call", Params: json.RawMessage(params)}
		tr.Read(req)
		tr.Answer(&jsonrpc.Response{ID: id})
	}
}
