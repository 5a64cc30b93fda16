package tasknote

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

func TestRewrite(t *testing.T) {
	p, err := Progress("notifications/tasks/status", map[string]any{"taskId": "task_X", "status": "completed"})
	if err != nil {
		t.Fatal(err)
	}
	params, _ := json.Marshal(p)
	marker := &jsonrpc.Request{Method: "notifications/progress", Params: params}
	out, ok := Rewrite(marker).(*jsonrpc.Request)
	if !ok || out.Method != "notifications/tasks/status" || out.ID.IsValid() {
		t.Fatalf("Rewrite = %#v, want the status notification", out)
	}
	var got map[string]any
	if err := json.Unmarshal(out.Params, &got); err != nil || got["taskId"] != "task_X" || got["status"] != "completed" || len(got) != 2 {
		t.Fatalf("params %s (%v), want the task's fields only", out.Params, err)
	}

	// Anything else passes unchanged: a client's own progress, a request.
	plain := &jsonrpc.Request{Method: "notifications/progress", Params: json.RawMessage(`{"progressToken":1,"progress":2}`)}
	if Rewrite(plain) != jsonrpc.Message(plain) {
		t.Error("a plain progress notification was rewritten")
	}
	id, _ := jsonrpc.MakeID(float64(3))
	call := &jsonrpc.Request{ID: id, Method: "notifications/progress", Params: params}
	if Rewrite(call) != jsonrpc.Message(call) {
		t.Error("a request with an id was rewritten")
	}

	// As go-sdk writes it on a Server-Sent Events stream.
	b, _ := jsonrpc.EncodeMessage(marker)
	event := append(append([]byte("event: message\nid: 7\ndata: "), b...), "\n\n"...)
	ev, changed := RewriteEvent(event)
	if !changed || !bytes.HasPrefix(ev, []byte("event: message\nid: 7\ndata: {")) || !bytes.HasSuffix(ev, []byte("}\n\n")) ||
		!bytes.Contains(ev, []byte(`"method":"notifications/tasks/status"`)) || bytes.Contains(ev, []byte(MetaKey)) {
		t.Fatalf("RewriteEvent = %q", ev)
	}
	other := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
	if ev, changed := RewriteEvent(other); changed || !bytes.Equal(ev, other) {
		t.Errorf("RewriteEvent changed %q to %q", other, ev)
	}
}
