package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

// riddenOut is the layer's log message for a cancel a running call rode out.
const riddenOut = "client cancelled a running call; it runs to its end and is recorded, and a retry gets its outcome"

// TestCancel_Policies sends, over stdio, the cancel each client sends, and
// checks what the tool's CancelPolicy makes of it: a call that rides it out
// commits once and its retry gets that outcome; a call that stops keeps
// nothing and its retry runs it. Either way the cancelled request is never
// answered. The first case is Claude Code 2.1.332 at MCP_TOOL_TIMEOUT.
func TestCancel_Policies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy outbox.CancelPolicy
		reason string // "" sends none
		rides  bool
	}{
		{"ClaudeCodeTimeout", outbox.FinishOnTimeout, "SdkError: Request timed out", true},
		{"TypeScriptSDKTimeout", outbox.FinishOnTimeout, "McpError: MCP error -32001: Request timed out", true},
		{"GoSDKDeadline", outbox.FinishOnTimeout, "context deadline exceeded", true},
		{"GoSDKCancel", outbox.FinishOnTimeout, "context canceled", false},
		{"UserAbort", outbox.FinishOnTimeout, "AbortError: This operation was aborted", false},
		{"NoReason", outbox.FinishOnTimeout, "", false},
		{"StopOnCancelTimeout", outbox.StopOnCancel, "SdkError: Request timed out", false},
		{"FinishOnCancelAbort", outbox.FinishOnCancel, "AbortError: This operation was aborted", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &outboxtest.LogBuffer{}
			b := setup(t, &outbox.Options{Logger: logs.Logger()}, nil)
			// A server of its own, whose tools are all there before the
			// raw session connects: a tools/list_changed it never reads
			// would block the server's writes.
			s := b.layer.NewServer(&mcp.Implementation{Name: "cancel", Version: "v0"}, nil)
			g := addGateWith(b.layer, s, &outbox.ToolOptions{OnCancel: tc.policy})
			rs := outboxtest.RawConnect(t, s)

			const params = `{"name":"gate","arguments":{"n":5},"_meta":{"idempotencyKey":"c-1"}}`
			rs.Send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":` + params + `}`)
			<-g.started
			cancel := `{"requestId":2}`
			if tc.reason != "" {
				cancel = fmt.Sprintf(`{"requestId":2,"reason":%q}`, tc.reason)
			}
			rs.Send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":` + cancel + `}`)
			if tc.rides {
				// The handler must not see the cancel: release it only once
				// the layer has decided, or the test proves nothing.
				waitFor(t, func() bool { return len(logs.Records(t, riddenOut)) == 1 })
				defer func() {
					// The call that ran on logs its event after its commit,
					// which may come after the retry that joined it answered.
					ranOn := func() int {
						n := 0
						for _, e := range logs.Records(t, "call") {
							if e["client_cancel"] == tc.reason {
								n++
							}
						}
						return n
					}
					waitFor(t, func() bool { return ranOn() >= 1 })
					if n := ranOn(); n != 1 {
						t.Errorf("%d call events with client_cancel %q, want 1 (the call that ran on): %s", n, tc.reason, logs)
					}
				}()
			} else {
				// The handler saw the cancel and returned; the abandoned
				// attempt deleted its claim.
				waitFor(t, func() bool { return count(t, b.db.Read, `SELECT count(*) FROM calls`) == 0 })
				if got := charges(t, b); got != 0 {
					t.Fatalf("charges after a cancel that stops the call = %d, want 0", got)
				}
				// The log says why the call stopped, with the client's reason.
				stopped := logs.Records(t, "call stopped before its commit; nothing recorded, a retry runs it")
				if len(stopped) != 1 {
					t.Fatalf("stop records %v: want one", stopped)
				}
				if why, _ := stopped[0]["why"].(string); !strings.Contains(why, fmt.Sprintf("%q", tc.reason)) {
					t.Errorf("stop records %v: want one whose why quotes the reason %q", stopped, tc.reason)
				}
			}
			close(g.release)

			rs.Send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":` + params + `}`)
			retry := answerTo(t, rs, 3)
			rs.Send(`{"jsonrpc":"2.0","id":4,"method":"ping"}`)
			answerTo(t, rs, 4)

			var res struct {
				IsError           bool           `json:"isError"`
				StructuredContent gateOut        `json:"structuredContent"`
				Meta              map[string]any `json:"_meta"`
			}
			if err := json.Unmarshal(retry["result"], &res); err != nil || res.IsError {
				t.Fatalf("retry: %s (%v)", retry["result"], err)
			}
			call, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
			if replayed, _ := call["replayed"].(bool); replayed != tc.rides {
				t.Errorf("retry replayed = %v, want %v (the cancelled call %s)", replayed, tc.rides, map[bool]string{true: "ran on", false: "stopped"}[tc.rides])
			}
			wantRuns := int32(2)
			if tc.rides {
				wantRuns = 1
			}
			if got := g.runs.Load(); got != wantRuns {
				t.Errorf("handler ran %d times, want %d", got, wantRuns)
			}
			if got := charges(t, b); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
			var id int64
			if err := b.db.Read.QueryRow(`SELECT id FROM charges`).Scan(&id); err != nil || res.StructuredContent.ID != id {
				t.Errorf("retry answered charge #%d, the table holds #%d (%v)", res.StructuredContent.ID, id, err)
			}
		})
	}
}

