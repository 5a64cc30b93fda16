package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// upstream is an in-process go-sdk server standing in for a tool server
// that does not cooperate: its work happens outside the outbox's tables.
type upstream struct {
	runs    atomic.Int64 // calls of tool work
	dials   atomic.Int64
	started chan string   // tool block: its argument, once running
	stopped chan struct{} // tool block: its context ended

	mu   sync.Mutex
	conn net.Conn // the newest connection's server side
}

func newUpstream() *upstream {
	return &upstream{started: make(chan string, 8), stopped: make(chan struct{}, 8)}
}

type workIn struct {
	N int `json:"n"`
}

func (u *upstream) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "v0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "work"}, func(ctx context.Context, _ *mcp.CallToolRequest, in workIn) (*mcp.CallToolResult, any, error) {
		n := u.runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("work %d run %d", in.N, n)}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "block"}, func(ctx context.Context, _ *mcp.CallToolRequest, in workIn) (*mcp.CallToolResult, any, error) {
		u.started <- fmt.Sprint(in.N)
		<-ctx.Done()
		u.stopped <- struct{}{}
		return nil, nil, ctx.Err()
	})
	mcp.AddTool(s, &mcp.Tool{Name: "look", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ workIn) (*mcp.CallToolResult, any, error) {
			u.runs.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "looked"}}}, nil, nil
		})
	// ask asks the client for a name (an elicitation: a request of the
	// upstream's own) and answers with it.
	mcp.AddTool(s, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, _ workIn) (*mcp.CallToolResult, any, error) {
		answer, err := req.Session.Elicit(ctx, &mcp.ElicitParams{
			Message:         "name?",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}},
		})
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint("name ", answer.Content["name"])}}}, nil, nil
	})
	s.AddResource(&mcp.Resource{URI: "mem://a", Name: "a"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: "mem://a", Text: "hello"}}}, nil
	})
	return s
}

// Dial connects a new server instance, as a restarted process would be.
func (u *upstream) Dial(ctx context.Context) (mcp.Connection, error) {
	u.dials.Add(1)
	// A pipe of its own, so that kill can cut it like a dying process
	// would: closing the go-sdk session waits for its handlers instead.
	proxySide, serverSide := net.Pipe()
	if _, err := u.server().Connect(ctx, &mcp.IOTransport{Reader: serverSide, Writer: serverSide}, nil); err != nil {
		return nil, err
	}
	u.mu.Lock()
	u.conn = serverSide
	u.mu.Unlock()
	return (&mcp.IOTransport{Reader: proxySide, Writer: proxySide}).Connect(ctx)
}

func (u *upstream) String() string { return "in-memory upstream" }

// kill ends the current upstream connection, as a crash would.
func (u *upstream) kill() {
	u.mu.Lock()
	c := u.conn
	u.mu.Unlock()
	c.Close()
}

// connect starts a proxy in front of u and a client in front of it.
func connect(t *testing.T, u *upstream, cooperating bool) *mcp.ClientSession {
	t.Helper()
	cs, _ := proxyTo(t, cooperating, u, nil, nil)
	return cs
}

// proxyTo starts a proxy (cooperating or not) in front of up and a go-sdk client in front of it;
// stop ends both and returns once the proxy's session is over.
func proxyTo(t *testing.T, cooperating bool, up Dialer, copts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) (cs *mcp.ClientSession, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	db, err := schema.Open(ctx, filepath.Join(t.TempDir(), "proxy.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	layer, err := outbox.New(db, &outbox.Options{InFlightWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Layer: layer, Upstream: up, Cooperating: cooperating, Logger: testLogger(t), MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ct, pt := mcp.NewInMemoryTransports()
	pconn, err := pt.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, pconn) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if cs != nil {
				cs.Close()
			}
			cancel()
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	cs, err = mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, copts).Connect(ctx, ct, sopts)
	if err != nil {
		t.Fatal(err)
	}
	return cs, stop
}

func call(t *testing.T, cs *mcp.ClientSession, ctx context.Context, tool, key string, n int) (*mcp.CallToolResult, error) {
	t.Helper()
	p := &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"n": n}}
	if key != "" {
		p.Meta = mcp.Meta{outbox.MetaKeyIdempotency: key}
	}
	return cs.CallTool(ctx, p)
}

