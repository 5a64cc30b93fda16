package oauth

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// FuzzToolsCalled checks the per-tool scope check against the go-sdk
// itself: whatever POST body the SDK's own Streamable HTTP handler decodes
// into a tools/call of some tool, toolsCalled names that tool or reports an
// unnamed call (which requires every tool's scopes). A body that reads
// differently to the two decoders must never let a call through unchecked.
func FuzzToolsCalled(f *testing.F) {
	var mu sync.Mutex
	var seen []string
	s := mcp.NewServer(&mcp.Implementation{Name: "fuzz", Version: "v0"}, nil)
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.CallToolRequest); ok {
				mu.Lock()
				seen = append(seen, r.Params.Name)
				mu.Unlock()
			}
			return next(ctx, method, req)
		}
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	for _, b := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{}}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"balance"}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"charge"}}]`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","Name":"balance"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"Name":"balance","name":"charge"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"balance","name":"charge"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"ch\u0061rge"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge"},"method":"ping"}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`,
	} {
		f.Add(b)
	}
	post := func(body string) {
		mu.Lock()
		seen = seen[:0]
		mu.Unlock()
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	// The comparison means something only if the SDK does see calls.
	post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{}}}`)
	if !slices.Equal(seen, []string{"charge"}) {
		f.Fatalf("the go-sdk saw calls %q, want [charge]", seen)
	}
	f.Fuzz(func(t *testing.T, body string) {
		post(body)
		names, unnamed := toolsCalled([]byte(body))
		mu.Lock()
		defer mu.Unlock()
		for _, name := range seen {
			if !unnamed && !slices.Contains(names, name) {
				t.Fatalf("the go-sdk called tool %q, the scope check saw %q in %q", name, names, body)
			}
		}
	})
}
