package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

// FuzzProxySession runs the proxy's JSON-RPC pump between a client and an
// in-process upstream (tools work and look, which answer at once). The
// client sends initialize, the fuzzed messages (one per line, as the
// SDK's transport would decode them) and a final ping. Every request the
// client sends alone gets exactly one answer, under its own id (unless the
// input cancels something); no answer comes under an id the client never
// used; the session survives to answer the final ping; and it ends when
// told to.
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
	p, err := New(Options{Layer: layer, Upstream: fuzzUpstream{}, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		var msgs []jsonrpc.Message
		sent := map[string]int{} // request ids, as JSON
		for _, line := range bytes.Split(input, []byte("\n")) {
			msg, err := jsonrpc.DecodeMessage(bytes.TrimSpace(line))
			if err != nil {
				continue // the transport refuses it (see FuzzStdioLines)
			}
			msgs = append(msgs, msg)
			if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
				sent[idJSON(req.ID)]++
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		serveCtx, stop := context.WithCancel(ctx)
		ct, pt := mcp.NewInMemoryTransports()
		pconn, err := pt.Connect(serveCtx)
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- p.Serve(serveCtx, pconn) }()
		client, err := ct.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		answers := make(chan jsonrpc.Message, 64)
		go func() {
			defer close(answers)
			for {
				m, err := client.Read(ctx)
				if err != nil {
					return
				}
				answers <- m
			}
		}()
		initialize := &jsonrpc.Request{ID: mustStringID("fuzz-init"), Method: "initialize",
			Params: json.RawMessage(`{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fuzz","version":"v0"}}`)}
		out := append([]jsonrpc.Message{initialize, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)}}, msgs...)
		out = append(out, &jsonrpc.Request{ID: mustStringID(sessionFinalID), Method: "ping"})
		sent[`"fuzz-init"`]++
		sent[`"`+sessionFinalID+`"`]++
		go func() {
			for _, m := range out {
				if client.Write(ctx, m) != nil {
					return
				}
			}
		}()

		waiting := map[string]bool{}
		if !bytes.Contains(input, []byte("notifications/cancelled")) {
			for id, n := range sent {
				if n == 1 {
					waiting[id] = true
				}
			}
		}
		got := map[string]int{}
		for len(waiting) > 0 {
			select {
			case m, ok := <-answers:
				if !ok {
					t.Fatalf("the client's connection ended; still waiting for %v", waiting)
				}
				resp, ok := m.(*jsonrpc.Response)
				if !ok {
					continue // a notification or a request of the upstream's
				}
				id := idJSON(resp.ID)
				got[id]++
				delete(waiting, id)
				if sent[id] == 0 {
					t.Fatalf("an answer under id %s, which the client never used: %+v", id, resp)
				}
				if sent[id] == 1 && got[id] > 1 {
					t.Fatalf("request %s answered %d times", id, got[id])
				}
			case <-ctx.Done():
				t.Fatalf("no answer to %v: the session died or is stuck", waiting)
			}
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
		cancel()
		for range answers {
		}
	})
}

func idJSON(id jsonrpc.ID) string {
	b, _ := json.Marshal(id.Raw())
	return string(b)
}

func mustStringID(s string) jsonrpc.ID {
	id, err := jsonrpc.MakeID(s)
	if err != nil {
		panic(fmt.Sprintf("id %q: %v", s, err))
	}
	return id
}
