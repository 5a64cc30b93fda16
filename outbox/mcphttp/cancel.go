package mcphttp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
)

// cancels tells the layer why a client cancelled a call in a stateful
// session (see cancelnote): the TypeScript SDK sends notifications/cancelled
// in a POST of its own when a request times out, and the go-sdk ends the
// call's context without the reason. A stateless request (2026-07-28) has
// no session a cancel could name: its client aborts the POST instead, and
// the go-sdk does not end the call for that.
//
// A session has a tracker while it has a tools/call in flight. A call stays
// tracked until the layer is done with it, not until its POST ends: the
// go-sdk client aborts the POST of a call whose context ended before it
// sends the cancel, and the call runs on in the session.
//
// Unlike stdio, the response to a cancelled call is still written, on the
// POST the call came in (when it is still open): the go-sdk writes it as
// bytes of that stream, not as a message this front could hold back.
type cancels struct {
	mu       sync.Mutex
	sessions map[string]*cancelnote.Tracker
}

func newCancels() *cancels { return &cancels{sessions: map[string]*cancelnote.Tracker{}} }

// wrap passes every request on to next, noting on the way the tools/call
// requests and cancels in a session's POST bodies.
func (c *cancels) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		session := r.Header.Get("Mcp-Session-Id")
		if r.Method != http.MethodPost || r.Body == nil || session == "" {
			next.ServeHTTP(w, r)
			return
		}
		// LiftParamsKey, in front, has read the body into memory already,
		// bounded by the SDK's limit: take its bytes rather than a copy.
		var body []byte
		if b, ok := r.Body.(*bodyBytes); ok {
			body = b.b
		} else {
			var err error
			body, err = io.ReadAll(r.Body)
			r.Body.Close()
			if err != nil {
				http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		msgs, batch := splitBody(body)
		var tracker *cancelnote.Tracker
		var calls []jsonrpc.ID
		changed := false
		for i, raw := range msgs {
			msg, err := jsonrpc.DecodeMessage(raw)
			if err != nil {
				continue // the SDK answers it
			}
			req, ok := msg.(*jsonrpc.Request)
			if !ok {
				continue
			}
			switch {
			case req.Method == "tools/call" && req.IsCall():
				before := req.Params
				tracker = c.call(session, req)
				calls = append(calls, req.ID)
				if !bytes.Equal(before, req.Params) {
					if out, err := jsonrpc.EncodeMessage(req); err == nil {
						msgs[i], changed = out, true
					}
				}
			case req.Method == "notifications/cancelled":
				c.mu.Lock()
				t := c.sessions[session]
				c.mu.Unlock()
				if t != nil {
					t.Read(req)
				}
			}
		}
		if changed {
			body = joinBody(msgs, batch)
		}
		r.Body = &bodyBytes{Reader: bytes.NewReader(body), b: body}
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
		if tracker != nil {
			// Calls the layer never took (not a tool of the layer, or
			// refused by the SDK) end with their POST.
			tracker.Drop(calls...)
		}
	})
}

// call tracks req in the session's tracker, made when the session has none.
// The tracker is taken and fed under c.mu, so it cannot be found empty and
// dropped between the two.
func (c *cancels) call(session string, req *jsonrpc.Request) *cancelnote.Tracker {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.sessions[session]
	if t == nil {
		t = cancelnote.NewSessionTracker(func(t *cancelnote.Tracker) { c.emptied(session, t) })
		c.sessions[session] = t
	}
	t.Read(req)
	return t
}

// emptied drops the session's tracker once it has nothing in flight.
func (c *cancels) emptied(session string, t *cancelnote.Tracker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessions[session] == t && t.Len() == 0 {
		delete(c.sessions, session)
	}
}

// splitBody returns the messages of a POST body, a single one or a batch's.
func splitBody(body []byte) (msgs []json.RawMessage, batch bool) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if json.Unmarshal(trimmed, &msgs) != nil {
			return nil, true
		}
		return msgs, true
	}
	return []json.RawMessage{trimmed}, false
}

func joinBody(msgs []json.RawMessage, batch bool) []byte {
	if !batch {
		return msgs[0]
	}
	out, err := json.Marshal(msgs)
	if err != nil {
		return nil
	}
	return out
}
