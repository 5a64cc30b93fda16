package sidecar

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// waitFor bounds every wait of these tests for something to happen.
const waitFor = 30 * time.Second

// httpUpstream is a go-sdk server behind the go-sdk's own
// StreamableHTTPHandler on 127.0.0.1, with a view on the GETs of the
// standalone stream.
type httpUpstream struct {
	server   *mcp.Server
	url      string
	sessions chan *mcp.ServerSession // each session, once initialized
	gets     chan http.Header        // each GET's headers, as it arrives
	streams  chan struct{}           // a GET's stream is set up: what the server sends from now on goes on it

	mu   sync.Mutex
	hold chan struct{}                                 // the next GET waits until it is closed
	drop context.CancelFunc                            // ends the current GET, as a server dropping it
	fake func(http.ResponseWriter, *http.Request, int) // answers the GETs instead of the handler
	nget int
}

func newHTTPUpstream(t *testing.T, opts *mcp.StreamableHTTPOptions) *httpUpstream {
	t.Helper()
	u := &httpUpstream{
		sessions: make(chan *mcp.ServerSession, 8),
		gets:     make(chan http.Header, 16),
		streams:  make(chan struct{}, 16),
	}
	u.server = mcp.NewServer(&mcp.Implementation{Name: "http-upstream", Version: "v0"}, &mcp.ServerOptions{
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) {
			select {
			case u.sessions <- req.Session:
			default:
			}
		},
	})
	mcp.AddTool(u.server, &mcp.Tool{Name: "work"}, func(ctx context.Context, _ *mcp.CallToolRequest, in workIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("work %d", in.N)}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return u.server }, opts)
	ts := httptest.NewServer(u.watch(h))
	t.Cleanup(ts.Close)
	u.url = ts.URL
	return u
}

func (u *httpUpstream) watch(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		u.mu.Lock()
		hold, fake := u.hold, u.fake
		u.hold = nil
		u.nget++
		n := u.nget
		u.mu.Unlock()
		u.gets <- r.Header.Clone()
		if fake != nil {
			fake(w, r, n)
			return
		}
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		u.mu.Lock()
		u.drop = cancel
		u.mu.Unlock()
		h.ServeHTTP(&flushWatch{ResponseWriter: w, flushed: u.streams}, r.WithContext(ctx))
	})
}

// flushWatch signals the first flush of a GET's answer. The go-sdk's
// handler flushes the stream's first comment while it holds the stream,
// and lets it go only once it writes there: what the server sends after
// the signal goes on this stream.
type flushWatch struct {
	http.ResponseWriter
	flushed chan<- struct{}
	once    sync.Once
}

func (f *flushWatch) Flush() {
	if fl, ok := f.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
	f.once.Do(func() { f.flushed <- struct{}{} })
}

func (f *flushWatch) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// authTransport adds a bearer token, as a dialer's client for an upstream
// behind auth would, and counts the GETs.
type authTransport struct {
	gets atomic.Int64
}

func (a *authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet {
		a.gets.Add(1)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer up-token")
	return http.DefaultTransport.RoundTrip(r)
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (u *httpUpstream) dialer(t *testing.T, rt http.RoundTripper) *HTTP {
	return &HTTP{URL: u.url, Client: &http.Client{Transport: rt}, Logger: testLogger(t), minRetry: 10 * time.Millisecond, maxRetry: 100 * time.Millisecond}
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("no %s after %v", what, waitFor)
		panic("unreachable")
	}
}

// noStreamGoroutines fails if a goroutine of an upstream HTTP connection
// outlives it. One may be returning from its last deferred call when Close
// does: it gets that moment, not more.
func noStreamGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "internal/proxy.(*httpConn)") {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("a goroutine of the upstream connection outlived it:\n%s", stacks)
			return
		}
		runtime.Gosched()
	}
}

