package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestServeDeepJSONAnswersItsID: a request nested deeper than encoding/json
// parses (10,000 levels), sent to the real binary over stdio, is answered
// with an error under its own id, found among the top-level members before
// the overflow, and the server goes on serving. Before, the answer had id
// null, which no client can match to its request.
// TestServeBareRefusesInexactAmount: without the layer (serve --bare) the
// ledger's schema maximum refuses the amount the go-sdk would change.
func TestServeBareRefusesInexactAmount(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	cs, _ := serveStdio(t, bin, dbPath, nil, "--bare")
	for _, amount := range []string{"9007199254740993", "9007199254740992"} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge",
			Arguments: json.RawMessage(`{"amount":` + amount + `}`)})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError || !strings.Contains(resultText(res), "maximum") {
			t.Errorf("bare charge %s: isError %v, %q; want the schema's maximum error", amount, res.IsError, resultText(res))
		}
	}
	if n := countRows(t, openLedgerDB(t, dbPath), `SELECT count(*) FROM charges`); n != 0 {
		t.Errorf("charges has %d rows, want 0", n)
	}
}

func TestServeDeepJSONAnswersItsID(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(bin, "serve", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--log-level", "error")
	cmd.Stderr = testWriter{t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	lines := make(chan []byte, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	exchange := func(line string) map[string]any {
		t.Helper()
		if _, err := io.WriteString(stdin, line+"\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
		select {
		case out, ok := <-lines:
			if !ok {
				t.Fatalf("the server closed stdout after %.80s", line)
			}
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("answer %q is not a JSON object", out)
			}
			return m
		case <-time.After(20 * time.Second):
			t.Fatalf("no answer to %.80s", line)
			return nil
		}
	}
	if m := exchange(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"v0"}}}`); m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	if _, err := io.WriteString(stdin, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n"); err != nil {
		t.Fatal(err)
	}

	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	for _, c := range []struct {
		line string
		id   any
	}{
		{`{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"charge","arguments":{"amount":5,"x":` + deep + `}}}`, 77.0},
		{`{"id":"req-9","jsonrpc":"2.0","method":"tools/call","params":{"name":"charge","arguments":{"amount":5,"x":` + deep + `}}}`, "req-9"},
		// The id after the overflow is not looked for: nothing past it is parsed.
		{`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"charge","arguments":{"x":` + deep + `}},"id":78}`, nil},
		// Malformed before the overflow: no id can be trusted.
		{`{"jsonrpc":"2.0","id":79,"method" "tools/call","params":` + deep + `}`, nil},
	} {
		m := exchange(c.line)
		e, _ := m["error"].(map[string]any)
		if e == nil || e["code"] != -32700.0 || m["id"] != c.id {
			t.Errorf("answer to a line nested 10,000 deep: %v, want a parse error with id %v", m, c.id)
		}
		if msg, _ := e["message"].(string); !strings.Contains(msg, "nested deeper than 10000 levels") {
			t.Errorf("error message %q does not say why", msg)
		}
	}

	// The server is still there and still answers its requests.
	if m := exchange(`{"jsonrpc":"2.0","id":80,"method":"tools/call","params":{"name":"balance","arguments":{}}}`); m["id"] != 80.0 || m["result"] == nil {
		t.Fatalf("a call after the deep lines: %v", m)
	}
}

// TestServeWithoutDestWarnsOnce: a serve without --dest delivers no
// effects, which is right when another process does, but nothing said so
// to a stranger whose effects stayed pending. The first commit that
// enqueues one says so, once; the effects stay queued.
func TestServeWithoutDestWarnsOnce(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "nodest.db")
	logs := newLineWatch(t, "\x00") // nothing starts with NUL: only the log is kept
	cs, _ := serveStdioTo(t, logs, bin, dbPath, nil)
	mustSucceed(t, cs, chargeCall("nodest-1", 100))
	mustSucceed(t, cs, chargeCall("nodest-2", 200))
	cs.Close()
	const warning = "this process delivers none (no --dest)"
	pollUntil(t, 10*time.Second, "the warning on stderr", func() bool { return strings.Contains(logs.String(), warning) })
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Errorf("the warning shows %d times, want once:\n%s", n, logs.String())
	}
	db := openLedgerDB(t, dbPath)
	if n := countRows(t, db, `SELECT count(*) FROM effects WHERE state = 'pending'`); n != 2 {
		t.Errorf("%d effects pending, want both", n)
	}
}

// TestServeSaysItCreatedTheDatabase: serve creates a missing SQLite file,
// as a first run wants; a mistyped --db then looks like a server that
// forgot every call. So it says it created one, and only then.
func TestServeSaysItCreatedTheDatabase(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "fresh.db")
	const said = "created a new database"
	for run, want := range []bool{true, false} {
		logs := newLineWatch(t, "\x00")
		cs, _ := serveStdioTo(t, logs, bin, dbPath, nil, "--log-level", "info")
		mustSucceed(t, cs, chargeCall(fmt.Sprintf("fresh-%d", run), 100))
		cs.Close()
		pollUntil(t, 10*time.Second, "serve's start-up log", func() bool {
			return strings.Contains(logs.String(), "serving") || strings.Contains(logs.String(), said)
		})
		if got := strings.Contains(logs.String(), said); got != want {
			t.Errorf("run %d: says it created the database: %v, want %v\n%s", run, got, want, logs.String())
		}
	}
}
