package sidecar

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestHTTPOrigin: the proxy's HTTP front applies mcphttp.NewHandler's
// rule on Origin, on every method: a foreign one, "null" included, gets
// 403 naming the flag before anything reaches a session; none, the own
// and a configured one reach the handler.
func TestHTTPOrigin(t *testing.T) {
	t.Parallel()
	p, err := New(Options{Layer: &outbox.Layer{}, Upstream: newUpstream(), AllowedOrigins: []string{"https://app.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.HTTPHandler(context.Background()))
	defer srv.Close()
	send := func(method, origin string) (int, string) {
		t.Helper()
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
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
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(b)
	}
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
		for _, origin := range []string{"http://evil.example", "null"} {
			if status, body := send(method, origin); status != http.StatusForbidden || !strings.Contains(body, "--allowed-origin") {
				t.Errorf("%s with Origin %q: %d %q, want 403 naming --allowed-origin", method, origin, status, body)
			}
		}
		for _, origin := range []string{"", srv.URL, "https://app.example.com"} {
			if status, body := send(method, origin); status == http.StatusForbidden {
				t.Errorf("%s with Origin %q: 403 %q", method, origin, body)
			}
		}
	}
}