// TestHTTPUpstreamStandaloneStream: the messages a Streamable HTTP
// upstream sends outside requests (a list_changed notification, a request
// of its own) reach the client through the proxy, over the standalone
// stream the proxy opens with the session's headers and the dialer's.
func TestHTTPUpstreamStandaloneStream(t *testing.T) {
	u := newHTTPUpstream(t, nil)
	rt := &authTransport{}
	changed := make(chan struct{}, 8)
	client := &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "ada"}}, nil
		},
	}
	// The client's default: the newest protocol, which the stateful
	// upstream refuses, and initialize under 2025-11-25 after that.
	cs, stop := proxyTo(t, false, u.dialer(t, rt), client, nil)
	ss := recv(t, u.sessions, "initialized session")
	h := recv(t, u.gets, "GET of the standalone stream")
	for name, want := range map[string]string{
		"Accept":               "text/event-stream",
		"Mcp-Session-Id":       ss.ID(),
		"Mcp-Protocol-Version": "2025-11-25",
		"Authorization":        "Bearer up-token",
		"Last-Event-ID":        "",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("GET header %s = %q, want %q", name, got, want)
		}
	}
	recv(t, u.streams, "standalone stream set up")

	mcp.AddTool(u.server, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, workIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	recv(t, changed, "tools/list_changed at the client")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if !slices.Contains(names, "late") || !slices.Contains(names, outbox.StatusToolName) {
		t.Errorf("tools after the change = %v", names)
	}

	// A request of the upstream's own, outside any request of the
	// client's: it comes on the standalone stream, and the client's answer
	// goes back in a POST.
	answer, err := ss.Elicit(ctx, &mcp.ElicitParams{
		Message:         "name?",
		RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}},
	})
	if err != nil {
		t.Fatalf("elicitation from the upstream: %v", err)
	}
	if answer.Action != "accept" || answer.Content["name"] != "ada" {
		t.Errorf("elicitation answered %+v, want accept with the client's name", answer)
	}

	res, err := call(t, cs, ctx, "work", "s-1", 1)
	if err != nil || res.IsError || textOf(res) != "work 1" {
		t.Errorf("call over the HTTP upstream: %v %v", res, err)
	}

	stop()
	if n := rt.gets.Load(); n != 1 {
		t.Errorf("%d GETs, want 1", n)
	}
	noStreamGoroutines(t)
}

// TestHTTPUpstreamStreamReconnects: the upstream drops the standalone
// stream; the proxy opens it again from the last event id, and what the
// upstream sent in between is replayed from its event store.
func TestHTTPUpstreamStreamReconnects(t *testing.T) {
	u := newHTTPUpstream(t, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	progress := make(chan string, 8)
	client := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		progress <- fmt.Sprint(req.Params.ProgressToken)
	}}
	cs, stop := proxyTo(t, false, u.dialer(t, &authTransport{}), client, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	ss := recv(t, u.sessions, "initialized session")
	if h := recv(t, u.gets, "GET of the standalone stream"); h.Get("Mcp-Protocol-Version") != "2025-06-18" {
		t.Errorf("GET with protocol version %q, want the negotiated 2025-06-18", h.Get("Mcp-Protocol-Version"))
	}
	recv(t, u.streams, "standalone stream set up")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	notify := func(token string) {
		t.Helper()
		if err := ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1}); err != nil {
			t.Fatalf("progress %s: %v", token, err)
		}
	}
	notify("before")
	if got := recv(t, progress, "progress before the drop"); got != "before" {
		t.Fatalf("progress %q, want before", got)
	}

	// The next GET waits, so that the upstream sends while no stream is
	// open.
	hold := make(chan struct{})
	u.mu.Lock()
	u.hold = hold
	drop := u.drop
	u.mu.Unlock()
	drop()
	h := recv(t, u.gets, "GET reopening the stream")
	if got := h.Get("Last-Event-ID"); got == "" {
		t.Error("the stream was reopened without Last-Event-ID")
	}
	if h.Get("Mcp-Session-Id") != ss.ID() {
		t.Errorf("reopened with session %q, want %q", h.Get("Mcp-Session-Id"), ss.ID())
	}
	notify("while-away")
	close(hold)
	recv(t, u.streams, "standalone stream set up again")
	if got := recv(t, progress, "progress sent while the stream was down"); got != "while-away" {
		t.Fatalf("progress %q, want while-away", got)
	}
	notify("after")
	if got := recv(t, progress, "progress after the reconnect"); got != "after" {
		t.Fatalf("progress %q, want after", got)
	}
	if err := cs.Ping(ctx, nil); err != nil {
		t.Errorf("ping after the reconnect: %v", err)
	}
	stop()
	noStreamGoroutines(t)
}

