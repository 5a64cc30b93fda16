// Package cancelnote carries a client's notifications/cancelled, with its
// reason, from the transport that reads it to the outbox layer, which
// decides what the cancel means for the call.
//
// The go-sdk acts on a cancel before any middleware could see it: its
// jsonrpc2 layer cancels the request's context and drops the reason
// (go-sdk v1.8.0, mcp/transport.go, canceller.Preempt). But the reason
// is what tells a client that gave up waiting ("Request timed out") from
// a user who meant to stop the call. So a transport of this module keeps a
// [Tracker] per connection: it tags each tools/call it reads with a handle
// in _meta ([MetaKey]), and records a cancel of that request, with its
// reason, before the SDK sees the notification. The layer takes the handle
// out of _meta ([Take]) and reads the [Note] when the context ends. The
// tracker also tells the transport not to answer a cancelled request,
// which the spec says a receiver should not.
package cancelnote

import (
	"crypto/rand"
	"encoding/json"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MetaKey is the _meta member that carries a request's handle from the
// transport to the layer. A client cannot forge one: the tracker sets it
// on every tools/call, over whatever the client sent, and a handle is a
// random 128-bit value that [Take] only finds while its request is in
// flight.
const MetaKey = "io.github.mcp-outbox/request"

// A Note is what the transport learned of a request's cancellation.
type Note struct {
	mu        sync.Mutex
	cancelled bool
	reason    string
	taken     bool   // the layer has it (Take)
	done      func() // for a session tracker: forgets the request (Done)
}

// Done tells the transport that the layer is done with the request: a
// cancel can no longer change anything. A nil note is fine.
func (n *Note) Done() {
	if n == nil {
		return
	}
	n.mu.Lock()
	f := n.done
	n.done = nil
	n.mu.Unlock()
	if f != nil {
		f()
	}
}

// Cancelled reports whether the client cancelled the request, and the
// reason it gave ("" when it gave none). A nil note knows of no cancel.
func (n *Note) Cancelled() (reason string, ok bool) {
	if n == nil {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reason, n.cancelled
}

func (n *Note) cancel(reason string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancelled {
		return false
	}
	n.cancelled, n.reason = true, reason
	return true
}

// notes holds the notes of every tracked request in flight, by handle.
var notes sync.Map // string -> *Note

// Take removes the handle from meta and returns its request's note, or nil
// when the request came through no tracker (or a forged handle). A handle
// is taken once: the layer holds the note from then on, and calls Done.
func Take(meta mcp.Meta) *Note {
	h, ok := meta[MetaKey]
	if !ok {
		return nil
	}
	delete(meta, MetaKey)
	s, _ := h.(string)
	n, _ := notes.LoadAndDelete(s)
	note, _ := n.(*Note)
	if note != nil {
		note.mu.Lock()
		note.taken = true
		note.mu.Unlock()
	}
	return note
}

// TimedOut reports whether a cancel's reason says the client stopped
// waiting rather than that someone meant to stop the call. What clients
// send when their request times out:
//
//   - the TypeScript SDK 1.x: "McpError: MCP error -32001: Request timed out"
//   - the TypeScript SDK 2.x, in Claude Code 2.1.332: "SdkError: Request timed out"
//   - the Python SDK 2.3.0: "Request timed out" (1.x sends no cancel)
//   - the go-sdk client, whose reason is its context's error: "context
//     deadline exceeded" (a cancelled context says "context canceled")
//
// A user's interrupt says something else (Claude Code's Esc, an SDK's
// AbortSignal: "AbortError: This operation was aborted").
func TimedOut(reason string) bool {
	r := strings.ToLower(reason)
	return strings.Contains(r, "timed out") || strings.Contains(r, "timeout") || strings.Contains(r, "deadline exceeded")
}

// A Tracker follows the requests of one connection between the transport's
// reads and writes. Its methods are safe for concurrent use.
type Tracker struct {
	mu       sync.Mutex
	inflight map[jsonrpc.ID]*request
	// empty, for a session tracker, runs when its last request is
	// forgotten; nil for a connection's.
	empty func(*Tracker)
}

type request struct {
	handle string // "" for a request that is not a tools/call
	note   *Note
}

// NewTracker returns a tracker for one connection whose transport writes
// the responses as messages: a request ends at its response ([Tracker.Answer]).
func NewTracker() *Tracker { return &Tracker{inflight: map[jsonrpc.ID]*request{}} }

// NewSessionTracker returns a tracker for a transport that does not see
// the responses as messages (Streamable HTTP writes them as bytes of a
// stream, and may write them after the request's POST is gone). Only its
// tools/call requests are kept, each until the layer is done with it
// ([Note.Done]); one the layer never took ends at [Tracker.Drop]. empty
// runs, with the tracker, whenever its last request ends.
func NewSessionTracker(empty func(*Tracker)) *Tracker {
	return &Tracker{inflight: map[jsonrpc.ID]*request{}, empty: empty}
}

// Len is the number of requests in flight.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.inflight)
}

// Drop ends the requests ids that the layer has not taken: their POST has
// ended, and nobody will call Done for them.
func (t *Tracker) Drop(ids ...jsonrpc.ID) {
	for _, id := range ids {
		t.mu.Lock()
		r := t.inflight[id]
		t.mu.Unlock()
		if r == nil {
			continue
		}
		r.note.mu.Lock()
		taken := r.note.taken
		r.note.mu.Unlock()
		if !taken {
			t.forget(id, r)
		}
	}
}

// forget ends the request id, if r is still its entry.
func (t *Tracker) forget(id jsonrpc.ID, r *request) {
	t.mu.Lock()
	ended := t.inflight[id] == r
	if ended {
		delete(t.inflight, id)
	}
	empty := ended && len(t.inflight) == 0 && t.empty != nil
	t.mu.Unlock()
	if !ended {
		return
	}
	release(r)
	if empty {
		t.empty(t)
	}
}

// track puts r in flight under id.
func (t *Tracker) track(id jsonrpc.ID, r *request) {
	if t.empty != nil {
		r.note.done = func() { t.forget(id, r) }
	}
	t.mu.Lock()
	_, dup := t.inflight[id]
	if !dup {
		t.inflight[id] = r
	}
	t.mu.Unlock()
	if dup {
		// A client reusing an id in flight breaks JSON-RPC, and the
		// SDK refuses the second request: the first keeps its entry.
		release(r)
	}
}

// ReadCall is Read of a tools/call with this id whose params the caller
// tags itself: it returns the handle to set at params._meta[MetaKey].
// The HTTP front (mcphttp) splices it into the body's bytes rather than
// decode the call and encode it again, which for a 4 MiB body is several
// copies of it.
func (t *Tracker) ReadCall(id jsonrpc.ID) (handle string) {
	r := &request{note: &Note{}, handle: rand.Text()}
	notes.Store(r.handle, r.note)
	t.track(id, r)
	return r.handle
}

// Read is called with each message the transport reads, before the SDK
// sees it. It tags a tools/call with its handle, and notes a cancel of a
// request in flight; it returns the message to pass on.
func (t *Tracker) Read(msg jsonrpc.Message) jsonrpc.Message {
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return msg
	}
	switch {
	case req.IsCall():
		if t.empty != nil && req.Method != "tools/call" {
			return msg
		}
		r := &request{note: &Note{}}
		if req.Method == "tools/call" {
			if params, ok := tag(req.Params, r); ok {
				req.Params = params
			}
		}
		t.track(req.ID, r)
	case req.Method == "notifications/cancelled":
		var p struct {
			RequestID any    `json:"requestId"`
			Reason    string `json:"reason"`
		}
		if json.Unmarshal(req.Params, &p) != nil {
			return msg
		}
		id, err := jsonrpc.MakeID(p.RequestID)
		if err != nil {
			return msg
		}
		t.mu.Lock()
		r := t.inflight[id]
		t.mu.Unlock()
		if r != nil {
			r.note.cancel(p.Reason)
		}
	}
	return msg
}

