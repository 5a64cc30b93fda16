package sidecar

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// Tasks (Options.Tasks) are forwarded over an upstream session of the
// proxy's own, not a client's: a task runs on after its request was
// answered, after its client went away, and, taken over by the task runner
// after its proxy died, with no client at all. The session initializes the
// upstream itself (at 2025-11-25, which an older upstream answers with its
// own version) and is restarted with backoff like any other. The upstream
// cannot ask this session's client anything: its requests (sampling,
// elicitation, roots) are refused with -32601.

// taskInitParams is the task session's initialize.
var taskInitParams = json.RawMessage(`{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"mcp-outbox-proxy-tasks","version":"1"}}`)

// taskSession returns the proxy's own upstream session, started on first
// use; nil once the proxy is closed.
func (p *Proxy) taskSession() *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if p.tasks != nil {
		return p.tasks
	}
	ctx, cancel := context.WithCancel(context.Background())
	client := &noClient{ctx: ctx, in: make(chan jsonrpc.Message, 16)}
	s := &session{
		p: p, ctx: ctx, client: client,
		out:        make(chan *outgoing, 256),
		ready:      make(chan struct{}),
		pending:    map[int64]*pending{},
		forwarded:  map[jsonrpc.ID]int64{},
		calls:      map[jsonrpc.ID]*clientCall{},
		initParams: taskInitParams, initSent: true, initialized: true,
	}
	p.tasks, p.stopTasks = s, cancel
	p.taskWG.Add(3)
	go func() { defer p.taskWG.Done(); s.supervise() }()
	go func() { defer p.taskWG.Done(); s.writeUpstream() }()
	go func() { defer p.taskWG.Done(); _ = s.readClient() }()
	return s
}

// forwardStored forwards a task's stored tools/call params (remote.Options.Stored).
// ctx is the task's: tasks/cancel or the layer stopping ends it, and a
// forwarded call then gets a cancel passed on to the upstream.
func (p *Proxy) forwardStored(ctx context.Context, params json.RawMessage, claim *remote.Claim) (*mcp.CallToolResult, error) {
	s := p.taskSession()
	if s == nil {
		return nil, fmt.Errorf("%w: the proxy is closed", remote.ErrNotForwarded)
	}
	var head struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(params, &head)
	params, err := handshakeEra(params)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", remote.ErrNotForwarded, err)
	}
	return s.forwardTraced(ctx, ctx, params, claim, head.Name)
}

// envelopeKeys are the 2026-07-28 request envelope's _meta entries. The
// task session is initialized (the handshake era), and an upstream that
// knows both eras refuses them on such a connection: Python mcp 2.3.0
// answers -32600 "this connection serves the handshake protocol era;
// requests carrying the 2026-07-28 envelope are not accepted on it".
var envelopeKeys = []string{mcp.MetaKeyProtocolVersion, mcp.MetaKeyClientInfo, mcp.MetaKeyClientCapabilities}

// handshakeEra drops the envelope from stored params' _meta.
func handshakeEra(params json.RawMessage) (json.RawMessage, error) {
	p, err := jsonObject(params)
	if err != nil {
		return nil, err
	}
	raw, ok := p["_meta"]
	if !ok {
		return params, nil
	}
	meta, err := jsonObject(raw)
	if err != nil {
		return params, nil // not an object: the upstream says what is wrong
	}
	changed := false
	for _, k := range envelopeKeys {
		if _, ok := meta[k]; ok {
			delete(meta, k)
			changed = true
		}
	}
	if !changed {
		return params, nil
	}
	if p["_meta"], err = json.Marshal(meta); err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

// Close ends the client sessions of Serve and HTTPHandler, and returns
// once their calls are settled in the database (a call still waiting for
// the upstream as a lost answer); then it stops the proxy's own upstream
// session (and, for a command, its process), which forwards tasks. Close
// it after the layer's Runner has stopped (a task still running then loses
// its upstream), and before the database closes.
func (p *Proxy) Close() error {
	p.serving.end()
	p.mu.Lock()
	p.closed = true
	s, stop := p.tasks, p.stopTasks
	p.mu.Unlock()
	if s == nil {
		return nil
	}
	stop()
	s.mu.Lock()
	if s.up != nil {
		s.up.Close()
	}
	s.mu.Unlock()
	p.taskWG.Wait()
	return nil
}

// noClient is the task session's client end: nothing comes from it but its
// refusals of the upstream's requests.
type noClient struct {
	ctx context.Context
	in  chan jsonrpc.Message
}

func (c *noClient) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-c.in:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, c.ctx.Err()
	}
}

func (c *noClient) Write(ctx context.Context, m jsonrpc.Message) error {
	if req, ok := m.(*jsonrpc.Request); ok && req.IsCall() {
		resp := &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: -32601,
			Message: "no client: the call runs as a task of mcp-outbox proxy, which cannot ask a client anything"}}
		select {
		case c.in <- resp:
		case <-ctx.Done():
		case <-c.ctx.Done():
		}
	}
	return nil
}

func (c *noClient) Close() error      { return nil }
func (c *noClient) SessionID() string { return "" }
