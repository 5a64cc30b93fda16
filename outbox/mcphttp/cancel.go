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
		var tracker *cancelnote.Tracker
		var calls []jsonrpc.ID
		var edits []splice
		trimmed := bytes.TrimSpace(body)
		for _, sp := range messageSpans(trimmed) {
			m := trimmed[sp.start:sp.end]
			f, ok := fields(m, "method", "id", "params", "jsonrpc")
			if !ok || !f[0].ok() || !f[3].ok() || !stringIs(f[3].of(m), "2.0") {
				continue // the SDK answers it
			}
			switch method := f[0].of(m); {
			case stringIs(method, "tools/call"):
				id, ok := callID(m, f[1])
				if !ok || !json.Valid(m) {
					continue
				}
				tracker = c.session(session)
				handle := tracker.ReadCall(id)
				calls = append(calls, id)
				if !f[2].ok() {
					continue // no params to tag: the SDK refuses the call
				}
				p := f[2].of(m)
				if ps, ok := fields(p, "_meta"); ok {
					hb, _ := json.Marshal(handle)
					edits = append(edits, metaEdits(p, sp.start+f[2].start, ps[0], []member{{cancelnote.MetaKey, hb}})...)
				}
			case stringIs(method, "notifications/cancelled"):
				msg, err := jsonrpc.DecodeMessage(m)
				if err != nil {
					continue
				}
				c.mu.Lock()
				t := c.sessions[session]
				c.mu.Unlock()
				if t != nil {
					t.Read(msg)
				}
			}
		}
		if len(edits) > 0 {
			body = apply(trimmed, edits)
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

// session returns the session's tracker, made when it has none.
func (c *cancels) session(session string) *cancelnote.Tracker {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.sessions[session]
	if t == nil {
		t = cancelnote.NewSessionTracker(func(t *cancelnote.Tracker) { c.emptied(session, t) })
		c.sessions[session] = t
	}
	return t
}

// callID is the id of a call at span v of message m; false when absent or
// null (a notification), or not an id.
func callID(m []byte, v span) (jsonrpc.ID, bool) {
	if !v.ok() || isNullValue(v.of(m)) {
		return jsonrpc.ID{}, false
	}
	var raw any
	if json.Unmarshal(v.of(m), &raw) != nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(raw)
	return id, err == nil && id.IsValid()
}

// emptied drops the session's tracker once it has nothing in flight.
func (c *cancels) emptied(session string, t *cancelnote.Tracker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessions[session] == t && t.Len() == 0 {
		delete(c.sessions, session)
	}
}

// messageSpans returns the spans of the messages of a trimmed body, a
// single one or a batch's; none when the batch cannot be scanned.
func messageSpans(b []byte) []span {
	if len(b) == 0 {
		return nil
	}
	if b[0] != '[' {
		return []span{{0, len(b)}}
	}
	var spans []span
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == ']' {
		return nil
	}
	for {
		start, end := skipValue(b, i)
		if end < 0 {
			return nil
		}
		spans = append(spans, span{start, end})
		i = skipSpace(b, end)
		if i >= len(b) || (b[i] != ',' && b[i] != ']') {
			return nil
		}
		if b[i] == ']' {
			return spans
		}
		i++
	}
}
