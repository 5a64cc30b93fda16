package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// JSON-RPC error codes the proxy answers with.
const (
	codeInvalidRequest = -32600
	codeInvalidParams  = -32602
	codeInternal       = -32603
)

// errUpstreamGone is the fate of a request the upstream took with it when
// it died or its connection broke.
var errUpstreamGone = errors.New("the tool server went away before answering")

// errSessionEnded is the fate of a call still waiting for the upstream
// when its session ends: the client went away, or the proxy stopped.
var errSessionEnded = errors.New("the proxy's session with the tool server ended (its client went away, or the proxy stopped) before the tool server answered")

// session is one client connection and the upstream connection behind it.
type session struct {
	p      *Proxy
	ctx    context.Context
	client mcp.Connection

	// out carries messages to the upstream in the order the client sent
	// them (initialize, then initialized, then the rest); one writer sends
	// them once the upstream is up.
	out chan *outgoing

	// quickEnds counts the upstreams in a row that ended soon after they
	// started (supervise): an upstream that fails at start, whose
	// requests a retry cannot help (goneMessage).
	quickEnds atomic.Int32
	// endCounted is the last upstream connection (gen) whose end
	// quickEnds took into account; guarded by mu.
	endCounted int

	writeMu sync.Mutex // serializes writes to the client

	mu          sync.Mutex
	up          mcp.Connection // nil while the upstream is down
	gen         int            // counts upstream connections
	ready       chan struct{}  // closed while up is usable
	nextID      int64
	pending     map[int64]*pending         // requests sent to the upstream, by the proxy's id
	forwarded   map[jsonrpc.ID]int64       // the proxy's ids of the client's forwarded requests
	calls       map[jsonrpc.ID]*clientCall // the tool calls the layer runs
	tokens      map[string]jsonrpc.ID      // the client's running requests by progressToken (session_related.go)
	tokenOf     map[jsonrpc.ID]string      // and their tokens
	initParams  json.RawMessage            // the client's initialize, replayed to a restarted upstream
	initSent    bool                       // the client's initialize went to an upstream
	initialized bool                       // the client's notifications/initialized went to an upstream
	protocol    string                     // the version initialize agreed on; "" before, and for 2026-07-28
	// The upstream's own requests to the client (sampling, roots,
	// elicitation) go out under ids of the proxy: a restarted upstream
	// numbers its requests from 1 again, and the client's answer to the
	// old upstream's request must not reach the new one as the answer to
	// its own.
	nextDown int64
	downward map[int64]downRequest

	// work counts what the session runs off the reader (the tool calls the
	// layer runs, the task methods): its end waits for them, so that each
	// is settled in the database before the caller may close it.
	work sync.WaitGroup
	act  *activity // the HTTP session's, or nil
}

// Serve proxies client until it closes, ctx ends or the proxy is closed,
// connecting (and, after a failure, reconnecting) to the upstream on its
// own. It returns once the session's tool calls are settled: a call still
// waiting for the upstream then is settled as a lost answer (see
// Options.CallTimeout).
func (p *Proxy) Serve(ctx context.Context, client mcp.Connection) error {
	return p.serve(ctx, client, nil, nil)
}

// serve is Serve, counting the session's activity in act (if set, for
// the idle timeout) and calling started (if set) with the session before
// it reads from the client.
func (p *Proxy) serve(parent context.Context, client mcp.Connection, act *activity, started func(*session)) error {
	// The session's context ends after parent does, not with it: its
	// running calls are answered first (answerEnded), and only then is the
	// rest cancelled, so that no call settling at the same moment answers
	// in between, or is left without an answer.
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	defer cancel()
	s := &session{
		p: p, ctx: ctx, client: client,
		out:       make(chan *outgoing, 256),
		ready:     make(chan struct{}),
		pending:   map[int64]*pending{},
		forwarded: map[jsonrpc.ID]int64{},
		calls:     map[jsonrpc.ID]*clientCall{},
		act:       act,
	}
	end := func(stopping bool) {
		s.answerEnded(stopping)
		cancel()
	}
	if !p.serving.add(s, func() { end(true) }) {
		client.Close()
		return errProxyClosed
	}
	defer p.serving.done(s)
	defer context.AfterFunc(parent, func() { end(!errors.Is(context.Cause(parent), errSessionClosed)) })()
	if started != nil {
		started(s)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.supervise() }()
	go func() { defer wg.Done(); s.writeUpstream() }()
	err := s.readClient()
	cancel()
	client.Close()
	s.mu.Lock()
	if s.up != nil {
		s.up.Close()
	}
	s.mu.Unlock()
	wg.Wait()
	s.work.Wait()
	if errors.Is(err, io.EOF) || ctx.Err() != nil {
		return nil
	}
	return err
}

// errSessionClosed is the cause of an HTTP session's end by its DELETE or
// its idle timeout, rather than by the proxy's stop.
var errSessionClosed = errors.New("the session was closed")

// answerEnded answers each of the client's running tool calls with an
// error when the proxy ends the session, before the session's context
// ends and its connection closes: without it, over HTTP the call's stream
// ended with 200 and no event, and over stdio the client read EOF. The
// call goes on settling (a forward still waiting for the upstream is
// settled as a lost answer, Options.CallTimeout), and call_status tells
// what became of it. stopping says that the proxy is stopping (SIGTERM,
// Close), rather than the session alone ending (its DELETE, its idle
// timeout).
func (s *session) answerEnded(stopping bool) {
	what := "the proxy's session ended"
	if stopping {
		what = "the proxy stopped"
	}
	msg := what + " before this call was answered: the call may or may not have run. " +
		"Ask the " + outbox.StatusToolName + " tool (with this call's idempotency key) what became of it before you retry; " +
		"a retry with the same key gets its outcome if it was recorded."
	s.mu.Lock()
	var open []jsonrpc.ID
	for id, c := range s.calls {
		if !c.withheld.Load() && c.answered.CompareAndSwap(false, true) {
			open = append(open, id)
		}
	}
	s.mu.Unlock()
	for _, id := range open {
		s.replyError(id, codeInternal, msg)
	}
}
