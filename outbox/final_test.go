package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// verdict is what the "verdict" test tool does on its next run.
type verdict int32

const (
	verdictOK        verdict = iota
	verdictBadSQL            // runs a statement on a table that does not exist, returns its error
	verdictPlain             // returns a plain Go error
	verdictFinal             // returns an error marked Final
	verdictErrResult         // returns a result with IsError
)

type verdictTool struct {
	next atomic.Int32
	runs atomic.Int32
}

// addVerdict adds a tool that writes a charge, then does what v.next says.
func addVerdict(l *outbox.Layer, s *mcp.Server, name string, ann *mcp.ToolAnnotations) *verdictTool {
	v := &verdictTool{}
	outbox.AddTool(l, s, &mcp.Tool{Name: name, Description: "test tool", Annotations: ann},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
			v.runs.Add(1)
			if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0)`); err != nil {
				return nil, struct{}{}, fmt.Errorf("record charge: %w", err)
			}
			switch verdict(v.next.Load()) {
			case verdictBadSQL:
				if _, err := tx.ExecContext(ctx, `INSERT INTO no_such_table (x) VALUES (1)`); err != nil {
					return nil, struct{}{}, fmt.Errorf("record audit: %w", err)
				}
				return nil, struct{}{}, errors.New("the bad statement ran")
			case verdictPlain:
				return nil, struct{}{}, errors.New("secret: upstream token abc123 refused")
			case verdictFinal:
				return nil, struct{}{}, outbox.Final(errors.New("card declined"))
			case verdictErrResult:
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "over the limit"}}}, struct{}{}, nil
			}
			return nil, struct{}{}, nil
		}, nil)
	return v
}

// TestHandlerErrors checks the rule of "What is recorded": an unmarked
// error leaves nothing, hides its text and lets a retry run the call; a
// Final error and an isError result are the call's recorded outcome.
func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		v      verdict
		leaked []string // texts that must not reach the client
	}{
		{"BadStatement", verdictBadSQL, []string{"no_such_table", "no such table", "does not exist", "record audit"}},
		{"PlainError", verdictPlain, []string{"abc123", "secret"}},
	} {
		t.Run(tc.name+"NotRecorded", func(t *testing.T) {
			t.Parallel()
			var logs logBuffer
			b := setup(t, &outbox.Options{Logger: logs.logger()}, nil)
			v := addVerdict(b.layer, b.server, "verdict", nil)
			v.next.Store(int32(tc.v))

			res := call(t, b.session, "verdict", "v1", map[string]any{})
			if !res.IsError || errorCode(res) != "not_recorded" {
				t.Fatalf("answer = %v %q, want a not_recorded error", res.Meta, text(res))
			}
			for _, s := range tc.leaked {
				if strings.Contains(text(res), s) {
					t.Errorf("answer %q leaks %q", text(res), s)
				}
			}
			recs := logs.records(t, "tool handler failed; nothing recorded")
			if len(recs) != 1 {
				t.Fatalf("%d log records of the failure, want 1:\n%s", len(recs), logs.String())
			}
			id, _ := recs[0]["call_id"].(string)
			if !strings.HasPrefix(id, "call_") || !strings.Contains(text(res), id) {
				t.Errorf("answer %q does not name the logged call id %q", text(res), id)
			}
			if e, _ := recs[0]["error"].(string); !strings.Contains(e, tc.leaked[0]) {
				t.Errorf("logged error = %q, want the handler's (%q)", e, tc.leaked[0])
			}
			if n := count(t, b.db.Read, `SELECT count(*) FROM calls`); n != 0 {
				t.Errorf("calls rows = %d, want 0: the claim must be released", n)
			}
			if n := charges(t, b); n != 0 {
				t.Errorf("charges = %d, want 0: the handler's write must roll back", n)
			}

			v.next.Store(int32(verdictOK))
			again := call(t, b.session, "verdict", "v1", map[string]any{})
			if again.IsError || callMeta(again)["replayed"] != false {
				t.Fatalf("retry = %q %v, want a new successful run", text(again), callMeta(again))
			}
			if got := v.runs.Load(); got != 2 {
				t.Errorf("handler runs = %d, want 2", got)
			}
			if n := charges(t, b); n != 1 {
				t.Errorf("charges after the retry = %d, want 1", n)
			}
		})
	}

	for _, tc := range []struct {
		name string
		v    verdict
		want string
	}{
		{"FinalError", verdictFinal, "card declined"},
		{"IsErrorResult", verdictErrResult, "over the limit"},
	} {
		t.Run(tc.name+"Recorded", func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, nil)
			v := addVerdict(b.layer, b.server, "verdict", nil)
			v.next.Store(int32(tc.v))

			res := call(t, b.session, "verdict", "v1", map[string]any{})
			if !res.IsError || !strings.Contains(text(res), tc.want) || callMeta(res)["state"] != "failed" {
				t.Fatalf("answer = %q %v, want the recorded failure %q", text(res), res.Meta, tc.want)
			}
			if n := charges(t, b); n != 0 {
				t.Errorf("charges = %d, want 0: a failed call keeps nothing of its work", n)
			}
			v.next.Store(int32(verdictOK)) // a run now would succeed: the replay must not run
			again := call(t, b.session, "verdict", "v1", map[string]any{})
			if !again.IsError || callMeta(again)["replayed"] != true || !strings.Contains(text(again), tc.want) {
				t.Fatalf("retry = %q %v, want the failure replayed", text(again), callMeta(again))
			}
			if got := v.runs.Load(); got != 1 {
				t.Errorf("handler runs = %d, want 1", got)
			}
		})
	}

	// A tool that is never recorded (idempotentHint) rolls back the same
	// way and hides the text the same way.
	t.Run("UnrecordedToolPlainError", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil)
		v := addVerdict(b.layer, b.server, "verdict", &mcp.ToolAnnotations{IdempotentHint: true})
		v.next.Store(int32(verdictPlain))
		res := call(t, b.session, "verdict", "", map[string]any{})
		if !res.IsError || strings.Contains(text(res), "abc123") || !strings.Contains(text(res), "call_") {
			t.Fatalf("answer = %q, want a generic error naming the call", text(res))
		}
		if n := charges(t, b); n != 0 {
			t.Errorf("charges = %d, want 0", n)
		}
	})
}

func TestFinal(t *testing.T) {
	t.Parallel()
	if outbox.Final(nil) != nil {
		t.Error("Final(nil) != nil")
	}
	base := errors.New("card declined")
	err := outbox.Final(fmt.Errorf("charge: %w", base))
	if !errors.Is(err, base) || err.Error() != "charge: card declined" {
		t.Errorf("Final(err) = %v, want it to wrap err and keep its text", err)
	}
}

// The answers and call_status texts of a call made without a key speak of
// identical calls, never of a key the client did not send.
func TestKeylessWords(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	args := map[string]any{"amount": 100}
	status := func() string {
		t.Helper()
		res := call(t, b.session, outbox.StatusToolName, "", map[string]any{"tool": "charge", "arguments": args})
		m, _ := res.StructuredContent.(map[string]any)
		msg, _ := m["message"].(string)
		if res.IsError || msg == "" {
			t.Fatalf("call_status: %s", text(res))
		}
		return msg
	}
	noKeyTalk := func(what, s string) {
		t.Helper()
		for _, bad := range []string{"same key", "new key", "idempotency key \""} {
			if strings.Contains(s, bad) {
				t.Errorf("%s: %q says %q", what, s, bad)
			}
		}
	}

	if res := callCharge(t, b.session, "", 100); res.IsError {
		t.Fatal(text(res))
	}
	replayed := call(t, b.session, "charge", "", args)
	if !strings.Contains(text(replayed), "Identical calls without a key replay it until") {
		t.Errorf("replay: %q, want it to say until when identical calls replay", text(replayed))
	}
	noKeyTalk("replay", text(replayed))
	if msg := status(); !strings.Contains(msg, "an identical call (same tool and arguments, without a key) made before expiresAt replays it") {
		t.Errorf("status of a completed keyless call: %q", msg)
	} else {
		noKeyTalk("status completed", msg)
	}

	if _, err := b.db.Write.Exec(`UPDATE calls SET state = 'unknown' WHERE key_source = 'fingerprint'`); err != nil {
		t.Fatal(err)
	}
	unknown := call(t, b.session, "charge", "", args)
	if errorCode(unknown) != "outcome_unknown" || !strings.Contains(text(unknown), "Identical calls without an idempotency key get this answer until") {
		t.Errorf("unknown: %v %q", unknown.Meta, text(unknown))
	}
	noKeyTalk("unknown", text(unknown))
	if msg := status(); !strings.Contains(msg, "an identical call (same tool and arguments, without a key) made before expiresAt "+
		"gets an \"outcome unknown\" error, and after that runs as a new call") {
		t.Errorf("status of an unknown keyless call: %q", msg)
	} else {
		noKeyTalk("status unknown", msg)
	}

	// Past the fingerprint window, an identical call is a new call, as it
	// is after a completed one; the unknown call stays for an operator.
	if _, err := b.db.Write.Exec(`UPDATE calls SET expires_at = 0 WHERE state = 'unknown'`); err != nil {
		t.Fatal(err)
	}
	fresh := call(t, b.session, "charge", "", args)
	if fresh.IsError || callMeta(fresh)["replayed"] != false {
		t.Fatalf("identical call past the window of an unknown one: %v %q, want a new run", fresh.Meta, text(fresh))
	}
	if n := charges(t, b); n != 2 {
		t.Errorf("charges = %d, want 2", n)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE state = 'unknown' AND key LIKE '%/call_%'`); n != 1 {
		t.Errorf("unknown calls set aside = %d, want 1", n)
	}

	res := call(t, b.session, outbox.StatusToolName, "", map[string]any{"tool": "charge", "arguments": map[string]any{"amount": 7}})
	m, _ := res.StructuredContent.(map[string]any)
	if msg, _ := m["message"].(string); !strings.HasPrefix(msg, "No identical call (same tool and arguments, without a key)") {
		t.Errorf("status of a keyless call never made: %q", msg)
	}
}
