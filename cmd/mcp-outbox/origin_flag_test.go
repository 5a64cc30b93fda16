package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestAllowedOrigin: --allowed-origin and MCP_OUTBOX_ALLOWED_ORIGINS (the
// flag wins), repeatable and comma-separated, refused when not an origin;
// and serve's /mcp applies them: a foreign Origin gets 403 naming the
// flag, a configured one and none are served.
func TestAllowedOrigin(t *testing.T) {
	t.Parallel()
	parse := func(vars map[string]string, args ...string) ([]string, error) {
		env := testEnv(vars, nil, io.Discard, io.Discard)
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var got []string
		if err := originFlag(env, fs, &got); err != nil {
			return nil, err
		}
		return got, fs.Parse(args)
	}
	env := map[string]string{"MCP_OUTBOX_ALLOWED_ORIGINS": "https://a.example, http://localhost:5173"}
	for _, c := range []struct {
		vars map[string]string
		args []string
		want []string
	}{
		{nil, nil, nil},
		{env, nil, []string{"https://a.example", "http://localhost:5173"}},
		{env, []string{"--allowed-origin", "https://c.example"}, []string{"https://c.example"}},
		{nil, []string{"--allowed-origin", "https://c.example,https://d.example:8443/", "--allowed-origin", "https://e.example"},
			[]string{"https://c.example", "https://d.example:8443/", "https://e.example"}},
	} {
		got, err := parse(c.vars, c.args...)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%v %v: %q, %v; want %q", c.vars, c.args, got, err, c.want)
		}
	}
	for _, bad := range []string{"app.example.com", "https://app.example.com/mcp", "ftp://x.example", "null", "https://"} {
		if _, err := parse(nil, "--allowed-origin", bad); err == nil || !strings.Contains(err.Error(), "want scheme://host[:port]") {
			t.Errorf("--allowed-origin %q: %v, want a refusal", bad, err)
		}
		if _, err := parse(map[string]string{"MCP_OUTBOX_ALLOWED_ORIGINS": bad}); err == nil || !strings.Contains(err.Error(), "MCP_OUTBOX_ALLOWED_ORIGINS") {
			t.Errorf("MCP_OUTBOX_ALLOWED_ORIGINS=%q: %v, want a refusal", bad, err)
		}
	}

	path, _ := newEffectsDB(t, 1)
	db, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &app{db: db, server: mcp.NewServer(&mcp.Implementation{Name: "origin-test", Version: "v0"}, nil), logger: logger,
		auth: &authConfig{allowedOrigins: []string{"https://app.example.com"}}}
	srv := httptest.NewServer(testRouter(t, a, logger))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		origin string
		want   int
	}{{"http://evil.example", http.StatusForbidden}, {"null", http.StatusForbidden}, {"", http.StatusOK},
		{srv.URL, http.StatusOK}, {"https://app.example.com", http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader(
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want || (c.want == http.StatusForbidden && !strings.Contains(string(b), "--allowed-origin")) {
			t.Errorf("initialize with Origin %q: %d %q, want %d", c.origin, resp.StatusCode, b, c.want)
		}
	}

	// With tokens, a foreign Origin is refused 403 ahead of the token: a
	// request without one gets 403, not the 401 of authentication.
	sum := sha256.Sum256([]byte("alice-token"))
	a.auth.tokens = []bearer.Token{{Principal: "alice", Hash: sum[:]}}
	authed := httptest.NewServer(testRouter(t, a, logger))
	t.Cleanup(authed.Close)
	for _, c := range []struct {
		origin, token string
		want          int // 0: past both checks, to the transport (which wants a session for a GET)
	}{{"http://evil.example", "", http.StatusForbidden}, {"http://evil.example", "alice-token", http.StatusForbidden},
		{"", "", http.StatusUnauthorized}, {"https://app.example.com", "alice-token", 0}} {
		req, _ := http.NewRequest(http.MethodGet, authed.URL+"/mcp", nil)
		req.Header.Set("Accept", "text/event-stream")
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := authed.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		passed := resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnauthorized
		if (c.want == 0 && !passed) || (c.want != 0 && resp.StatusCode != c.want) {
			t.Errorf("GET /mcp with Origin %q, token %q: %d, want %d", c.origin, c.token, resp.StatusCode, c.want)
		}
	}
}
