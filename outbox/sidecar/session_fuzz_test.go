package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// sessionFinalID is the id of the ping that ends every run of
// FuzzProxySession: its answer proves the session survived what came
// before it.
const sessionFinalID = "fuzz-final-7f3a"

// FuzzProxySession runs the proxy's JSON-RPC pump between a client on a
// stdio-like stream and an in-process upstream (tools work and look, which
// answer at once). The client writes initialize, the fuzzed lines that the
// SDK's transport decodes as one message, and a final ping. Every request the
// client sends alone gets exactly one answer, under its own id (unless the
// input cancels something); no answer comes under an id the client never
// used; the session survives to answer the final ping, with the upstream
// it started with; and it ends when told to.
func FuzzProxySession(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"work","arguments":{"n":1},"_meta":{"idempotencyKey":"k-1"}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"work","arguments":{"n":1}}}` + "\n" +
			`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"work","arguments":{"n":1}}}`,
		`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"work","arguments":{"n":2},"_meta":{"idempotencyKey":"k-1"}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"look","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"call_status","arguments":{"key":"k-1"}}}`,
		`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"nope"}}`,
		`{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"arguments":{}}}`,
		`{"jsonrpc":"2.0","id":11,"method":"tools/call","params":null}`,
		`{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"work","_meta":null}}`,
		`{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"work","_meta":[]}}`,
		`{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"work","arguments":{"n":18446744073709551617}}}`,
		`{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"look","Name":"work"}}`,
		`{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"work","arguments":"not an object"}}`,
		`{"jsonrpc":"2.0","id":17,"method":"resources/list"}`,
		`{"jsonrpc":"2.0","id":18,"method":"no/such/method"}`,
		`{"jsonrpc":"2.0","id":19,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"again","version":"v0"}}}`,
		`{"jsonrpc":"2.0","id":20,"method":"server/discover"}`,
		`{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"work"}}` + "\n" +
			`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":21}}`,
		`{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{"name":"work"}}` + "\n" +
			`{"jsonrpc":"2.0","method":"notifications\/cancelled","params":{"requestId":22}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"nobody"}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":null}`,
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`,
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":99,"error":{"code":-1,"message":"x"}}`,
		`{"jsonrpc":"2.0","id":"s","method":"ping"}` + "\n" + `{"jsonrpc":"2.0","id":"s","method":"ping"}`,
		`{"jsonrpc":"2.0","id":22,"method":"ping","params":` + strings.Repeat(`[`, 300) + strings.Repeat(`]`, 300) + `}`,
		"{\"jsonrpc\":\"2.0\",\"id\":23,\"method\":\"tools/call\",\"params\":{\"name\":\"\xff\"}}",
	} {
		f.Add([]byte(s))
	}
	db, err := schema.Open(context.Background(), filepath.Join(f.TempDir(), "proxy.db"), &schema.Options{Durability: schema.DurabilityNormal})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	// A short in-flight wait: a duplicate in the input gets its "in
	// progress" answer soon, and a call the previous run left behind does
	// not hold up this one.
	layer, err := outbox.New(db, &outbox.Options{InFlightWait: 200 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	up := &fuzzUpstream{}
	p, err := New(Options{Layer: layer, Upstream: up, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		// The client's lines, as a stdio client writes them: one message
		// each (batches are the line filter's, see FuzzStdioLines in mcpstdio).
		lines := [][]byte{
			[]byte(`{"jsonrpc":"2.0","id":"fuzz-init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fuzz","version":"v0"}}}`),
			[]byte(`{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`),
		}
		sent := map[string]int{`"fuzz-init"`: 1, `"` + sessionFinalID + `"`: 1} // request ids, as JSON
		cancels := false
		for _, line := range bytes.Split(input, []byte("\n")) {
			line = bytes.TrimSpace(line)
			msg, err := jsonrpc.DecodeMessage(line)
			if err != nil || line[0] == '[' {
				continue // the line filter answers it
			}
			var c bytes.Buffer
			if json.Compact(&c, line) != nil {
				continue
			}
			lines = append(lines, c.Bytes())
			if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
				sent[idJSON(req.ID)]++
			} else if ok && req.Method == "notifications/cancelled" {
				// Decoded, not searched for: "notifications\/cancelled"
				// is a cancel too.
				cancels = true
			}
		}
		lines = append(lines, []byte(`{"jsonrpc":"2.0","id":"`+sessionFinalID+`","method":"ping"}`))

		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		serveCtx, stop := context.WithCancel(ctx)
		toProxy, clientOut := io.Pipe()
		clientIn, fromProxy := io.Pipe()
		pconn, err := (&mcp.IOTransport{Reader: toProxy, Writer: fromProxy}).Connect(serveCtx)
		if err != nil {
			t.Fatal(err)
		}
		dials := up.dials.Load()
		served := make(chan error, 1)
		go func() { served <- p.Serve(serveCtx, pconn) }()
		answers := make(chan []byte, 64)
		go func() {
			defer close(answers)
			br := bufio.NewReader(clientIn)
			for {
				line, err := br.ReadBytes('\n')
				if len(line) > 0 {
					answers <- line
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			for _, l := range lines {
				if _, err := clientOut.Write(append(l, '\n')); err != nil {
					return
				}
			}
		}()

		waiting := map[string]bool{}
		if !cancels {
			for id, n := range sent {
				if n == 1 {
					waiting[id] = true
				}
			}
		} else {
			waiting[`"`+sessionFinalID+`"`] = true
		}
		got := map[string]int{}
		for len(waiting) > 0 {
			select {
			case a, ok := <-answers:
				if !ok {
					t.Fatalf("the client's connection ended; still waiting for %v", waiting)
				}
				var m struct {
					ID     json.RawMessage `json:"id"`
					Method *string         `json:"method"`
				}
				if err := json.Unmarshal(a, &m); err != nil {
					t.Fatalf("the proxy wrote %q: %v", a, err)
				}
				if m.Method != nil || m.ID == nil {
					continue // a notification or a request of the upstream's
				}
				id := normalID(m.ID)
				got[id]++
				delete(waiting, id)
				if sent[id] == 0 {
					t.Fatalf("an answer under id %s, which the client never used: %q", id, a)
				}
				if sent[id] == 1 && got[id] > 1 {
					t.Fatalf("request %s answered %d times", id, got[id])
				}
			case <-ctx.Done():
				t.Fatalf("no answer to %v: the session died or is stuck", waiting)
			}
		}
		// Nothing a client sends may take the upstream down: it is started
		// once.
		if n := up.dials.Load() - dials; n != 1 {
			t.Fatalf("the upstream was started %d times", n)
		}
		stop()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("Serve: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("Serve did not return once its context ended")
		}
		clientOut.Close()
		clientIn.Close()
		for range answers {
		}
	})
}

// normalID is an id as the proxy wrote it, in the form of idJSON.
func normalID(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func idJSON(id jsonrpc.ID) string {
	b, _ := json.Marshal(id.Raw())
	return string(b)
}
