package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// notingUpstream is an in-process go-sdk server whose tool note sends a
// progress notification for the token it is given in its arguments, then
// one for the request's own progressToken if it has one, and answers.
type notingUpstream struct{}

type noteIn struct {
	Token string `json:"token,omitempty"`
}

func (notingUpstream) Dial(ctx context.Context) (mcp.Connection, error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "noting", Version: "v0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "note"}, func(ctx context.Context, req *mcp.CallToolRequest, in noteIn) (*mcp.CallToolResult, any, error) {
		if in.Token != "" {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: in.Token, Progress: 1}); err != nil {
				return nil, nil, err
			}
		}
		if tok := req.Params.GetProgressToken(); tok != nil {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2}); err != nil {
				return nil, nil, err
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "noted"}}}, nil, nil
	})
	proxySide, serverSide := net.Pipe()
	if _, err := s.Connect(ctx, &mcp.IOTransport{Reader: serverSide, Writer: serverSide}, nil); err != nil {
		return nil, err
	}
	return (&mcp.IOTransport{Reader: proxySide, Writer: proxySide}).Connect(ctx)
}

func (notingUpstream) String() string { return "noting upstream" }

// streamTap records which HTTP requests' responses carried which
// progress tokens: "POST" for a request's own stream, "GET" for the
// standalone stream.
type streamTap struct {
	mu        sync.Mutex
	seen      map[string]string // progress token: the method of the response that carried it
	getOpened chan struct{}     // closed once the standalone stream is open
	once      sync.Once
}

func (tp *streamTap) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer alice")
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp, err
	}
	if r.Method == http.MethodGet && resp.StatusCode == http.StatusOK {
		tp.once.Do(func() { close(tp.getOpened) })
	}
	resp.Body = &tapBody{ReadCloser: resp.Body, tap: tp, method: r.Method}
	return resp, nil
}

// tapBody reads the events of a response as its reader does.
type tapBody struct {
	io.ReadCloser
	buf    bytes.Buffer
	tap    *streamTap
	method string
}

func (b *tapBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.buf.Write(p[:n])
	// Whole events only: each ends with a blank line.
	for {
		i := bytes.Index(b.buf.Bytes(), []byte("\n\n"))
		if i < 0 {
			break
		}
		ev, _ := newSSEReader(bytes.NewReader(b.buf.Next(i+2)), maxSSEEvent).next()
		var m struct {
			Method string `json:"method"`
			Params struct {
				Token any `json:"progressToken"`
			} `json:"params"`
		}
		if json.Unmarshal(ev.data, &m) == nil && m.Method == "notifications/progress" {
			b.tap.mu.Lock()
			b.tap.seen[fmt.Sprint(m.Params.Token)] = b.method
			b.tap.mu.Unlock()
		}
	}
	return n, err
}

// TestProgressOnCallStream: over Streamable HTTP, the upstream's progress
// for a running call reaches a go-sdk client on the call's own stream (the
// response to its POST), in a session (2025-11-25) and without one
// (2026-07-28); in a session, a notification about no running request
// comes on the standalone stream (its GET).
func TestProgressOnCallStream(t *testing.T) {
	for _, protocol := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(protocol, func(t *testing.T) {
			bp := newBoundedProxy(t, notingUpstream{}, Options{})
			tap := &streamTap{seen: map[string]string{}, getOpened: make(chan struct{})}
			progress := make(chan string, 8)
			client := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
					progress <- fmt.Sprint(req.Params.ProgressToken)
				}})
			cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: bp.url, HTTPClient: &http.Client{Transport: tap}},
				&mcp.ClientSessionOptions{ProtocolVersion: protocol})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cs.Close() })
			session := protocol < protocolStateless
			params := &mcp.CallToolParams{Name: "note", Arguments: map[string]any{}}
			if session {
				// What goes to the standalone stream before it opens is dropped.
				recv(t, tap.getOpened, "the client's standalone stream")
				params.Arguments = map[string]any{"token": "unrelated"}
			}
			params.SetProgressToken("mine")
			res, err := cs.CallTool(context.Background(), params)
			if err != nil || res.IsError {
				t.Fatalf("call: %v %q", err, textOf(res))
			}
			want := map[string]string{"mine": http.MethodPost}
			if session {
				want["unrelated"] = http.MethodGet
			}
			for got := map[string]bool{}; len(got) < len(want); {
				got[recv(t, progress, "the progress notifications")] = true
			}
			tap.mu.Lock()
			defer tap.mu.Unlock()
			for token, method := range want {
				if m := tap.seen[token]; m != method {
					t.Errorf("progress %q came on the response to %q, want %s", token, m, method)
				}
			}
		})
	}
}