func textOf(res *mcp.CallToolResult) string {
	var s string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}

func errorCode(res *mcp.CallToolResult) string {
	code, _ := res.Meta[outbox.MetaKeyError].(string)
	return code
}

// TestConcurrentCalls: many calls at once, each forwarded once and answered
// with its own result; their retries are replayed without reaching the
// upstream.
func TestConcurrentCalls(t *testing.T) {
	u := newUpstream()
	cs := connect(t, u, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 32
	for round := range 2 {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				res, err := call(t, cs, ctx, "work", fmt.Sprintf("k-%d", i), i)
				if err != nil || res.IsError {
					t.Errorf("round %d call %d: %v %v", round, i, err, res)
					return
				}
				if want := fmt.Sprintf("work %d run", i); len(textOf(res)) < len(want) || textOf(res)[:len(want)] != want {
					t.Errorf("round %d call %d answered %q: another call's answer", round, i, textOf(res))
				}
				m, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
				if replayed := round == 1; m == nil || m["replayed"] != replayed {
					t.Errorf("round %d call %d: meta %v, want replayed=%v", round, i, res.Meta, replayed)
				}
			})
		}
		wg.Wait()
	}
	if got := u.runs.Load(); got != n {
		t.Errorf("upstream ran %d calls, want %d", got, n)
	}
}

