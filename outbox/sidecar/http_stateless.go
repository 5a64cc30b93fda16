package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
)

// 2026-07-28 over the proxy's Streamable HTTP. That revision has no
// sessions and no initialize: every request stands alone and carries its
// protocol version (the Mcp-Protocol-Version header and params._meta).
// go-sdk v1.8.0's StreamableServerTransport serves it only when stateless,
// and a stateful one (the proxy's sessions, made by initialize) answers any
// such request but server/discover with -32022 "protocol version ... is not
// supported by this server". Nor would a transport, and an upstream
// process, per request do: a command upstream would be started for every
// tools/list.
//
// So the proxy answers these requests itself, over one long-lived proxy
// session of their own (statelessSession) whose client end is a
// multiplexer: each HTTP request's message goes in under an id of the
// multiplexer's (the clients' own ids repeat, "1" from every one of them),
// and its answer comes back to that request. The upstream connection
// behind it is not initialized, exactly as for a 2026-07-28 client on
// stdio: the requests pass with their envelope, for an upstream that
// speaks 2026-07-28 itself (an older one answers server/discover -32601,
// and its client falls back to initialize, which opens a stateful
// session). tools/call goes through the layer with the request's token as
// principal; tasks/* never get here (serveTaskMethod).
//
// A request whose client went away before its answer (a dropped response
// stream, which 2026-07-28 counts as a cancel) is not cancelled if it is a
// tool call: the call runs to its end and is recorded, for the client's
// retry (a new request, which the revision demands) to join or replay.
// Any other request is cancelled at the upstream. The upstream can send a
// stateless request nothing but the notifications of a subscription
// (SEP-2575: subscriptions/listen, whose notifications name the listen by
// _meta subscriptionId) and those about a running request (its progress):
// those go to that request's response, as a stream of server-sent
// events. Claude Code 2.1.332 waits 27 s for a listen's
// notifications/subscriptions/acknowledged before it goes on, so dropping
// them costs every connection that much. Other notifications are dropped,
// and the upstream's requests (sampling, elicitation, roots) refused with
// -32601.

// protocolStateless is the first revision without sessions.
const protocolStateless = "2026-07-28"

// statelessRequest reports whether a POST without a session speaks
// 2026-07-28 or later, by its header or by the envelope in its body.
func statelessRequest(r *http.Request, body []byte) bool {
	if v := r.Header.Get("Mcp-Protocol-Version"); v >= protocolStateless {
		return true
	}
	var msg struct {
		Params json.RawMessage `json:"params"`
	}
	return json.Unmarshal(body, &msg) == nil && hasEnvelope(msg.Params)
}

// peekBody reads up to maxTaskBody of r's body and puts it back for
// whoever reads it next; ok is false when it is larger or unreadable.
func peekBody(r *http.Request) (body []byte, ok bool) {
	if r.Body == nil {
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxTaskBody+1))
	// The server closes the original when the request ends.
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	return body, err == nil && len(body) <= maxTaskBody
}

// serveStateless answers a 2026-07-28 POST over the stateless session.
func (h *httpSessions) serveStateless(w http.ResponseWriter, r *http.Request, body []byte) {
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		http.Error(w, "a 2026-07-28 request is one JSON-RPC message: "+err.Error(), http.StatusBadRequest)
		return
	}
	mux := h.stateless()
	if mux == nil {
		http.Error(w, "the proxy is stopping", http.StatusServiceUnavailable)
		return
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		w.WriteHeader(http.StatusAccepted) // an answer to a request the upstream cannot have sent
		return
	}
	extra := &mcp.RequestExtra{TokenInfo: auth.TokenInfoFromContext(r.Context()), Header: r.Header}
	if !req.IsCall() {
		if req.Method != "notifications/cancelled" { // names the client's id, which no one here knows
			mux.deliver(r.Context(), &jsonrpc.Request{Method: req.Method, Params: req.Params, Extra: extra})
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	id, w8 := mux.open()
	defer mux.close(id)
	if !mux.deliver(r.Context(), &jsonrpc.Request{ID: mustID(id), Method: req.Method, Params: req.Params, Extra: extra}) {
		return
	}
	streaming := false
	for {
		select {
		case note := <-w8.notes:
			// Under the client's own id, as withClientSubscription
			// names it towards any other client.
			if !streaming {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("Cache-Control", "no-cache")
				w.WriteHeader(http.StatusOK)
				streaming = true
			}
			if _, ok := subscriptionOf(note); ok {
				note = withSubscriptionID(note, req.ID)
			}
			if writeEvent(w, note) != nil {
				mux.cancel(id, req.Method)
				return
			}
		case resp := <-w8.answer:
			resp.ID = req.ID
			if streaming {
				_ = writeEvent(w, resp)
				return
			}
			b, err := jsonrpc.EncodeMessage(resp)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(b)
			return
		case <-r.Context().Done():
			mux.cancel(id, req.Method)
			return
		}
	}
}

// cancel tells the upstream that the request id's client went away, unless
// it is a tool call, which runs to its end for the client's retry.
func (c *muxClient) cancel(id int64, method string) {
	if method == "tools/call" {
		return
	}
	params, _ := json.Marshal(map[string]any{"requestId": id, "reason": "the client's response stream closed"})
	c.deliver(context.Background(), &jsonrpc.Request{Method: "notifications/cancelled", Params: params})
}

// writeEvent writes m as one server-sent event and flushes it.
func writeEvent(w http.ResponseWriter, m jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(m)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "event: message\ndata: %s\n\n", b); err != nil {
		return err
	}
	return http.NewResponseController(w).Flush()
}

