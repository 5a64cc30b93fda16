package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestProxyReplayNote: through `mcp-outbox proxy`, the TypeScript and Python
// upstreams' charge (output schemas with additionalProperties false, from
// zod and pydantic) lists the replay note's property; a retry with a new
// tool-call id, as a model's retry has, is replayed with the note in its
// structured content (all Claude Code shows the model), valid against the
// listed schema; and the call's row keeps the tool-call id of the attempt
// that ran it.
func TestProxyReplayNote(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyReplayNote)
}

func testProxyReplayNote(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	cs := f.connectProxy(t, f.proxyCommand(t, bin, nil, "--cooperating"), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]string{}
	for _, tl := range tools.Tools {
		b, _ := json.Marshal(tl.OutputSchema)
		schemas[tl.Name] = string(b)
	}
	charge := schemas["charge"]
	if !strings.Contains(charge, `"additionalProperties":false`) || !strings.Contains(charge, `"`+outbox.ReplayNoteProperty+`":{`) {
		t.Fatalf("charge's output schema through the proxy: %s, want the upstream's strict one with %q", charge, outbox.ReplayNoteProperty)
	}
	if strings.Contains(schemas["get_balance"], outbox.ReplayNoteProperty) {
		t.Errorf("the read-only get_balance's schema changed: %s", schemas["get_balance"])
	}
	var s jsonschema.Schema
	if err := json.Unmarshal([]byte(charge), &s); err != nil {
		t.Fatal(err)
	}
	resolved, err := s.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	structured := func(res *mcp.CallToolResult) map[string]any {
		t.Helper()
		b, _ := json.Marshal(res.StructuredContent)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("structured content %s: %v", b, err)
		}
		if err := resolved.Validate(v); err != nil {
			t.Errorf("structured content %s against the listed schema: %v", b, err)
		}
		return v
	}

	p := tsCharge("note-1", "ada", 500)
	p.Meta["claudecode/toolUseId"] = "toolu_01First"
	first := mustSucceed(t, cs, p)
	wantReplay(t, first, false, "meta")
	if v := structured(first); v[outbox.ReplayNoteProperty] != nil {
		t.Errorf("first answer carries a note: %v", v)
	}
	p.Meta["claudecode/toolUseId"] = "toolu_01Retry"
	again := mustSucceed(t, cs, p)
	wantReplay(t, again, true, "meta")
	v := structured(again)
	note, _ := v[outbox.ReplayNoteProperty].(string)
	if !strings.HasPrefix(note, "[mcp-outbox] Replayed: ") || !strings.Contains(resultText(again), note) {
		t.Errorf("replay's note %q (content %q)", note, resultText(again))
	}
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	var id string
	if err := f.db.QueryRow(`SELECT tool_call_id FROM calls WHERE key = 'note-1'`).Scan(&id); err != nil || id != "toolu_01First" {
		t.Errorf("calls.tool_call_id = %q (%v), want the executing attempt's toolu_01First", id, err)
	}
	if st := callStatus(t, cs, "note-1"); st["toolCallId"] != "toolu_01First" {
		t.Errorf("call_status toolCallId = %v, want toolu_01First", st["toolCallId"])
	}
}
