package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// outgoing is a message queued for the upstream.
type outgoing struct {
	msg jsonrpc.Message
	p   *pending // for requests expecting an answer
	gen int      // if not 0, the only upstream connection it may go to

	mu        sync.Mutex
	sent      chan struct{} // closed once the message was written, or will never be
	err       error         // why it was not written
	abandoned bool          // the sender gave up before it was written
}

func newOutgoing(msg jsonrpc.Message, p *pending) *outgoing {
	return &outgoing{msg: msg, p: p, sent: make(chan struct{})}
}

// settle records that o was written (err nil) or never will be.
func (o *outgoing) settle(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.sent:
		return
	default:
	}
	o.err = err
	close(o.sent)
}

// abandon withdraws o if it was not written yet, and reports whether it was.
func (o *outgoing) abandon() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.sent:
		return o.err != nil
	default:
	}
	o.abandoned = true
	o.err = errors.New("abandoned")
	close(o.sent)
	return true
}

// queue hands o to the upstream writer.
func (s *session) queue(o *outgoing) {
	select {
	case s.out <- o:
	case <-s.ctx.Done():
		o.settle(s.ctx.Err())
	}
}

// writeUpstream writes queued messages in order, each once the upstream is
// up. A request is registered as pending under the connection it is
// written to, so that the connection's end fails exactly the requests it
// took with it.
func (s *session) writeUpstream() {
	for {
		var o *outgoing
		select {
		case o = <-s.out:
		case <-s.ctx.Done():
			return
		}
		for {
			up, gen, err := s.waitUp()
			if err != nil {
				o.settle(err)
				return
			}
			o.mu.Lock()
			if o.abandoned {
				o.mu.Unlock()
				break
			}
			if o.gen != 0 && o.gen != gen {
				// An answer to a request of an upstream that is gone.
				o.mu.Unlock()
				s.p.logger.Debug("drop the client's answer to a request of a previous upstream", "id", o.msg.(*jsonrpc.Response).ID.Raw())
				o.settle(errUpstreamGone)
				break
			}
			if o.p != nil {
				s.mu.Lock()
				o.p.gen = gen
				s.pending[o.p.id] = o.p
				s.mu.Unlock()
			}
			err = up.Write(s.ctx, o.msg)
			o.mu.Unlock()
			if err != nil {
				s.writeFailed(o, err)
			} else {
				s.noteHandshake(o.msg)
			}
			o.settle(nil)
			break
		}
	}
}

// writeFailed settles a message the upstream connection refused. The
// request may still have reached the upstream (an HTTP request can fail
// after the server read it), so it counts as sent and its answer as lost.
// A connection that is really gone ends its reader too, and the
// supervisor starts over.
func (s *session) writeFailed(o *outgoing, err error) {
	s.p.logger.Warn("write to upstream", "error", err)
	if o.p == nil {
		return
	}
	s.mu.Lock()
	_, stillPending := s.pending[o.p.id]
	delete(s.pending, o.p.id)
	if o.p.reply == nil {
		delete(s.forwarded, o.p.clientID)
	}
	s.mu.Unlock()
	if !stillPending {
		return // answered or failed already
	}
	if o.p.reply != nil {
		close(o.p.reply)
		return
	}
	msg := fmt.Sprintf("the tool server did not take the request: %v", err)
	s.mu.Lock()
	n := s.quickEnds.Load()
	if s.endCounted < o.p.gen {
		// This one is going the way of the last, and its end is not
		// counted yet (the supervisor may count it first: once only).
		n++
	}
	s.mu.Unlock()
	if n >= 2 {
		msg += "; " + failingAtStart(n)
	}
	s.replyError(o.p.clientID, codeInternal, msg)
}

// waitUp returns the upstream connection once it is usable.
func (s *session) waitUp() (mcp.Connection, int, error) {
	for {
		s.mu.Lock()
		up, gen, ready := s.up, s.gen, s.ready
		s.mu.Unlock()
		select {
		case <-ready:
			if up != nil {
				return up, gen, nil
			}
		case <-s.ctx.Done():
			return nil, 0, s.ctx.Err()
		}
	}
}

