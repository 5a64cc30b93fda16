package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestServeRefusesInexactAmount: a charge of 9007199254740993 (a valid
// int64, which the go-sdk's schema step would turn into 9007199254740992)
// reaches the real binary over stdio and is refused as a tool error naming
// the argument and the value; nothing is charged, recorded or enqueued.
func TestServeRefusesInexactAmount(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	cs, _ := serveStdio(t, bin, dbPath, nil)
	ctx := context.Background()

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge",
		Arguments: json.RawMessage(`{"amount":9007199254740993,"currency":"usd"}`),
		Meta:      mcp.Meta{"idempotencyKey": "big-1"}})
	if err != nil {
		t.Fatal(err)
	}
	code, _ := res.Meta[outbox.MetaKeyError].(string)
	msg := resultText(res)
	if !res.IsError || code != "invalid_arguments" {
		t.Fatalf("charge 9007199254740993: isError %v, code %q, %q; want the invalid_arguments tool error", res.IsError, code, msg)
	}
	for _, want := range []string{`"/amount"`, "9007199254740993", "Nothing was executed"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %s", msg, want)
		}
	}

	bal, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "balance", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if bal.IsError {
		t.Fatalf("balance: %s", resultText(bal))
	}
	if out, _ := json.Marshal(bal.StructuredContent); !strings.Contains(string(out), `"charges":0`) {
		t.Errorf("balance after the refused charge: %s, want no charges", out)
	}
	db := openLedgerDB(t, dbPath)
	for _, table := range []string{"charges", "calls", "effects"} {
		if n := countRows(t, db, `SELECT count(*) FROM `+table); n != 0 {
			t.Errorf("%s has %d rows, want 0", table, n)
		}
	}
}
