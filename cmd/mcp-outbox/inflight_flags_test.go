package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestProxyFrontInFlight: the proxy's /mcp (the sidecar's handler, not
// mcphttp.NewHandler) is bounded by --max-in-flight too.
func TestProxyFrontInFlight(t *testing.T) {
	t.Parallel()
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "front.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held := false
		first.Do(func() { held = true })
		if held {
			close(entered)
			<-release
		}
		io.WriteString(w, "reached")
	})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &app{db: db, logger: logger, mcpHTTP: upstream, inflight: inflightLimits{total: 1}}
	srv := httptest.NewServer(testRouter(t, a, logger))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	go func() {
		resp, err := http.Post(srv.URL+"/mcp", "application/json", strings.NewReader(`{}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the proxy's handler")
	}
	resp, err := http.Post(srv.URL+"/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(b), "proxy --max-in-flight") {
		t.Errorf("status %d, Retry-After %q, body %s; want 503 naming proxy --max-in-flight", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
}

func TestInFlightFlagsUsage(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"serve", "proxy"} {
		r := runCLI(t, nil, cmd, "--help")
		for _, want := range []string{"-max-in-flight ", "MCP_OUTBOX_MAX_IN_FLIGHT]", "-max-in-flight-per-principal", "MCP_OUTBOX_MAX_IN_FLIGHT_PER_PRINCIPAL]",
			"-max-in-flight-bytes-per-principal", "MCP_OUTBOX_MAX_IN_FLIGHT_BYTES_PER_PRINCIPAL]"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%s --help does not mention %s", cmd, want)
			}
		}
	}
	r := runCLI(t, map[string]string{"MCP_OUTBOX_MAX_IN_FLIGHT_PER_PRINCIPAL": "lots"}, "serve", "--db", filepath.Join(t.TempDir(), "never.db"))
	if r.code != 2 || !strings.Contains(r.stderr, `MCP_OUTBOX_MAX_IN_FLIGHT_PER_PRINCIPAL="lots"`) {
		t.Errorf("exit %d, stderr %q; want a usage error naming the variable", r.code, r.stderr)
	}
}
