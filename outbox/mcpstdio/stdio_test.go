package mcpstdio_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// ledgerServer is a server of the layer with the ledger's tools, on a
// SQLite file in t.TempDir (the transport is the same for every store).
func ledgerServer(t *testing.T) (*mcp.Server, *schema.DB) {
	t.Helper()
	ctx := context.Background()
	db, err := schema.Open(ctx, filepath.Join(t.TempDir(), "test.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := ledger.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	layer, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := layer.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	ledger.Register(layer, s, nil)
	return s, db
}

// rawSession speaks JSON-RPC lines to a server over pipes, as a stdio
// client does (outboxtest.RawSession), so tests can send what the Go
// client cannot.
type rawSession struct{ *outboxtest.RawSession }

func rawConnect(t *testing.T, s *mcp.Server) *rawSession {
	t.Helper()
	return &rawSession{outboxtest.RawConnect(t, s)}
}

func (rs *rawSession) send(line string) { rs.Send(line) }

func (rs *rawSession) read() map[string]any { return rs.Read() }

// TestNewTransport_StdioSurvivesBadLines: a server a library user builds,
// served over stdio streams through NewTransport, answers each line that
// is not a JSON-RPC message with one error and keeps the session, its
// calls recorded and replayed, as serve does.
func TestNewTransport_StdioSurvivesBadLines(t *testing.T) {
	t.Parallel()
	server, db := ledgerServer(t)
	rs := rawConnect(t, server)
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	for _, c := range []struct {
		name, line string
		code       float64
		id         any
		msg        string
	}{
		{"NotJSON", `this is not json`, -32700, nil, "not valid JSON"},
		{"Truncated", `{"jsonrpc":"2.0","id":3,"method":"ping"`, -32700, nil, "not valid JSON"},
		{"EmptyBatch", `[]`, -32600, nil, "empty batch"},
		{"MethodNotAString", `{"jsonrpc":"2.0","id":4,"method":7}`, -32600, 4.0, "Invalid Request"},
		{"TooDeep", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"charge","arguments":{"amount":5,"x":` + deep + `}}}`, -32700, 5.0, "nested deeper than 10000 levels"},
		{"BatchRepeatsID", `[{"jsonrpc":"2.0","id":6,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"ping"}]`, -32600, nil, "repeats request id 6"},
	} {
		rs.send(c.line)
		m := rs.read()
		e, _ := m["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if e == nil || e["code"] != c.code || m["id"] != c.id || !strings.Contains(msg, c.msg) {
			t.Errorf("%s: answer %v, want error %v under id %v containing %q", c.name, m, c.code, c.id, c.msg)
		}
	}

	// The session is still there: a keyed call runs once and replays.
	req := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"charge","arguments":{"amount":9},"_meta":{"idempotencyKey":"after-bad-lines"}}}`
	for i := 1; i <= 2; i++ {
		rs.send(strings.Replace(req, "%d", string(rune('0'+i)), 1))
		res := rs.read()
		result, _ := res["result"].(map[string]any)
		meta, _ := result["_meta"].(map[string]any)
		m, _ := meta[outbox.MetaKeyCall].(map[string]any)
		if m == nil || m["replayed"] != (i == 2) {
			t.Fatalf("call %d after the bad lines: %v", i, res)
		}
	}
	var n int
	if err := db.Read.QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("charges = %d, want 1", n)
	}
}

// TestNewTransport_StdioMaxLineLength: the wrapped transport's
// MaxLineLength bounds a message, a longer one gets an error and the
// session goes on; rejected lines go to the Logger of the options.
func TestNewTransport_StdioMaxLineLength(t *testing.T) {
	t.Parallel()
	server, _ := ledgerServer(t)
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	tr := mcpstdio.NewTransport(&mcp.IOTransport{Reader: sr, Writer: sw, MaxLineLength: 512}, &mcpstdio.Options{Logger: logger})
	ss, err := server.Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cw.Close(); ss.Close() })
	sc := bufio.NewScanner(cr)
	sc.Buffer(nil, 1<<20)
	exchange := func(line string) map[string]any {
		t.Helper()
		if _, err := io.WriteString(cw, line+"\n"); err != nil {
			t.Fatal(err)
		}
		if !sc.Scan() {
			t.Fatalf("no answer to %.60s: %v", line, sc.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("answer %s: %v", sc.Bytes(), err)
		}
		return m
	}
	long := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"` + strings.Repeat("x", 600) + `"}}`
	m := exchange(long)
	e, _ := m["error"].(map[string]any)
	if msg, _ := e["message"].(string); e["code"] != -32600.0 || !strings.Contains(msg, "longer than 512 bytes") {
		t.Errorf("a line of %d bytes: %v, want -32600 naming the limit", len(long), m)
	}
	if m := exchange(`{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`); m["result"] == nil {
		t.Fatalf("initialize after the long line: %v", m)
	}
	if !strings.Contains(logs.String(), "rejected a malformed JSON-RPC message") {
		t.Errorf("the rejected line was not logged: %q", logs.String())
	}
}

// syncBuffer is a bytes.Buffer the filter's goroutine writes and the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
