package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestServeExample runs the example on 127.0.0.1 over HTTP: a call made
// through the go-sdk client is recorded, its retry on a new connection is
// replayed, and the operator surface answers beside /mcp.
func TestServeExample(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-db", filepath.Join(t.TempDir(), "invoices.db"), "-http", "127.0.0.1:0"}, pw)
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

	base := strings.TrimSuffix(url, "/mcp")
	for _, path := range []string{"/healthz", "/admin/summary", "/metrics"} {
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