// answerTo reads messages until the response to id, and fails the test on
// a response to the cancelled request 2.
func answerTo(t *testing.T, rs *outboxtest.RawSession, id float64) map[string]json.RawMessage {
	t.Helper()
	for {
		m := rs.Read()
		got, isResponse := m["id"].(float64)
		if !isResponse {
			continue // a notification
		}
		if got == 2 {
			t.Fatalf("the server answered request 2, which the client cancelled: %v", m)
		}
		if got == id {
			b, _ := json.Marshal(m)
			var out map[string]json.RawMessage
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
}

// clientTimeout is a context that a test ends as a client's timeout ends
// its request: Err is context.DeadlineExceeded, so the go-sdk client's
// cancel gives the reason "context deadline exceeded".
type clientTimeout struct {
	context.Context
	done chan struct{}
}

func (c *clientTimeout) Done() <-chan struct{} { return c.done }

func (c *clientTimeout) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestCancel_HTTPSession is the TypeScript SDK's timeout over a 2025-11-25
// Streamable HTTP session: its cancel comes in a POST of its own, and
// mcphttp passes its reason to the layer. The go-sdk client sends the same.
func TestCancel_HTTPSession(t *testing.T) {
	t.Parallel()
	for _, timeout := range []bool{true, false} {
		t.Run(map[bool]string{true: "Timeout", false: "Cancel"}[timeout], func(t *testing.T) {
			t.Parallel()
			logs := &outboxtest.LogBuffer{}
			b := setup(t, &outbox.Options{Logger: logs.Logger()}, nil)
			g := addGate(b.layer, b.server)
			srv := httptest.NewServer(mcphttp.NewHandler(b.server, nil))
			t.Cleanup(srv.Close)
			cs := connectHTTP(t, srv.URL, nil)

			var ctx context.Context
			var end func()
			if timeout {
				c := &clientTimeout{Context: context.Background(), done: make(chan struct{})}
				ctx, end = c, func() { close(c.done) }
			} else {
				ctx, end = context.WithCancel(context.Background())
			}
			errc := make(chan error, 1)
			go func() {
				_, err := callErr(ctx, cs, "gate", "h-1", map[string]any{"n": 5})
				errc <- err
			}()
			<-g.started
			end()
			if err := <-errc; err == nil {
				t.Fatal("the client's call ended without an error")
			}
			if timeout {
				waitFor(t, func() bool { return len(logs.Records(t, riddenOut)) == 1 })
			} else {
				waitFor(t, func() bool { return count(t, b.db.Read, `SELECT count(*) FROM calls`) == 0 })
			}
			close(g.release)
			res := call(t, cs, "gate", "h-1", map[string]any{"n": 5})
			if res.IsError || callMeta(res)["replayed"] != timeout {
				t.Fatalf("retry: replayed = %v, want %v: %s", callMeta(res)["replayed"], timeout, text(res))
			}
			if got := charges(t, b); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
		})
	}
}

// TestCancel_ConnectionClosedIsLogged: a call whose client goes away while
// it runs (stdio's input closes, with no cancel) is logged as stopped by
// the connection closing, not as a cancel the transport could not tell.
func TestCancel_ConnectionClosedIsLogged(t *testing.T) {
	t.Parallel()
	logs := &outboxtest.LogBuffer{}
	b := setup(t, &outbox.Options{Logger: logs.Logger()}, nil)
	s := b.layer.NewServer(&mcp.Implementation{Name: "closing", Version: "v0"}, nil)
	g := addGateWith(b.layer, s, nil)
	p := stdioPeer(t, s)
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "gate", "arguments": map[string]any{"n": 1}, "_meta": meta(false, "closing-1")}})
	if _, err := p.w.Write(append(body, '\n')); err != nil {
		t.Fatal(err)
	}
	<-g.started
	p.w.(io.Closer).Close()
	const stopped = "call stopped before its commit; nothing recorded, a retry runs it"
	waitFor(t, func() bool { return len(logs.Records(t, stopped)) == 1 })
	why := fmt.Sprint(logs.Records(t, stopped)[0]["why"])
	if !strings.Contains(why, "connection closed (EOF)") {
		t.Errorf("why = %q, want the connection closing named, with the cause the go-sdk gave", why)
	}
	if got := charges(t, b); got != 0 {
		t.Errorf("charges = %d, want 0", got)
	}
}