// TestHTTPUpstreamBadStream: a stream with everything SSE allows (comments,
// events split over data lines, other event types, CR line ends) and
// things it should not carry (data that is no JSON-RPC) is read for its
// messages, the rest skipped; the reopened GET carries the last event id,
// and a 405 then ends the stream for good, the session going on.
func TestHTTPUpstreamBadStream(t *testing.T) {
	u := newHTTPUpstream(t, nil)
	refused := make(chan struct{})
	u.mu.Lock()
	u.fake = func(w http.ResponseWriter, r *http.Request, n int) {
		if n > 1 {
			http.Error(w, "no more", http.StatusMethodNotAllowed)
			if n == 2 {
				close(refused)
			}
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		io.WriteString(w, "\xef\xbb\xbf: hello\n\n"+
			"event: ping\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n"+
			"data: not json\nid: 6\n\n"+
			"data\n\n"+
			"id: 7\r\ndata: {\"jsonrpc\":\"2.0\",\r\n: between\r\ndata:\"method\":\"notifications/progress\",\rdata: \"params\":{\"progressToken\":\"split\",\"progress\":1}}\r\n\r\n"+
			"retry: 5\n\n"+
			"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"cut\"")
	}
	u.mu.Unlock()
	progress := make(chan string, 8)
	changed := make(chan struct{}, 8)
	client := &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- fmt.Sprint(req.Params.ProgressToken)
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}
	cs, stop := proxyTo(t, false, u.dialer(t, http.DefaultTransport), client, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	recv(t, u.gets, "GET of the standalone stream")
	if got := recv(t, progress, "progress split over data lines"); got != "split" {
		t.Errorf("progress %q, want split", got)
	}
	if h := recv(t, u.gets, "GET reopening the stream"); h.Get("Last-Event-ID") != "7" {
		t.Errorf("reopened with Last-Event-ID %q, want 7", h.Get("Last-Event-ID"))
	}
	recv(t, refused, "405")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if res, err := call(t, cs, ctx, "work", "b-1", 2); err != nil || res.IsError {
		t.Errorf("call after the stream ended: %v %v", res, err)
	}
	stop()
	select {
	case <-changed:
		t.Error("an event of type ping was taken for a message")
	default:
	}
	select {
	case got := <-progress:
		t.Errorf("progress %q, from an event cut off by the stream's end", got)
	default:
	}
	noStreamGoroutines(t)
}

// TestHTTPUpstreamNoStandalone: a stateless upstream has no standalone
// stream. A client under 2026-07-28 opens none (that version has none);
// one that initializes under an older version gets the 405, quietly.
func TestHTTPUpstreamNoStandalone(t *testing.T) {
	u := newHTTPUpstream(t, &mcp.StreamableHTTPOptions{Stateless: true})

	t.Run("proxied", func(t *testing.T) {
		rt := &authTransport{}
		cs, stop := proxyTo(t, false, u.dialer(t, rt), nil, nil)
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		if got := cs.InitializeResult().ProtocolVersion; got != protocolNoStandalone {
			t.Errorf("negotiated %q, want %s", got, protocolNoStandalone)
		}
		// Learnt from server/discover, which the proxy rewrites as it does
		// an initialize answer.
		if caps := cs.InitializeResult().Capabilities; caps == nil || caps.Experimental[outbox.CapabilityName] == nil {
			t.Errorf("capabilities under %s do not advertise %q: %+v", protocolNoStandalone, outbox.CapabilityName, caps)
		}
		if res, err := call(t, cs, ctx, "work", "n-1", 3); err != nil || res.IsError || textOf(res) != "work 3" {
			t.Errorf("call: %v %v", res, err)
		}
		stop()
		if n := rt.gets.Load(); n != 0 {
			t.Errorf("%d GETs under %s, want none", n, protocolNoStandalone)
		}
		noStreamGoroutines(t)
	})

	// The go-sdk's servers answer an initialize under 2026-07-28 with an
	// older version; this one takes it.
	newest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "no", http.StatusMethodNotAllowed)
			return
		}
		if req.ID == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		result := `{}`
		if req.Method == "initialize" {
			result = `{"protocolVersion":"` + protocolNoStandalone + `","capabilities":{},"serverInfo":{"name":"newest","version":"v0"}}`
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Mcp-Session-Id", "newest-session")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, req.ID, result)
	}))
	defer newest.Close()

	for _, tc := range []struct {
		version string
		url     string
		gets    int64
	}{{protocolNoStandalone, newest.URL, 0}, {"2025-11-25", u.url, 1}} {
		t.Run(tc.version, func(t *testing.T) {
			rt := &authTransport{}
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			d := u.dialer(t, rt)
			d.URL = tc.url
			conn, err := d.Dial(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			roundTrip := func(id int64, method string, params any) *jsonrpc.Response {
				t.Helper()
				b, _ := json.Marshal(params)
				if err := conn.Write(ctx, &jsonrpc.Request{ID: mustID(id), Method: method, Params: b}); err != nil {
					t.Fatalf("%s: %v", method, err)
				}
				msg, err := conn.Read(ctx)
				if err != nil {
					t.Fatalf("%s: %v", method, err)
				}
				resp, ok := msg.(*jsonrpc.Response)
				if !ok || resp.Error != nil {
					t.Fatalf("%s: %v", method, msg)
				}
				return resp
			}
			init := roundTrip(1, "initialize", map[string]any{
				"protocolVersion": tc.version,
				"capabilities":    map[string]any{},
				"clientInfo":      map[string]any{"name": "raw", "version": "v0"},
			})
			var res struct{ ProtocolVersion string }
			if err := json.Unmarshal(init.Result, &res); err != nil || res.ProtocolVersion != tc.version {
				t.Fatalf("initialize answered %s (%v), want version %s", init.Result, err, tc.version)
			}
			if err := conn.Write(ctx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
			c := conn.(*httpConn)
			c.mu.Lock()
			started := c.streamDone != nil
			c.mu.Unlock()
			if started != (tc.gets > 0) {
				t.Errorf("stream started: %v, want %v", started, tc.gets > 0)
			}
			if tc.gets > 0 {
				recv(t, u.gets, "GET of the standalone stream")
				c.mu.Lock()
				done := c.streamDone
				c.mu.Unlock()
				recv(t, done, "end of the stream after the 405")
			}
			roundTrip(2, "ping", map[string]any{})
			if err := conn.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if n := rt.gets.Load(); n != tc.gets {
				t.Errorf("%d GETs, want %d", n, tc.gets)
			}
			noStreamGoroutines(t)
		})
	}
}

// TestSSEReader: the event stream format as the WHATWG standard reads it.
func TestSSEReader(t *testing.T) {
	type ev struct {
		name, data, id string
		hasID, large   bool
		retry          time.Duration
	}
	for _, tc := range []struct {
		name, in string
		max      int
		want     []ev
	}{
		{name: "data lines joined", in: "data: a\ndata:b\ndata:  c\n\n", want: []ev{{data: "a\nb\n c", retry: -1}}},
		{name: "line ends", in: "data: a\r\ndata: b\rdata: c\n\r\nid: 1\r\r", want: []ev{{data: "a\nb\nc", retry: -1}, {id: "1", hasID: true, retry: -1}}},
		{name: "comments", in: ": x\n\n:y\ndata: a\n: z\n\n", want: []ev{{data: "a", retry: -1}}},
		{name: "fields", in: "event: message\nid: 7\nretry: 250\ndata\n\n", want: []ev{{name: "message", id: "7", hasID: true, retry: 250 * time.Millisecond, data: ""}}},
		{name: "bad fields", in: "id: a\x00b\nretry: 1s\nfoo: bar\n\n", want: []ev{{retry: -1}}},
		{name: "empty id", in: "id\n\n", want: []ev{{hasID: true, retry: -1}}},
		// A byte order mark is skipped at the start only: later, it makes
		// the field another one.
		{name: "bom", in: "\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\n", want: []ev{{data: "a", retry: -1}, {retry: -1}}},
		{name: "cut off", in: "data: a\n\ndata: b\n", want: []ev{{data: "a", retry: -1}}},
		{name: "too large", max: 8, in: "data: 0123456789\ndata: x\nid: 3\n\ndata: ok\n\n", want: []ev{{large: true, retry: -1}, {data: "ok", retry: -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSSEReader(strings.NewReader(tc.in), cmp.Or(tc.max, 1<<10))
			var got []ev
			for {
				e, err := r.next()
				if err != nil {
					if err != io.EOF {
						t.Fatal(err)
					}
					break
				}
				got = append(got, ev{name: e.name, data: string(e.data), id: e.id, hasID: e.hasID, large: e.tooLarge, retry: e.retry})
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("events\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestHTTPUpstreamSessionGone: the upstream ends the session. The
// standalone stream, refused with 404 when it reopens, ends the upstream
// connection; the proxy opens a new session, initialized with the
// client's initialize, and the client hears from the upstream again.
func TestHTTPUpstreamSessionGone(t *testing.T) {
	u := newHTTPUpstream(t, nil)
	changed := make(chan struct{}, 8)
	client := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		changed <- struct{}{}
	}}
	cs, stop := proxyTo(t, false, u.dialer(t, &authTransport{}), client, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	first := recv(t, u.sessions, "initialized session")
	recv(t, u.gets, "GET of the standalone stream")
	recv(t, u.streams, "standalone stream set up")
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := recv(t, u.sessions, "session initialized again")
	for {
		h := recv(t, u.gets, "GET of the new session's stream")
		if h.Get("Mcp-Session-Id") == second.ID() {
			break
		}
		if h.Get("Mcp-Session-Id") != first.ID() {
			t.Fatalf("GET for session %q, want %q or %q", h.Get("Mcp-Session-Id"), first.ID(), second.ID())
		}
	}
	recv(t, u.streams, "new session's stream set up")
	mcp.AddTool(u.server, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, workIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	recv(t, changed, "tools/list_changed from the new session")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if res, err := call(t, cs, ctx, "work", "g-1", 4); err != nil || res.IsError {
		t.Errorf("call over the new session: %v %v", res, err)
	}
	stop()
	noStreamGoroutines(t)
}
