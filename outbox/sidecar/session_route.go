package sidecar

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// downRequest is an upstream's request to the client, by the id the client
// knows it under.
type downRequest struct {
	gen int
	id  jsonrpc.ID // the upstream's own
}

// pending is a request the upstream has not answered yet.
type pending struct {
	id  int64
	gen int
	// Either reply, for a waiter in the proxy (closed without a value when
	// the upstream goes away), or clientID, for a client's request whose
	// answer is passed back (through rewrite, when set).
	reply    chan *jsonrpc.Response
	clientID jsonrpc.ID
	rewrite  func(json.RawMessage) (json.RawMessage, error)
}

// forward sends a client's request to the upstream under a proxy id; its
// answer goes back to the client through rewrite.
func (s *session) forward(m *jsonrpc.Request, rewrite func(json.RawMessage) (json.RawMessage, error)) {
	p := &pending{clientID: m.ID, rewrite: rewrite}
	s.mu.Lock()
	s.nextID++
	p.id = s.nextID
	s.forwarded[m.ID] = p.id
	s.mu.Unlock()
	up := &jsonrpc.Request{ID: mustID(p.id), Method: m.Method, Params: m.Params}
	s.queue(newOutgoing(up, p))
}

func mustID(n int64) jsonrpc.ID {
	id, err := jsonrpc.MakeID(float64(n)) // MakeID takes JSON's number type
	if err != nil {
		panic(err)
	}
	return id
}

func (s *session) newWaiter(gen int) *pending {
	p := &pending{reply: make(chan *jsonrpc.Response, 1), gen: gen}
	s.mu.Lock()
	s.nextID++
	p.id = s.nextID
	if gen != 0 {
		s.pending[p.id] = p
	}
	s.mu.Unlock()
	return p
}

func (s *session) dropPending(p *pending) {
	s.mu.Lock()
	delete(s.pending, p.id)
	s.mu.Unlock()
}

// toClient gives an upstream's request to the client an id of the proxy,
// and translates the upstream's cancellation of one of its requests.
func (s *session) toClient(m *jsonrpc.Request, gen int) *jsonrpc.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.IsCall() {
		s.nextDown++
		if s.downward == nil {
			s.downward = map[int64]downRequest{}
		}
		s.downward[s.nextDown] = downRequest{gen: gen, id: m.ID}
		return &jsonrpc.Request{ID: mustID(s.nextDown), Method: m.Method, Params: m.Params}
	}
	if m.Method != "notifications/cancelled" {
		return s.withClientSubscription(m, gen)
	}
	var c map[string]any
	if err := json.Unmarshal(m.Params, &c); err != nil {
		return m
	}
	upID, err := jsonrpc.MakeID(c["requestId"])
	if err != nil {
		return m
	}
	for id, d := range s.downward {
		if d.gen == gen && d.id == upID {
			c["requestId"] = id
			if params, err := json.Marshal(c); err == nil {
				return &jsonrpc.Request{Method: m.Method, Params: params}
			}
		}
	}
	return m
}

// withClientSubscription names, in a notification of a subscription
// (SEP-2575, 2026-07-28), the client's subscriptions/listen request by the
// client's id. The upstream names it by the id it received, the proxy's:
// Claude Code 2.1.332, not finding its own id in the
// notifications/subscriptions/acknowledged, waited 27 s for the listen to
// be acknowledged before it went on. The caller holds s.mu.
func (s *session) withClientSubscription(m *jsonrpc.Request, gen int) *jsonrpc.Request {
	n, ok := subscriptionOf(m) // http_stateless.go
	if !ok {
		return m
	}
	p := s.pending[n]
	if p == nil || p.reply != nil || (p.gen != 0 && p.gen != gen) {
		return m
	}
	return withSubscriptionID(m, p.clientID)
}

// onClientAnswer sends the client's answer to the upstream that asked,
// under that upstream's id; an answer for an upstream that is gone, or to
// no request, is dropped.
func (s *session) onClientAnswer(m *jsonrpc.Response) {
	n, ok := m.ID.Raw().(int64)
	s.mu.Lock()
	d, found := s.downward[n]
	if found {
		delete(s.downward, n)
	}
	s.mu.Unlock()
	if !ok || !found {
		s.p.logger.Debug("answer from the client to no pending request of the upstream (it may have restarted since)", "id", m.ID.Raw())
		return
	}
	o := newOutgoing(&jsonrpc.Response{ID: d.id, Result: m.Result, Error: m.Error}, nil)
	o.gen = d.gen
	s.queue(o)
}

func (s *session) onUpstreamResponse(m *jsonrpc.Response) {
	n, ok := m.ID.Raw().(int64)
	s.mu.Lock()
	p := s.pending[n]
	if ok && p != nil {
		delete(s.pending, n)
		if p.reply == nil {
			delete(s.forwarded, p.clientID)
		}
	}
	s.mu.Unlock()
	if !ok || p == nil {
		s.p.logger.Warn("answer from upstream to no pending request", "id", m.ID.Raw())
		return
	}
	if p.reply != nil {
		p.reply <- m
		return
	}
	resp := &jsonrpc.Response{ID: p.clientID, Result: m.Result, Error: m.Error}
	if m.Error == nil && p.rewrite != nil {
		r, err := p.rewrite(m.Result)
		if err != nil {
			s.p.logger.Warn("pass upstream answer unchanged", "error", err)
		} else {
			resp.Result = r
		}
	}
	s.writeClient(resp)
}