// TestGetWithoutLastEventIDReplaysNothing: a GET without Last-Event-ID
// opens a new standalone stream that carries only what comes after it:
// not what was sent before the session's first GET (a server with no
// stream open drops a notification), nor what an earlier GET carried. A
// GET with Last-Event-ID resumes, and gets what came after that event.
func TestGetWithoutLastEventIDReplaysNothing(t *testing.T) {
	bp := newBoundedProxy(t, notingUpstream{}, Options{})
	session, status, body := openRaw(t, bp.url, "alice")
	if status != http.StatusOK {
		t.Fatalf("open: %d %s", status, body)
	}
	callID := 100
	// note sends its notification before it answers, and the proxy passes
	// the upstream's messages on in order: once the answer is back, the
	// notification went to the standalone stream (or was dropped).
	note := func(token string) {
		t.Helper()
		callID++
		msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"note","arguments":{"token":%q}}}`, callID, token)
		if resp, body := rawPost(t, bp.url, "alice", session, msg); resp.StatusCode != http.StatusOK || !strings.Contains(body, "noted") {
			t.Fatalf("note %s: %s %s", token, resp.Status, body)
		}
	}
	type event struct{ id, token string }
	get := func(lastID string) (events <-chan event, stop func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, bp.url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set(sessionHeader, session)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		// The server may not have seen the previous GET end yet.
		for deadline := time.Now().Add(waitFor); err == nil && resp.StatusCode == http.StatusConflict && time.Now().Before(deadline); {
			resp.Body.Close()
			<-time.After(10 * time.Millisecond)
			resp, err = http.DefaultClient.Do(req)
		}
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET (Last-Event-ID %q): %s", lastID, resp.Status)
		}
		ch := make(chan event, 16)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r := newSSEReader(resp.Body, maxSSEEvent)
			for {
				ev, err := r.next()
				if err != nil {
					return
				}
				var m struct {
					Params struct {
						Token string `json:"progressToken"`
					} `json:"params"`
				}
				json.Unmarshal(ev.data, &m)
				ch <- event{ev.id, m.Params.Token}
			}
		}()
		return ch, func() { cancel(); resp.Body.Close(); <-done }
	}

	note("before any stream")
	first, stop := get("")
	note("first")
	if ev := recv(t, first, "the first stream's event"); ev.token != "first" {
		t.Errorf("the first GET's first event: %q, want what came after it (first)", ev.token)
	}
	stop()

	second, stop := get("")
	note("second")
	ev := recv(t, second, "the second stream's event")
	if ev.token != "second" {
		t.Errorf("the second GET's first event: %q, want what came after it (second)", ev.token)
	}
	note("third")
	if ev := recv(t, second, "the second stream's next event"); ev.token != "third" {
		t.Errorf("the second GET's next event: %q, want third", ev.token)
	}
	stop()

	resumed, stop := get(ev.id)
	defer stop()
	if got := recv(t, resumed, "the resumed stream's event"); got.token != "third" {
		t.Errorf("resumed after %s: %q, want third", ev.id, got.token)
	}
}
