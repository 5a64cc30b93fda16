package outbox

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// answers returns every answer the layer gives about a, by name.
func answers(a *attempt) map[string]*mcp.CallToolResult {
	r := callRow{uid: "call_x", tool: a.tool.name, state: "completed", result: sql.NullString{String: `{"content":[]}`, Valid: true},
		createdAt: 1, completedAt: sql.NullInt64{Int64: 2, Valid: true}, expiresAt: 3}
	other := r
	other.tool = "other_tool"
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	return map[string]*mcp.CallToolResult{
		"replay":        replay(r, a),
		"join":          replay(r, &attempt{tool: a.tool, id: a.id, uid: a.uid, outcome: outcomeJoined}),
		"unreadable":    unreadableResult(r, a.id, errors.New("bad json")),
		"conflict":      conflictError(other, a),
		"inProgress":    inProgressError(a),
		"writerBusy":    writerBusyError(a, time.Second),
		"unknown":       unknownError(r, a),
		"cancelledWait": waitFor(cancelled, make(chan struct{}), time.Now().Add(time.Hour), a),
		"ownershipLost": a.notCommitted(ErrOwnershipLost),
		"commitUnknown": a.notCommitted(&commitUnknownError{errors.New("connection reset")}),
		"txFailed":      a.notCommitted(&txError{errors.New("disk I/O error")}),
		"handlerFailed": a.handlerFailed(),
	}
}

func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// A call that came without a key is known by a fingerprint the client never
// saw: no answer about it may call that a key, show it, or advise a new key.
func TestAnswers_Keyless(t *testing.T) {
	fp := strings.Repeat("f", 64)
	a := &attempt{tool: &toolInfo{name: "charge"}, uid: "call_x",
		id: callIdentity{principal: "local", key: fp, source: callkey.SourceFingerprint}}
	for name, res := range answers(a) {
		got := textOf(res)
		for _, bad := range []string{fp, "idempotency key \"", "new key", "same key", "of key", "with key"} {
			if strings.Contains(got, bad) {
				t.Errorf("%s: %q says %q", name, got, bad)
			}
		}
	}
	for name, want := range map[string]string{
		"replay":     "Identical calls without a key replay it until 1970-01-01T00:00:00Z",
		"join":       "[mcp-outbox] Joined: an earlier attempt of an identical call (same tool and arguments, no idempotency key) was still running",
		"inProgress": "an identical call (same tool and arguments, sent without an idempotency key) is still in progress",
		"unknown":    "Identical calls without an idempotency key get this answer until 1970-01-01T00:00:00Z, the end of the fingerprint window",
		"writerBusy": "this call (sent without an idempotency key) was not recorded",
	} {
		if got := textOf(answers(a)[name]); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want it to say %q", name, got, want)
		}
	}
}

// A call with a key is named by it wherever the answer sends the client to
// the status tool or to a retry.
func TestAnswers_Keyed(t *testing.T) {
	a := &attempt{tool: &toolInfo{name: "charge"}, uid: "call_x",
		id: callIdentity{principal: "local", key: "order-7", source: callkey.SourceMeta}}
	all := answers(a)
	for _, name := range []string{"replay", "join", "unreadable", "conflict", "inProgress", "writerBusy", "unknown", "cancelledWait", "ownershipLost", "commitUnknown"} {
		if got := textOf(all[name]); !strings.Contains(got, `"order-7"`) {
			t.Errorf("%s: %q does not name the key", name, got)
		}
	}
	for _, name := range []string{"txFailed", "handlerFailed"} {
		got := textOf(all[name])
		if !strings.Contains(got, "call_x") || strings.Contains(got, "disk I/O") {
			t.Errorf("%s: %q, want the call id and not the driver's text", name, got)
		}
	}
}
