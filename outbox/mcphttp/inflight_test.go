package mcphttp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
)

// limitServer serves NewHandler on 127.0.0.1 behind bearer tokens whose
// principal is the token itself, with two tools: block, which signals
// entered and answers once release is closed, and quick.
type limitServer struct {
	url     string
	entered chan struct{}
	release chan struct{}
}

func startLimitServer(t *testing.T, opts *Options) *limitServer {
	t.Helper()
	s := &limitServer{entered: make(chan struct{}, 16), release: make(chan struct{})}
	srv := mcp.NewServer(&mcp.Implementation{Name: "limits", Version: "v0"}, nil)
	type in struct{}
	mcp.AddTool(srv, &mcp.Tool{Name: "block"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ in) (*mcp.CallToolResult, any, error) {
		s.entered <- struct{}{}
		select {
		case <-s.release:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "released"}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "quick"}, func(context.Context, *mcp.CallToolRequest, in) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "quick"}}}, nil, nil
	})
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	o := *opts
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	hs := httptest.NewServer(auth.RequireBearerToken(verify, nil)(NewHandler(srv, &o)))
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
		hs.Close()
	})
	s.url = hs.URL
	return s
}

// call POSTs a stateless tools/call of tool as token.
func (s *limitServer) call(t *testing.T, token, tool string) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":{},"_meta":{`+
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, tool)
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", StatelessVersion)
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// blockAs starts a call of block as token and returns once it runs; its
// answer comes on the channel after release.
func (s *limitServer) blockAs(t *testing.T, token string) <-chan string {
	t.Helper()
	answer := make(chan string, 1)
	go func() {
		// Not s.call: t.Fatal must not run off the test's goroutine.
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"block","arguments":{},"_meta":{` +
			`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", StatelessVersion)
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "block")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answer <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking call never ran")
	}
	return answer
}

// wantRefused checks a refusal: its status, Retry-After, and a JSON-RPC
// error that names the limit's flag.
func wantRefused(t *testing.T, resp *http.Response, status int, flag string) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Errorf("no Retry-After on %d", status)
	}
	var msg struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &msg); err != nil || msg.Error.Code == 0 {
		t.Fatalf("body %s: not a JSON-RPC error (%v)", b, err)
	}
	if !strings.Contains(msg.Error.Message, flag+",") {
		t.Errorf("message %q does not name %s", msg.Error.Message, flag)
	}
}

func wantAnswered(t *testing.T, resp *http.Response, text string) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(text)) {
		t.Fatalf("status %d, want 200 with %q: %s", resp.StatusCode, text, b)
	}
}

func TestInFlightPerPrincipal(t *testing.T) {
	s := startLimitServer(t, &Options{MaxInFlightPerPrincipal: 2})
	a1, a2 := s.blockAs(t, "alice"), s.blockAs(t, "alice")
	wantRefused(t, s.call(t, "alice", "quick"), http.StatusTooManyRequests, "--max-in-flight-per-principal")
	// Another principal is not held up by alice's calls.
	wantAnswered(t, s.call(t, "bob", "quick"), "quick")
	close(s.release)
	for _, a := range []<-chan string{a1, a2} {
		if got := <-a; !strings.HasPrefix(got, "200 ") || !strings.Contains(got, "released") {
			t.Errorf("held call answered %q", got)
		}
	}
	// Her places are free again.
	wantAnswered(t, s.call(t, "alice", "quick"), "quick")
}

// TestInFlightBytesPerPrincipal: a principal's bodies in flight are
// bounded by their length, which is what bounds memory; a principal with
// nothing in flight is let in whatever its body's length, and another
// principal is not held up.
func TestInFlightBytesPerPrincipal(t *testing.T) {
	s := startLimitServer(t, &Options{MaxInFlightBytesPerPrincipal: 100}) // each call's body is about 200 bytes
	held := s.blockAs(t, "alice")                                         // let in: nothing of hers in flight
	wantRefused(t, s.call(t, "alice", "quick"), http.StatusTooManyRequests, "--max-in-flight-bytes-per-principal")
	wantAnswered(t, s.call(t, "bob", "quick"), "quick")
	close(s.release)
	if got := <-held; !strings.HasPrefix(got, "200 ") {
		t.Fatalf("held call answered %q", got)
	}
	wantAnswered(t, s.call(t, "alice", "quick"), "quick")
}

