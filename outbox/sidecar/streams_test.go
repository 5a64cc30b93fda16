package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// notingUpstream is an in-process go-sdk server whose tool note sends a
// progress notification for the token it is given in its arguments, then
// one for the request's own progressToken if it has one, and answers.
type notingUpstream struct{}

type noteIn struct {
	Token string `json:"token"`
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