// Answer is called with each message the transport is about to write. For
// the response to a request in flight it forgets the request, and reports
// whether the client cancelled it: such a response is not written.
func (t *Tracker) Answer(msg jsonrpc.Message) (withhold bool) {
	resp, ok := msg.(*jsonrpc.Response)
	if !ok {
		return false
	}
	t.mu.Lock()
	r := t.inflight[resp.ID]
	delete(t.inflight, resp.ID)
	t.mu.Unlock()
	if r == nil {
		return false
	}
	release(r)
	_, cancelled := r.note.Cancelled()
	return cancelled
}

// Close forgets every request in flight: the connection is gone.
func (t *Tracker) Close() {
	t.mu.Lock()
	inflight := t.inflight
	t.inflight = map[jsonrpc.ID]*request{}
	t.mu.Unlock()
	for _, r := range inflight {
		release(r)
	}
}

func release(r *request) {
	if r.handle != "" {
		notes.Delete(r.handle)
	}
}

// tag sets params._meta[MetaKey] to a new handle for r, over whatever the
// client put there. Params that are not an object (or whose _meta is not
// one) are left for the SDK to refuse.
func tag(params json.RawMessage, r *request) (json.RawMessage, bool) {
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil || p == nil {
		return params, false
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := p["_meta"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &meta) != nil || meta == nil {
			return params, false
		}
	}
	handle := rand.Text()
	hb, _ := json.Marshal(handle)
	meta[MetaKey] = hb
	mb, err := json.Marshal(meta)
	if err != nil {
		return params, false
	}
	p["_meta"] = mb
	out, err := json.Marshal(p)
	if err != nil {
		return params, false
	}
	r.handle = handle
	notes.Store(handle, r.note)
	return out, true
}
