package sidecar

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// boundedProxy is a proxy over Streamable HTTP on 127.0.0.1 in front of
// up, each bearer token its own principal.
type boundedProxy struct {
	p   *Proxy
	db  *schema.DB
	url string
}

func newBoundedProxy(t *testing.T, up Dialer, opts Options) *boundedProxy {
	t.Helper()
	opts.Upstream = up
	p := newTestProxy(t, nil, opts)
	return &boundedProxy{p: p.Proxy, db: p.db, url: p.serveHTTP(t)}
}

// rawPost posts one JSON-RPC message as principal token, in session (if
// not empty), and returns the response with its body read.
func rawPost(t *testing.T, url, token, session string, msg string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(msg))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if session != "" {
		req.Header.Set(sessionHeader, session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

const rawInitialize = `{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-11-25",` +
	`"capabilities":{"elicitation":{"form":{}}},"clientInfo":{"name":"raw","version":"0"}}}`

// openRaw opens a session as token and returns its id, or the refusal.
func openRaw(t *testing.T, url, token string) (session string, status int, body string) {
	t.Helper()
	resp, body := rawPost(t, url, token, "", rawInitialize)
	if resp.StatusCode != http.StatusOK {
		return "", resp.StatusCode, body
	}
	session = resp.Header.Get(sessionHeader)
	if resp, body := rawPost(t, url, token, session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("initialized: %s %s", resp.Status, body)
	}
	return session, http.StatusOK, body
}

// TestHTTPSessionLimits: beyond the limit per principal a new session gets
// 429, beyond the proxy's 503, each with a JSON-RPC error under the
// initialize's id that names the limit and the flag that raises it; a
// DELETE makes room again.
func TestHTTPSessionLimits(t *testing.T) {
	bp := newBoundedProxy(t, newUpstream(), Options{MaxSessions: 3, MaxSessionsPerPrincipal: 2})
	a1, _, _ := openRaw(t, bp.url, "alice")
	if _, status, body := openRaw(t, bp.url, "alice"); status != http.StatusOK {
		t.Fatalf("alice's second session: %d %s", status, body)
	}
	refused := func(token string, wantStatus int, wantFlag string) {
		t.Helper()
		_, status, body := openRaw(t, bp.url, token)
		var msg struct {
			ID    any `json:"id"`
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &msg); err != nil {
			t.Fatalf("%s's refused session: %d %q: %v", token, status, body, err)
		}
		if status != wantStatus || msg.ID != float64(7) || msg.Error.Code != codeSessionLimit || !strings.Contains(msg.Error.Message, wantFlag+",") {
			t.Errorf("%s's refused session: %d %s; want %d, id 7 and an error naming %s", token, status, body, wantStatus, wantFlag)
		}
	}
	refused("alice", http.StatusTooManyRequests, "--max-sessions-per-principal")
	if _, status, body := openRaw(t, bp.url, "bob"); status != http.StatusOK {
		t.Fatalf("bob's session: %d %s", status, body)
	}
	refused("carol", http.StatusServiceUnavailable, "--max-sessions")

	req, _ := http.NewRequest(http.MethodDelete, bp.url, nil)
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(sessionHeader, a1)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The ended session counts until its tool server has exited, which
	// the DELETE's answer does not wait for: a new session meanwhile is
	// refused as one over the limit "ending". Poll, with a deadline.
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, status, body := openRaw(t, bp.url, "alice")
		if status == http.StatusOK {
			break
		}
		if !strings.Contains(body, "ending") || time.Now().After(deadline) {
			t.Fatalf("alice's session after a DELETE: %d %s", status, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHTTPSessionRefusalLog: a flood of sessions beyond the limit makes a
// line in the log per refusalEvery, not one per refusal, and the first
// refusal is logged as it happens.
func TestHTTPSessionRefusalLog(t *testing.T) {
	log := &outboxtest.LogBuffer{}
	bp := newBoundedProxy(t, newUpstream(), Options{MaxSessions: 1, Logger: log.Logger()})
	if _, status, body := openRaw(t, bp.url, "alice"); status != http.StatusOK {
		t.Fatalf("the one session: %d %s", status, body)
	}
	const flood, workers = 200, 8
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range flood / workers {
				if resp, body := rawPost(t, bp.url, "bob", "", rawInitialize); resp.StatusCode != http.StatusServiceUnavailable {
					t.Errorf("worker %d: %s %s, want 503", w, resp.Status, body)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	recs := log.Records(t, "refuse http session")
	if most := 1 + int(elapsed/refusalEvery) + 1; len(recs) == 0 || len(recs) > most {
		t.Fatalf("%d refusals in %v logged %d lines, want 1 to %d", flood, elapsed, len(recs), most)
	}
	if got := recs[0]["refused"]; got != float64(1) {
		t.Errorf("first line counts %v refusals, want 1: %v", got, recs[0])
	}
}

func TestRefusalLog(t *testing.T) {
	t.Parallel()
	log := &outboxtest.LogBuffer{}
	logger := log.Logger()
	var l refusalLog
	t0 := time.Unix(1e9, 0)
	l.refused(logger, "full", t0)
	for i := range 99 {
		l.refused(logger, "full", t0.Add(time.Duration(i)*time.Millisecond))
	}
	l.flush(logger, t0.Add(refusalEvery-time.Millisecond)) // not yet due
	l.refused(logger, "too many for bob", t0.Add(refusalEvery))
	l.refused(logger, "full", t0.Add(refusalEvery+time.Second))
	l.flush(logger, t0.Add(2*refusalEvery)) // the tail, by the reaper's tick
	l.flush(logger, t0.Add(5*refusalEvery)) // nothing pending: no line
	var got []string
	for _, r := range log.Records(t, "refuse http session") {
		got = append(got, fmt.Sprintf("%v %v", r["refused"], r["reason"]))
	}
	want := []string{"1 full", "100 too many for bob", "1 full"}
	if !slices.Equal(got, want) {
		t.Errorf("lines = %q, want %q", got, want)
	}
}

// TestHTTPSessionIdleTimeout: a session nobody uses ends after the idle
// timeout, and its upstream connection with it; one whose client holds a
// request open (its standalone stream) does not.
func TestHTTPSessionIdleTimeout(t *testing.T) {
	up := newUpstream()
	bp := newBoundedProxy(t, up, Options{SessionIdleTimeout: 100 * time.Millisecond})
	idle, _, _ := openRaw(t, bp.url, "alice")
	held, _, _ := openRaw(t, bp.url, "alice")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, bp.url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(sessionHeader, held)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()

	deadline := time.Now().Add(waitFor)
	for {
		r, _ := rawPost(t, bp.url, "alice", idle, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		if r.StatusCode == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle session still answers after %v", waitFor)
		}
		// Each ping is activity: wait past the timeout before the next.
		<-time.After(300 * time.Millisecond)
	}
	if r, body := rawPost(t, bp.url, "alice", held, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); r.StatusCode != http.StatusOK {
		t.Errorf("the session with its stream open: %s %s", r.Status, body)
	}
}

// TestCallTimeout: an upstream that does not answer a forwarded call holds
// it no longer than CallTimeout: the call is settled as unknown, and the
// client gets an error that names the timeout.
func TestCallTimeout(t *testing.T) {
	up := newUpstream()
	bp := newBoundedProxy(t, up, Options{CallTimeout: 200 * time.Millisecond})
	cs := httpClient(t, bp.url, "alice")
	res, err := call(t, cs, context.Background(), "block", "k-timeout", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || errorCode(res) != "outcome_unknown" || !strings.Contains(textOf(res), "call timeout") {
		t.Errorf("answer: %s %q; want an unknown outcome naming the call timeout", errorCode(res), textOf(res))
	}
	if got := outboxtest.CallStates(t, bp.db.Read); got != "unknown" {
		t.Errorf("calls: %s, want unknown", got)
	}
}

// TestCloseSettlesCalls: Close returns once the calls its sessions forwarded
// are settled, the one still waiting for its upstream as unknown, so that
// the database may close after it; its client is told that the proxy
// stopped, and to ask call_status.
func TestCloseSettlesCalls(t *testing.T) {
	up := newUpstream()
	bp := newBoundedProxy(t, up, Options{})
	cs := httpClient(t, bp.url, "alice")
	done := make(chan error, 1)
	go func() {
		_, err := call(t, cs, context.Background(), "block", "k-close", 1)
		done <- err
	}()
	recv(t, up.started, "the call at the upstream")
	bp.p.Close()
	if got := outboxtest.CallStates(t, bp.db.Read); got != "unknown" {
		t.Errorf("calls after Close: %s, want unknown", got)
	}
	if err := recv(t, done, "the client's answer"); err == nil || !strings.Contains(err.Error(), "the proxy stopped") || !strings.Contains(err.Error(), "call_status") {
		t.Errorf("the client's answer: %v; want an error saying the proxy stopped, naming call_status", err)
	}
}

func httpClient(t *testing.T, url, token string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer(token)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestUpstreamRequestAtInitialized: an HTTP upstream that asks the client
// something the moment it is initialized gets its request through the
// proxy to a client over HTTP every time, although the client opens its
// standalone stream only after its initialized was accepted (as the
// TypeScript SDK's does): the proxy opens its own stream to the upstream
// before it forwards initialized, and keeps what comes for the client's
// stream until the client opens it.
func TestUpstreamRequestAtInitialized(t *testing.T) {
	asked := make(chan error, 64)
	server := mcp.NewServer(&mcp.Implementation{Name: "asking", Version: "v0"}, &mcp.ServerOptions{
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), waitFor)
				defer cancel()
				_, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "name?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}}})
				asked <- err
			}()
		},
	})
	upSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(upSrv.Close) // after the proxy's cleanup, which ends its sessions there
	bp := newBoundedProxy(t, &HTTP{URL: upSrv.URL, Logger: testLogger(t)}, Options{})

	const sessions = 40
	got := 0
	for i := range sessions {
		session, status, body := openRaw(t, bp.url, "alice")
		if status != http.StatusOK {
			t.Fatalf("session %d: %d %s", i, status, body)
		}
		if elicited(t, bp.url, session, asked) {
			got++
		}
	}
	if got != sessions {
		t.Errorf("%d of %d elicitations reached the client", got, sessions)
	}
}

// elicited opens the session's standalone stream, and answers the
// elicitation that should come on it. It reports whether the request came;
// the upstream's end of it (asked) says when it never will: the upstream
// gets the client's answer, or an error when it could not send it.
func elicited(t *testing.T, url, session string, asked <-chan error) bool {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(sessionHeader, session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	requests := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(data, `"elicitation/create"`) {
				requests <- data
				return
			}
		}
	}()
	select {
	case data := <-requests:
		var m struct {
			ID any `json:"id"`
		}
		json.Unmarshal([]byte(data), &m)
		id, _ := json.Marshal(m.ID)
		rawPost(t, url, "alice", session, `{"jsonrpc":"2.0","id":`+string(id)+`,"result":{"action":"decline"}}`)
		if err := recv(t, asked, "the upstream's elicitation answered"); err != nil {
			t.Errorf("the upstream's elicitation, answered: %v", err)
		}
		return true
	case err := <-asked:
		t.Logf("the upstream's elicitation: %v", err)
		return false
	case <-time.After(waitFor):
		t.Fatalf("no elicitation, and no error at the upstream, after %v", waitFor)
		return false
	}
}

// bearer adds its token to every request.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