// supervise connects to the upstream, re-initializes it when the client
// already initialized, reads from it until the connection ends, and starts
// over after a backoff.
func (s *session) supervise() {
	backoff := s.p.opts.MinBackoff
	for s.ctx.Err() == nil {
		started := time.Now()
		conn, err := s.p.opts.Upstream.Dial(s.ctx)
		if err != nil {
			s.p.logger.Error("start upstream", "upstream", s.p.opts.Upstream.String(), "error", err, "retry_in", backoff)
		} else {
			s.mu.Lock()
			s.gen++
			gen := s.gen
			s.up = conn
			s.mu.Unlock()
			done := make(chan struct{})
			go func() { defer close(done); s.readUpstream(conn, gen) }()
			if err := s.reinitialize(conn, gen); err != nil {
				s.p.logger.Error("initialize restarted upstream", "error", err)
				conn.Close()
			} else {
				s.mu.Lock()
				if s.gen == gen && s.up == conn {
					close(s.ready)
				}
				s.mu.Unlock()
			}
			<-done
			s.mu.Lock()
			if time.Since(started) < quickEnd {
				s.quickEnds.Add(1)
			} else {
				s.quickEnds.Store(0)
			}
			s.endCounted = gen
			s.mu.Unlock()
			s.markDown(gen)
			if s.ctx.Err() != nil {
				return
			}
			if time.Since(started) > time.Minute {
				backoff = s.p.opts.MinBackoff
			}
			s.p.logger.Warn("upstream ended; restarting", "upstream", s.p.opts.Upstream.String(), "retry_in", backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, s.p.opts.MaxBackoff)
	}
}

// noteHandshake remembers the client's initialize and initialized once
// written to an upstream: from then on a new upstream gets them replayed.
// (Only the client's go through the queue; the replays are written
// directly.)
func (s *session) noteHandshake(m jsonrpc.Message) {
	req, ok := m.(*jsonrpc.Request)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch req.Method {
	case "initialize":
		s.initSent = true
	case "notifications/initialized":
		s.initialized = true
	}
}

// reinitialize replays the client's initialize to a new upstream, so that
// the client's session goes on over it. Before the client's initialize
// went to an upstream there is nothing to replay: its own goes through,
// even when it arrived while this upstream was starting (a replay then
// would make two), and likewise for its initialized.
func (s *session) reinitialize(conn mcp.Connection, gen int) error {
	s.mu.Lock()
	params, sent, initialized := s.initParams, s.initSent, s.initialized
	s.mu.Unlock()
	if !sent {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.p.opts.InitTimeout)
	defer cancel()
	p := s.newWaiter(gen)
	defer s.dropPending(p)
	if err := conn.Write(ctx, &jsonrpc.Request{ID: mustID(p.id), Method: "initialize", Params: params}); err != nil {
		return err
	}
	select {
	case resp, ok := <-p.reply:
		if !ok {
			return errUpstreamGone
		}
		if resp.Error != nil {
			return resp.Error
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if initialized {
		return conn.Write(ctx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)})
	}
	return nil
}

// quickEnd is how soon after its start an upstream that ends counts as
// failing at start (session.quickEnds).
const quickEnd = 10 * time.Second

// goneMessage is the error a client gets for a request its upstream took
// with it. An upstream that keeps ending as soon as it starts (a stranger's
// server raised at import) is not helped by a retry; the client is told
// so, and where the cause is. The upstream's stderr itself stays in the
// proxy's log: over HTTP the client may be anyone.
func (s *session) goneMessage() string {
	if n := s.quickEnds.Load(); n >= 2 {
		return fmt.Sprintf("%v: %s", errUpstreamGone, failingAtStart(n))
	}
	return errUpstreamGone.Error() + "; the proxy restarts it, retry the request"
}

func failingAtStart(n int32) string {
	return fmt.Sprintf("it has ended %d times in a row within %v of starting, so it is probably failing at start "+
		"(its stderr is in the proxy's log); the proxy keeps restarting it, and a retry runs once it stays up", n, quickEnd)
}

// markDown retires upstream connection gen: the requests it took fail.
func (s *session) markDown(gen int) {
	s.mu.Lock()
	if s.gen != gen || s.up == nil {
		s.mu.Unlock()
		return
	}
	s.up.Close()
	s.up = nil
	select {
	case <-s.ready:
		s.ready = make(chan struct{})
	default:
	}
	for id, d := range s.downward {
		if d.gen == gen {
			delete(s.downward, id)
		}
	}
	var lost []*pending
	for id, p := range s.pending {
		if p.gen == gen {
			lost = append(lost, p)
			delete(s.pending, id)
			if p.reply == nil {
				delete(s.forwarded, p.clientID)
			}
		}
	}
	s.mu.Unlock()
	for _, p := range lost {
		if p.reply != nil {
			close(p.reply)
		} else {
			s.replyError(p.clientID, codeInternal, s.goneMessage())
		}
	}
}

// readUpstream passes the upstream's messages on until its connection ends.
func (s *session) readUpstream(conn mcp.Connection, gen int) {
	for {
		msg, err := conn.Read(s.ctx)
		if err != nil {
			if s.ctx.Err() == nil {
				s.p.logger.Warn("upstream connection ended", "error", err)
			}
			return
		}
		switch m := msg.(type) {
		case *jsonrpc.Response:
			s.onUpstreamResponse(m)
		case *jsonrpc.Request:
			// Notifications (progress, logging, list changes) pass through
			// as they are; the upstream's requests to the client, and its
			// cancellations of them, under the proxy's ids.
			s.writeClient(s.toClient(m, gen))
		}
	}
}
