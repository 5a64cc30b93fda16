package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// callWithMeta calls the ledger's charge with meta as params._meta.
func callWithMeta(t *testing.T, cs *mcp.ClientSession, amount int, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": amount}, Meta: meta})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// rowToolCallID is the tool_call_id of the call with key (of principal local).
func rowToolCallID(t *testing.T, b *bundle, key string) string {
	t.Helper()
	var id string
	if err := b.db.Read.QueryRow(`SELECT tool_call_id FROM calls WHERE principal = 'local' AND key = $1`, key).Scan(&id); err != nil {
		t.Fatalf("tool_call_id of %q: %v", key, err)
	}
	return id
}

// Claude Code sends the model's tool_use id in _meta["claudecode/toolUseId"].
// The row keeps the id of the attempt that ran the call; every call event
// and span carries its own request's id, so a replay's names the retry;
// the status tool reports the row's. It is never a key: a retry with
// another id (as a model's retry always has) is still replayed, with a key
// and without one.
func TestToolCallID_RecordedNotAKey(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	tp, sr := recordingProvider(t)
	b := setup(t, &outbox.Options{Logger: logs.logger(), TracerProvider: tp}, nil)

	first := callWithMeta(t, b.session, 100, mcp.Meta{outbox.MetaKeyIdempotency: "order-1", "claudecode/toolUseId": "toolu_01AAA"})
	if first.IsError {
		t.Fatal(text(first))
	}
	again := callWithMeta(t, b.session, 100, mcp.Meta{outbox.MetaKeyIdempotency: "order-1", "claudecode/toolUseId": "toolu_01BBB"})
	if callMeta(again)["replayed"] != true {
		t.Fatalf("retry with another tool-call id: %s, want a replay", text(again))
	}
	if got := rowToolCallID(t, b, "order-1"); got != "toolu_01AAA" {
		t.Errorf("row's tool_call_id %q, want the executing attempt's toolu_01AAA", got)
	}
	st := status(t, b.session, map[string]any{"key": "order-1"})
	if st.ToolCallID != "toolu_01AAA" {
		t.Errorf("status toolCallId %q, want toolu_01AAA", st.ToolCallID)
	}

	// Without a key: the fingerprint does not see the id either.
	callWithMeta(t, b.session, 7, mcp.Meta{"claudecode/toolUseId": "toolu_01CCC"})
	keyless := callWithMeta(t, b.session, 7, mcp.Meta{"claudecode/toolUseId": "toolu_01DDD"})
	if callMeta(keyless)["replayed"] != true {
		t.Fatalf("identical keyless call with another tool-call id: %s, want a replay", text(keyless))
	}
	if charges(t, b) != 2 {
		t.Errorf("charges = %d, want 2", charges(t, b))
	}
	canonical, _ := callkey.Canonical([]byte(`{"amount":7}`))
	if got := rowToolCallID(t, b, callkey.Fingerprint("local", "charge", canonical)); got != "toolu_01CCC" {
		t.Errorf("keyless row's tool_call_id %q, want toolu_01CCC", got)
	}
	// Same key, other arguments: a conflict, whatever the id.
	if res := callWithMeta(t, b.session, 999, mcp.Meta{outbox.MetaKeyIdempotency: "order-1", "claudecode/toolUseId": "toolu_01AAA"}); errorCode(res) != "key_conflict" {
		t.Errorf("key reused with other arguments and the same tool-call id: %s", text(res))
	}

	var ids []string
	for _, r := range logs.records(t, "call") {
		if r["tool"] == "charge" {
			id, _ := r["tool_call_id"].(string)
			ids = append(ids, id+"/"+r["outcome"].(string))
		}
	}
	want := "toolu_01AAA/executed toolu_01BBB/replayed toolu_01CCC/executed toolu_01DDD/replayed toolu_01AAA/conflict"
	if got := strings.Join(ids, " "); got != want {
		t.Errorf("call events' tool_call_id/outcome: %s, want %s", got, want)
	}
	var spanIDs []string
	for _, s := range spansNamed(sr, "tools/call charge") {
		spanIDs = append(spanIDs, attrsOf(s)["gen_ai.tool.call.id"].AsString())
	}
	if got := strings.Join(spanIDs, " "); got != "toolu_01AAA toolu_01BBB toolu_01CCC toolu_01DDD toolu_01AAA" {
		t.Errorf("spans' gen_ai.tool.call.id: %s", got)
	}
}

// What a host may put under the key: an over-long id is cut to 200 bytes
// at a character boundary, control characters (NUL would fail PostgreSQL's
// text) and format characters (a bidirectional override would spoof the
// operator's view: issue 37) are dropped, and a value that is not a string
// is ignored. None of it costs the call.
func TestToolCallID_BadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	long := "toolu_" + strings.Repeat("é", 150) // 306 bytes
	for i, tc := range []struct {
		id   any
		want string
	}{
		{long, ""},
		{"toolu_\x00a\nb\tc\u2028d", "toolu_abc\u2028d"},
		{"  ", ""},
		{42, ""},
		{map[string]any{"id": "toolu_x"}, ""},
		{nil, ""},
		{"toolu_\xff", "toolu_\uFFFD"},
		{"x\u202egpj.exe", "xgpj.exe"},
		{"toolu_\u200b\u2066a\u2069\ufeff\u00ad\U000E0001", "toolu_a"},
	} {
		key := "bad-" + string(rune('a'+i))
		res := callWithMeta(t, b.session, 10+i, mcp.Meta{outbox.MetaKeyIdempotency: key, "claudecode/toolUseId": tc.id})
		if res.IsError {
			t.Fatalf("id %v: %s", tc.id, text(res))
		}
		got := rowToolCallID(t, b, key)
		if tc.id == long {
			if len(got) > 200 || len(got) < 199 || !utf8.ValidString(got) || !strings.HasPrefix(long, got) {
				t.Errorf("over-long id stored as %q (%d bytes), want its first 200 bytes or fewer, whole characters", got, len(got))
			}
			continue
		}
		if got != tc.want {
			t.Errorf("id %#v stored as %q, want %q", tc.id, got, tc.want)
		}
	}
}

// An attempt that takes over an abandoned claim runs the call: the row
// then names its tool-call id.
func TestToolCallID_Takeover(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	canonical, _ := callkey.Canonical([]byte(`{"amount":100}`))
	now := time.Now().UnixMilli()
	// An owner nobody knows, whose lease has passed: any store takes it over.
	if _, err := b.db.Write.Exec(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at, tool_call_id)
		VALUES ('call_gone', 'local', 'abandoned', 'meta', 'charge', $1, 'in_flight', 'elsewhere#1', $2, $3, $4, 'toolu_first')`,
		callkey.ArgsHash(canonical), now-1, now, now+time.Hour.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	res := callWithMeta(t, b.session, 100, mcp.Meta{outbox.MetaKeyIdempotency: "abandoned", "claudecode/toolUseId": "toolu_second"})
	if res.IsError || callMeta(res)["replayed"] != false {
		t.Fatalf("takeover: %s", text(res))
	}
	if got := rowToolCallID(t, b, "abandoned"); got != "toolu_second" {
		t.Errorf("tool_call_id after the takeover %q, want toolu_second", got)
	}
}