func TestInFlightTotal(t *testing.T) {
	s := startLimitServer(t, &Options{MaxInFlight: 2})
	s.blockAs(t, "alice")
	s.blockAs(t, "bob")
	wantRefused(t, s.call(t, "carol", "quick"), http.StatusServiceUnavailable, "--max-in-flight")
}

// TestInFlightEventStreamNotCounted: a session's standalone stream (its
// GET) stays open as long as the session; counted, it would take the
// principal's only place and refuse the session's own calls.
func TestInFlightEventStreamNotCounted(t *testing.T) {
	s := startLimitServer(t, &Options{MaxInFlight: 1, MaxInFlightPerPrincipal: 1})
	post := func(session, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer alice")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	init := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	io.ReadAll(init.Body)
	session := init.Header.Get("Mcp-Session-Id")
	if session == "" {
		t.Fatalf("initialize: status %d, no session", init.StatusCode)
	}
	if r := post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); r.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d", r.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, s.url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	stream, err := http.DefaultClient.Do(req) // returns with the stream's headers; it stays open
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("event stream: status %d", stream.StatusCode)
	}
	wantAnswered(t, post(session, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"quick","arguments":{}}}`), "quick")
}

// nested is a tools/call whose arguments nest depth levels of arrays
// (the body three more: message, params, arguments).
func nested(depth int) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"n":1,"x":` +
		strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth) + `},"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
}

func TestDepthRefusedBeforeSDK(t *testing.T) {
	reached := false
	h := liftParamsKey(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }), DefaultMaxDepth)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newCallRequest(nested(DefaultMaxDepth)))
	if rec.Code != http.StatusBadRequest || reached {
		t.Fatalf("status %d, reached %v; want 400 before the SDK", rec.Code, reached)
	}
	var msg struct {
		ID    any `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &msg); err != nil || msg.Error.Code != -32600 || msg.ID != 1.0 ||
		!strings.Contains(msg.Error.Message, fmt.Sprint(DefaultMaxDepth)) || !strings.Contains(msg.Error.Message, "MaxDepth") {
		t.Errorf("body %s (%v): want a -32600 error naming the limit, under the request's id", rec.Body, err)
	}
}

func TestIDBeforeCut(t *testing.T) {
	deep := strings.Repeat("[", 10)
	for _, tc := range []struct{ in, want string }{
		{`{"jsonrpc":"2.0","id":7,"params":` + deep, `7`},
		{`{"id":"a", "id" : "b" ,"params":` + deep, `"b"`},
		{`{"\u0069d":3,"params":` + deep, `3`},
		{`{"params":` + deep + `]],"id":1}`, `null`}, // after the cut: not looked at
		{`{"id":1,"x":tru,"params":` + deep, `null`}, // malformed before the cut
		{`{"id":{},"params":` + deep, `null`},        // not a usable id
		{`[{"id":1,"params":` + deep, `null`},        // a batch
	} {
		cut := checkDepth([]byte(tc.in), 3)
		if cut < 0 {
			t.Fatalf("%s: not too deep", tc.in)
		}
		if got := string(idBeforeCut([]byte(tc.in), cut)); got != tc.want {
			t.Errorf("idBeforeCut(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestDepthThroughHandler: NewHandler serves a body of the default depth
// and refuses one level more, and Options.MaxDepth moves the bound.
func TestDepthThroughHandler(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxDepth int
		depth    int // of the arguments' nesting; the body is 3 deeper
		want     int
	}{
		{"AtDefault", 0, DefaultMaxDepth - 3, http.StatusOK},
		{"PastDefault", 0, DefaultMaxDepth - 2, http.StatusBadRequest},
		{"Raised", 200, 150, http.StatusOK},
		{"Off", -1, 500, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHandler(echoServer(), &Options{MaxDepth: tc.maxDepth})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, newCallRequest(nested(tc.depth)))
			if rec.Code != tc.want {
				t.Fatalf("status %d, want %d: %.300s", rec.Code, tc.want, rec.Body)
			}
			if tc.want == http.StatusOK && !strings.Contains(rec.Body.String(), `"ok"`) {
				t.Errorf("no answer of the tool: %.300s", rec.Body)
			}
		})
	}
}

func TestCheckDepth(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		deep bool
	}{
		{`[[1]]`, 2, false},
		{`[[[1]]]`, 2, true},
		{`{"a":{"b":1}}`, 2, false},
		{`{"a":"[[[[{{{{"}`, 1, false}, // brackets in strings do not count
		{`{"a":"\"[[[["}`, 1, false},   // nor after an escaped quote
		{`{"a":"\\"}, [[[`, 3, false},  // an escaped backslash ends before the quote
		{`[]]]]][[[`, 3, false},        // unbalanced closers do not go below zero
		{`{"a":"\\",[[[[]]]]}`, 4, true},
	} {
		if got := checkDepth([]byte(tc.in), tc.max) >= 0; got != tc.deep {
			t.Errorf("checkDepth(%s, %d) = %v, want %v", tc.in, tc.max, got, tc.deep)
		}
	}
}