// TestPassThrough: read-only tools, resources and the tool list come from
// the upstream; the list gains the status tool.
func TestPassThrough(t *testing.T) {
	u := newUpstream()
	cs := connect(t, u, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if fmt.Sprint(names) != fmt.Sprint([]string{"ask", "block", "look", "work", outbox.StatusToolName}) {
		t.Errorf("tools = %v", names)
	}
	for range 2 {
		res, err := call(t, cs, ctx, "look", "same-key", 1)
		if err != nil || res.IsError || res.Meta[outbox.MetaKeyCall] != nil {
			t.Fatalf("read-only tool: %v %v, want its own answer, unrecorded", res, err)
		}
	}
	if got := u.runs.Load(); got != 2 {
		t.Errorf("read-only tool ran %d times, want 2: it is not recorded", got)
	}
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "mem://a"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "hello" {
		t.Errorf("resources/read through the proxy: %v %v", rr, err)
	}
	if err := cs.Ping(ctx, nil); err != nil {
		t.Errorf("ping through the proxy: %v", err)
	}
}

// TestCancelPassesThrough: a client's cancellation reaches the upstream's
// handler. The forwarded call may have run, so it becomes unknown, and its
// retry is not forwarded again.
func TestCancelPassesThrough(t *testing.T) {
	u := newUpstream()
	cs := connect(t, u, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := call(t, cs, cctx, "block", "c-1", 7)
		done <- err
	}()
	select {
	case <-u.started:
	case <-ctx.Done():
		t.Fatal("the call did not reach the upstream")
	}
	ccancel()
	select {
	case <-u.stopped:
	case <-ctx.Done():
		t.Fatal("the cancellation did not reach the upstream's handler")
	}
	if err := <-done; err == nil {
		t.Error("the cancelled call was answered")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := call(t, cs, ctx, "block", "c-1", 7)
		if err != nil {
			t.Fatal(err)
		}
		if errorCode(res) == "outcome_unknown" {
			break
		}
		// The cancelled attempt may still be settling: an in-progress answer.
		if errorCode(res) != "in_progress" || time.Now().After(deadline) {
			t.Fatalf("retry of the cancelled call: %s (%v), want outcome_unknown", textOf(res), res.Meta)
		}
	}
	select {
	case n := <-u.started:
		t.Errorf("the unknown call was forwarded again (%s)", n)
	default:
	}
}

// TestUpstreamRestart: the upstream dies with a call in flight. That call
// becomes unknown; the session goes on over a new upstream, initialized
// again by the proxy.
func TestUpstreamRestart(t *testing.T) {
	u := newUpstream()
	cs := connect(t, u, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if res, err := call(t, cs, ctx, "work", "r-1", 1); err != nil || res.IsError {
		t.Fatalf("first call: %v %v", res, err)
	}
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := call(t, cs, ctx, "block", "r-2", 2)
		if err != nil {
			t.Errorf("call in flight at the crash: %v, want a tool error", err)
		}
		done <- res
	}()
	<-u.started
	u.kill()
	res := <-done
	if res == nil || errorCode(res) != "outcome_unknown" {
		t.Fatalf("call in flight at the crash: %v, want outcome_unknown", res)
	}
	res, err := call(t, cs, ctx, "work", "r-3", 3)
	if err != nil || res.IsError {
		t.Fatalf("call after the restart: %v %v", res, err)
	}
	if got := u.dials.Load(); got != 2 {
		t.Errorf("dials = %d, want 2", got)
	}
}

// TestUpstreamRequestIDsAcrossRestart: the upstream's own requests reach
// the client under the proxy's ids. A restarted upstream numbers its
// requests from 1 again; the client's late answer to the dead upstream's
// request must not reach the new one as the answer to its own.
func TestUpstreamRequestIDsAcrossRestart(t *testing.T) {
	u := newUpstream()
	type asked struct{ answer chan string }
	asks := make(chan asked, 4)
	client := &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			a := asked{answer: make(chan string, 1)}
			asks <- a
			select {
			case name := <-a.answer:
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": name}}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}
	// Under 2026-07-28 a server asks through InputRequests in its result
	// instead (multi round-trip); requests of its own need an older version.
	cs, _ := proxyTo(t, false, u, client, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := call(t, cs, ctx, "ask", "ask-1", 1)
		first <- res
	}()
	old := recv(t, asks, "the first upstream's elicitation")
	u.kill() // the first upstream dies while the client is answering it
	if res := recv(t, first, "the first call's answer"); res == nil || !res.IsError {
		t.Fatalf("call cut off by the crash: %v, want a tool error", res)
	}

	second := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := call(t, cs, ctx, "ask", "ask-2", 2)
		if err != nil {
			t.Errorf("second call: %v", err)
		}
		second <- res
	}()
	newer := recv(t, asks, "the restarted upstream's elicitation")
	old.answer <- "stale" // the late answer to the dead upstream's request
	newer.answer <- "fresh"
	res := recv(t, second, "the second call's answer")
	if res == nil || res.IsError || textOf(res) != "name fresh" {
		t.Fatalf("second call: %v, want the answer to its own elicitation, name fresh", res)
	}
}

// TestToClientIDs: each request of an upstream gets an id of the proxy's,
// and an upstream's cancellation names the id the client knows.
func TestToClientIDs(t *testing.T) {
	s := &session{}
	req := func(id int64) *jsonrpc.Request {
		return &jsonrpc.Request{ID: mustID(id), Method: "elicitation/create", Params: json.RawMessage(`{}`)}
	}
	cancelOf := func(id int64) *jsonrpc.Request {
		return &jsonrpc.Request{Method: "notifications/cancelled", Params: json.RawMessage(fmt.Sprintf(`{"requestId":%d,"reason":"r"}`, id))}
	}
	if got := s.toClient(req(1), 1).ID.Raw(); got != int64(1) {
		t.Errorf("first upstream's request 1 went out as %v, want 1", got)
	}
	if got := s.toClient(req(1), 2).ID.Raw(); got != int64(2) {
		t.Errorf("second upstream's request 1 went out as %v, want 2", got)
	}
	for _, tc := range []struct {
		gen  int
		want string
	}{{2, `{"reason":"r","requestId":2}`}, {1, `{"reason":"r","requestId":1}`}} {
		if got := string(s.toClient(cancelOf(1), tc.gen).Params); got != tc.want {
			t.Errorf("cancellation of request 1 by upstream %d: %s, want %s", tc.gen, got, tc.want)
		}
	}
	note := &jsonrpc.Request{Method: "notifications/message", Params: json.RawMessage(`{"level":"info","data":1}`)}
	if got := s.toClient(note, 2); got != note {
		t.Errorf("a notification was changed: %+v", got)
	}
}
