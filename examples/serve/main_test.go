package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestMain stops the PostgreSQL server a test started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// TestServeExample runs the example on 127.0.0.1 over HTTP: a call made
// through the go-sdk client is recorded, its retry on a new connection is
// replayed, and the operator surface answers beside /mcp.
func TestServeExample(t *testing.T) {
	t.Parallel()
	mailer := downstream.Start(t, nil)
	// The example's SQL is the same on both stores.
	dbTarget := filepath.Join(t.TempDir(), "invoices.db")
	if os.Getenv("MCP_OUTBOX_TEST_STORE") == "postgres" {
		dbTarget = pgtest.Database(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-db", dbTarget, "-http", "127.0.0.1:0",
			"-mailer", strings.TrimPrefix(mailer.URL(), "http://")}, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatalf("no address printed: %v", sc.Err())
	}
	go io.Copy(io.Discard, pr)
	url := strings.TrimPrefix(sc.Text(), "serving MCP at ")

	call := func() map[string]any {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		client := mcp.NewClient(&mcp.Implementation{Name: "example-test", Version: "v0"}, nil)
		cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatalf("connect %s: %v", url, err)
		}
		defer cs.Close()
		res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "send_invoice", Arguments: map[string]any{"Customer": "acme"},
			Meta: mcp.Meta{"idempotencyKey": "invoice-acme-1"}})
		if err != nil || res.IsError {
			t.Fatalf("send_invoice: %v %+v", err, res)
		}
		meta, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
		out, _ := res.StructuredContent.(map[string]any)
		return map[string]any{"replayed": meta["replayed"], "invoice": out["InvoiceID"]}
	}
	first, second := call(), call()
	if first["replayed"] != false || second["replayed"] != true || first["invoice"] != second["invoice"] || first["invoice"] == nil {
		t.Errorf("first call %v, retry %v; want the retry replayed with the same invoice", first, second)
	}

	// The invoice's mail went out once, with the effect's key, with no
	// wiring but Start.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := mailer.WaitRequests(wctx, 1); err != nil {
		t.Fatalf("no mail sent: %v", err)
	}
	if req := mailer.Requests()[0]; req.Path != "/v1/send" || !strings.HasPrefix(req.Key, "call_") ||
		string(req.Body) != fmt.Sprintf(`{"invoice":%v}`, first["invoice"]) {
		t.Errorf("mail request %s %q key %q; want /v1/send of invoice %v with the effect's key", req.Path, req.Body, req.Key, first["invoice"])
	}
	if req := mailer.Requests()[0]; req.Header.Get("Content-Type") != "application/json" {
		t.Errorf("mail request's Content-Type %q, want application/json for its JSON body", req.Header.Get("Content-Type"))
	}

	base := strings.TrimSuffix(url, "/mcp")
	for _, path := range []string{"/healthz", "/readyz", "/admin/summary", "/metrics"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
}