// TestLiftSplicesWithoutDecoding: a body that needs no lift is passed on
// as the same bytes, and one that does keeps everything but the spliced
// _meta byte for byte (no re-encoding: member order, white space and
// escapes stay).
func TestLiftSplicesWithoutDecoding(t *testing.T) {
	plain := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"idempotencyKey":"k"}}}`)
	if out, changed := liftBody(plain); changed || &out[0] != &plain[0] {
		t.Errorf("a body without a lift was copied or changed: %s", out)
	}
	in := `{ "method" : "tools/call", "id":1, "jsonrpc":"2.0", "params":{"z":"\u00e9", "_meta":{"a":1}, "idempotencyKey" : "k"}}`
	want := `{ "method" : "tools/call", "id":1, "jsonrpc":"2.0", "params":{"z":"\u00e9", "_meta":{"a":1,"io.github.mcp-outbox/paramsIdempotencyKey":"k"}, "idempotencyKey" : "k"}}`
	if out, changed := liftBody([]byte(in)); !changed || string(out) != want {
		t.Errorf("liftBody =\n%s, want\n%s", out, want)
	}
}

// BenchmarkLiftNothing is the lift's cost for a 4 MiB call that needs
// none: a scan, no allocation.
func BenchmarkLiftNothing(b *testing.B) {
	body := []byte(largeCall(4<<20 - 4096))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, changed := liftBody(body); changed {
			b.Fatal("lifted")
		}
	}
}

// TestCancelsTagSplices: the cancels wrapper tags each tools/call of a
// session's body, a batch's too, by splicing its handle into _meta: the
// rest of the body reaches the SDK byte for byte.
func TestCancelsTagSplices(t *testing.T) {
	var got []byte
	h := newCancels().wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
	}))
	in := `[ {"method":"tools/call", "params":{"name":"a", "_meta":{"k":1}}, "id":1, "jsonrpc":"2.0"},` +
		`{"params":{"name":"b"},"jsonrpc":"2.0","id":"two","method":"tools/call"} ]`
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(in))
	r.Header.Set("Mcp-Session-Id", "s")
	h.ServeHTTP(httptest.NewRecorder(), r)
	handle := regexp.MustCompile(`"` + regexp.QuoteMeta(cancelnote.MetaKey) + `":"[^"]+"`)
	if n := len(handle.FindAll(got, -1)); n != 2 {
		t.Fatalf("%d handles in %s, want 2", n, got)
	}
	if rest := handle.ReplaceAllString(string(got), "H"); rest != `[ {"method":"tools/call", "params":{"name":"a", "_meta":{"k":1,H}}, "id":1, "jsonrpc":"2.0"},`+
		`{"params":{"_meta":{H},"name":"b"},"jsonrpc":"2.0","id":"two","method":"tools/call"} ]` {
		t.Errorf("body passed on:\n%s", rest)
	}
}
