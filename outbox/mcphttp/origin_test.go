package mcphttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// TestNewHandler_Origin: the transport spec's rule on Origin, on every
// method: none and the server's own are served, as are the configured
// ones; any other, "null" included, gets 403 naming the flag.
func TestNewHandler_Origin(t *testing.T) {
	t.Parallel()
	s := mcp.NewServer(&mcp.Implementation{Name: "origin", Version: "1"}, nil)
	srv := httptest.NewServer(mcphttp.NewHandler(s, &mcphttp.Options{AllowedOrigins: []string{"https://app.example.com", "http://localhost:5173/"}}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	send := func(method, origin string, header ...string) (int, string) {
		t.Helper()
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(initialize)
		}
		req, err := http.NewRequest(method, srv.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Content-Type", "application/json")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(b)
	}
	for _, origin := range []string{"http://evil.example", "null", "https://" + host, "http://" + host + ".evil.example", "https://app.example.com.evil.example"} {
		for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			status, body := send(method, origin)
			if status != http.StatusForbidden || !strings.Contains(body, "--allowed-origin") {
				t.Errorf("%s with Origin %q: %d %q, want 403 naming --allowed-origin", method, origin, status, body)
			}
		}
	}
	for _, c := range []struct {
		what, origin string
		header       []string
	}{
		{"no Origin", "", nil},
		{"the own origin", "http://" + host, nil},
		{"the own origin, any case", "HTTP://" + strings.ToUpper(host), nil},
		{"the own origin behind a proxy that terminates TLS", "https://" + host, []string{"X-Forwarded-Proto", "https"}},
		{"a configured origin", "https://app.example.com", nil},
		{"a configured origin, default port", "https://app.example.com:443", nil},
		{"a configured origin with a trailing slash", "http://localhost:5173", nil},
	} {
		if status, body := send(http.MethodPost, c.origin, c.header...); status != http.StatusOK {
			t.Errorf("initialize with %s: %d %q, want 200", c.what, status, body)
		}
	}
}
