package mcphttp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// largeCall is a stateless (2026-07-28) tools/call of about size bytes,
// the padding in params._meta, as issue 37's memory repro sent it.
func largeCall(size int) string {
	head := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"n":1},"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"padding":"`
	tail := `"}}}`
	return head + strings.Repeat("x", size-len(head)-len(tail)) + tail
}

// echoServer is a go-sdk server with one tool, echo, that answers "ok".
func echoServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "bench", Version: "v0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(context.Context, *mcp.CallToolRequest, struct {
		N int `json:"n"`
		X any `json:"x,omitempty"` // the depth tests' nesting
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	return s
}

func newCallRequest(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Mcp-Protocol-Version", StatelessVersion)
	r.Header.Set("Mcp-Method", "tools/call")
	r.Header.Set("Mcp-Name", "echo")
	return r
}

// BenchmarkLargeCall measures what one 4 MiB tools/call allocates through
// NewHandler (B/op): the bytes the body is copied into on its way, ours
// and the go-sdk's. Profile it with
//
//	go test -run '^$' -bench LargeCall -benchmem -memprofile mem.out ./outbox/mcphttp
//	go tool pprof -sample_index=alloc_space -top mem.out
func BenchmarkLargeCall(b *testing.B) {
	h := NewHandler(echoServer(), nil)
	body := largeCall(4<<20 - 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newCallRequest(body))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"ok"`) {
			b.Fatalf("status %d: %.300s", rec.Code, rec.Body.String())
		}
	}
}

// BenchmarkLargeCallSession is BenchmarkLargeCall in a 2025-11-25
// session, where the front also tags each call for its cancels.
func BenchmarkLargeCallSession(b *testing.B) {
	h := NewHandler(echoServer(), nil)
	post := func(session, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			r.Header.Set("Mcp-Session-Id", session)
			r.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	init := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"b","version":"1"}}}`)
	session := init.Header().Get("Mcp-Session-Id")
	if session == "" {
		b.Fatalf("initialize: %d %s", init.Code, init.Body)
	}
	post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	body := strings.Replace(largeCall(4<<20-4096), `"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},`, "", 1)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rec := post(session, body)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"ok"`) {
			b.Fatalf("status %d: %.300s", rec.Code, rec.Body.String())
		}
	}
}
