package mcpstdio

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioFinalID is the id of the ping that ends every run of FuzzStdioLines:
// its answer proves the session survived what came before.
const stdioFinalID = "fuzz-final-7f3a"

// stdioSeeds are lines a client might send on stdio: good messages of each
// kind, and what a broken or hostile client sends.
var stdioSeeds = []string{
	`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
	`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},"_meta":{"idempotencyKey":"k-1"}}}`,
	`{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},"idempotencyKey":"top"}}`,
	`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","_meta":null,"idempotencyKey":"k"}}`,
	`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`,
	`{"jsonrpc":"2.0","method":"notifications\/cancelled","params":{"requestId":3}}`,
	`{"jsonrpc":"2.0","id":5,"result":{}}`,
	`{"jsonrpc":"2.0","id":6,"method":"no/such/method"}`,
	`[{"jsonrpc":"2.0","id":7,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}]`,
	`[{"jsonrpc":"2.0","id":8,"method":"ping"},{"jsonrpc":"2.0","id":8,"method":"ping"}]`,
	`[]`,
	`[1]`,
	`{}`,
	`null`,
	`"text"`,
	`{"jsonrpc":"1.0","id":9,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}`,
	`{"jsonrpc":"2.0","id":null,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":1e400,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":18446744073709551617,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":10,"method":"ping"} trailing`,
	`{"jsonrpc":"2.0","id":11,"method":"ping","id":12}`,
	`{"jsonrpc":"2.0","ID":13,"Method":"ping"}`,
	"{\"jsonrpc\":\"2.0\",\"id\":14,\"method\":\"ping\"}\r",
	"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"ping\"}",
	"{\"jsonrpc\":\"2.0\",\"id\":\"\xff\",\"method\":\"ping\"}",
	`{"jsonrpc":"2.0","id":16,"method":"ping"`,
	strings.Repeat(`[`, 200) + strings.Repeat(`]`, 200),
	`{"jsonrpc":"2.0","id":17,"method":"ping","params":` + strings.Repeat(`[`, 500) + strings.Repeat(`]`, 500) + `}`,
	"  \t ",
	"",
}

// FuzzStdioLines runs the hardened stdio transport (NewTransport around an
// *mcp.IOTransport, as serve has it) in front of a go-sdk server, feeds it an
// initialize, the fuzzed lines and a final ping, and checks that every
// non-empty line gets exactly one of: passed to the SDK, or one JSON-RPC
// error answered by the filter (a valid error response: -32700 or -32600,
// under id null or the request's own); that a request passed on alone
// or in a batch is answered under its id; and that the session survives
// it all: the final ping is answered.
func FuzzStdioLines(f *testing.F) {
	for _, s := range stdioSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Join(stdioSeeds[:8], "\n")))
	f.Add([]byte(strings.Join(stdioSeeds, "\r\n")))
	server := mcp.NewServer(&mcp.Implementation{Name: "fuzz", Version: "v0"}, nil)
	type echoIn struct {
		Text string `json:"text,omitempty"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
	})
	f.Fuzz(func(t *testing.T, input []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		ss, err := server.Connect(ctx, NewTransport(&mcp.IOTransport{Reader: inR, Writer: outW}, nil), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ss.Close()

		answers := make(chan []byte, 64)
		go func() {
			defer close(answers)
			br := bufio.NewReaderSize(outR, 64*1024)
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
			var b bytes.Buffer
			b.WriteString(`{"jsonrpc":"2.0","id":"fuzz-init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fuzz","version":"v0"}}}` + "\n")
			b.WriteString(`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n")
			b.Write(input)
			b.WriteString("\n{\"jsonrpc\":\"2.0\",\"id\":\"" + stdioFinalID + "\",\"method\":\"ping\"}\n")
			_, _ = inW.Write(b.Bytes())
		}()

		// What the lines call for.
		wantErrors := map[string]int{} // filter answers, by their bytes
		wantIDs := map[string]int{}    // ids of requests passed on, alone or in a batch
		cancels := false               // the input cancels a request of its own
		for _, line := range bytes.Split(input, []byte("\n")) {
			trimmed := bytes.TrimSpace(line)
			if len(trimmed) == 0 {
				continue
			}
			if r := checkMessage(trimmed, false, mcp.DefaultMaxLineLength); r != nil {
				wantErrors[string(r.encode())]++
				continue
			}
			// The requests of a line: itself, or those of its batch.
			msgs := []json.RawMessage{trimmed}
			if trimmed[0] == '[' {
				msgs = nil
				_ = json.Unmarshal(trimmed, &msgs)
			}
			for _, m := range msgs {
				if msg, err := jsonrpc.DecodeMessage(m); err == nil {
					if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
						b, _ := json.Marshal(req.ID.Raw())
						wantIDs[string(b)]++
					} else if ok && req.Method == "notifications/cancelled" {
						// Decoded, not searched for:
						// "notifications\/cancelled" is a cancel too.
						cancels = true
					}
				}
			}
		}
		// A request passed on alone is answered (unless the client's own
		// cancel, in the same input, asked the server not to); answers
		// may come after the final ping's, which the server may have
		// handled first.
		waiting := map[string]bool{}
		if !cancels {
			for id, n := range wantIDs {
				if n == 1 && id != `"fuzz-init"` {
					waiting[id] = true
				}
			}
		}
		gotIDs := map[string]int{}
		var got [][]byte
		for final := false; !final || len(waiting) > 0; {
			select {
			case a, ok := <-answers:
				if !ok {
					t.Fatalf("stdout ended before the final ping was answered; answers: %q", got)
				}
				got = append(got, a)
				if !json.Valid(a) {
					t.Fatalf("answer %q is not JSON", a)
				}
				if n, ok := wantErrors[string(a)]; ok && n > 0 {
					wantErrors[string(a)]--
					continue
				}
				// One answer, or the answers to a batch.
				var resps []struct {
					ID json.RawMessage `json:"id"`
				}
				if a[0] != '[' {
					a = append(append([]byte{'['}, a...), ']')
				}
				_ = json.Unmarshal(a, &resps)
				for _, resp := range resps {
					if len(resp.ID) > 0 {
						gotIDs[string(resp.ID)]++
						delete(waiting, string(resp.ID))
						final = final || string(resp.ID) == `"`+stdioFinalID+`"`
					}
				}
			case <-ctx.Done():
				t.Fatalf("no answer to the final ping or to requests %v: the session died or is stuck; answers: %q", waiting, got)
			}
		}
		for a, n := range wantErrors {
			if n != 0 {
				t.Fatalf("filter answer %q missing; all answers %q", a, got)
			}
		}
		for id, n := range gotIDs {
			if n > 1 && wantIDs[id] == 1 {
				t.Fatalf("request %s answered %d times; answers %q", id, n, got)
			}
		}
		go func() {
			for range answers {
			}
		}()
		inW.Close()
		_ = ss.Wait()
		outW.Close()
	})
}