// subscriptionOf returns the request id a notification's
// _meta subscriptionId names, if it is a number.
func subscriptionOf(m *jsonrpc.Request) (int64, bool) {
	if !bytes.Contains(m.Params, []byte(mcp.MetaKeySubscriptionID)) {
		return 0, false
	}
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(m.Params, &p) != nil {
		return 0, false
	}
	var raw any
	if json.Unmarshal(p.Meta[mcp.MetaKeySubscriptionID], &raw) != nil {
		return 0, false
	}
	id, err := jsonrpc.MakeID(raw)
	if err != nil {
		return 0, false
	}
	n, ok := id.Raw().(int64)
	return n, ok
}

// withSubscriptionID renames the subscription of a notification to id.
func withSubscriptionID(m *jsonrpc.Request, id jsonrpc.ID) *jsonrpc.Request {
	var params map[string]json.RawMessage
	if json.Unmarshal(m.Params, &params) != nil {
		return m
	}
	raw, err := json.Marshal(id.Raw())
	if err != nil {
		return m
	}
	out, err := paramskey.SetMeta(params, map[string]json.RawMessage{mcp.MetaKeySubscriptionID: raw})
	if err != nil {
		return m
	}
	return &jsonrpc.Request{Method: m.Method, Params: out}
}

// stateless returns the stateless session's multiplexer, starting the
// session on first use; nil once the proxy's context has ended.
func (h *httpSessions) stateless() *muxClient {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx.Err() != nil {
		return nil
	}
	if h.mux == nil {
		h.mux = &muxClient{ctx: h.ctx, logger: h.p.logger, in: make(chan jsonrpc.Message, 64), waiting: map[int64]*muxWaiter{}}
		go func() {
			if err := h.p.Serve(h.ctx, h.mux); err != nil {
				h.p.logger.Warn("stateless session ended", "error", err)
			}
		}()
	}
	return h.mux
}

// muxClient is the client end of the stateless session: the HTTP requests'
// messages, each request's answer back to it.
type muxClient struct {
	ctx    context.Context
	logger *slog.Logger
	in     chan jsonrpc.Message

	mu      sync.Mutex
	next    int64
	waiting map[int64]*muxWaiter
}

// muxWaiter is what an HTTP request waits for: its answer, and the
// notifications of the subscription it opened, if it is a listen.
type muxWaiter struct {
	answer  chan *jsonrpc.Response
	notes   chan *jsonrpc.Request
	dropped atomic.Int64 // notes that found notes full
}

// open makes an id for a request, and the channels it is answered on.
func (c *muxClient) open() (int64, *muxWaiter) {
	w := &muxWaiter{answer: make(chan *jsonrpc.Response, 1), notes: make(chan *jsonrpc.Request, 64)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	c.waiting[c.next] = w
	return c.next, w
}

// close forgets a request: an answer that comes later is dropped. A listen
// whose client fell behind is logged here, once with the count, not once a
// note: a client that stopped reading would otherwise flood the log at the
// upstream's rate.
func (c *muxClient) close(id int64) {
	c.mu.Lock()
	w := c.waiting[id]
	delete(c.waiting, id)
	c.mu.Unlock()
	if n := w.droppedNotes(); n > 0 {
		c.logger.Warn(droppedNotesMsg,
			"request_id", id, "dropped", n, "buffered", cap(w.notes))
	}
}

const droppedNotesMsg = "a stateless request's client fell behind its notifications; dropped those past the buffer, never blocking the upstream"

func (w *muxWaiter) droppedNotes() int64 {
	if w == nil {
		return 0
	}
	return w.dropped.Load()
}

// deliver hands m to the session, and reports whether it took it before
// ctx or the session ended.
func (c *muxClient) deliver(ctx context.Context, m jsonrpc.Message) bool {
	select {
	case c.in <- m:
		return true
	case <-ctx.Done():
	case <-c.ctx.Done():
	}
	return false
}

func (c *muxClient) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-c.in:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, c.ctx.Err()
	}
}

func (c *muxClient) Write(ctx context.Context, m jsonrpc.Message) error {
	switch m := m.(type) {
	case *jsonrpc.Response:
		n, ok := m.ID.Raw().(int64)
		c.mu.Lock()
		w := c.waiting[n]
		delete(c.waiting, n)
		c.mu.Unlock()
		if ok && w != nil {
			w.answer <- m
		}
	case *jsonrpc.Request:
		n, ok := subscriptionOf(m)
		if rc, related := ctx.(relatedContext); !ok && related {
			// About a running request: its progress (session_related.go).
			n, ok = rc.id.Raw().(int64)
		}
		if ok && !m.IsCall() {
			c.mu.Lock()
			w := c.waiting[n]
			c.mu.Unlock()
			if w != nil {
				select {
				case w.notes <- m:
				default: // a client that reads none of 64: dropped, never blocking the session; close logs it
					w.dropped.Add(1)
				}
			}
			return nil
		}
		if m.IsCall() {
			resp := &jsonrpc.Response{ID: m.ID, Error: &jsonrpc.Error{Code: -32601,
				Message: "no client to ask: a 2026-07-28 request through mcp-outbox proxy's HTTP has no channel back but its answer"}}
			c.deliver(ctx, resp)
		}
	}
	return nil
}

func (c *muxClient) Close() error      { return nil }
func (c *muxClient) SessionID() string { return "" }
