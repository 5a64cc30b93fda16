package sidecar

import (
	"context"
	"encoding/json"
	"iter"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// standaloneEvents is the HTTP sessions' event store: the go-sdk's memory
// store, except for the standalone stream (id ""), the client's GET.
//
// The go-sdk (v1.8.0) answers a GET without Last-Event-ID by replaying
// every event its store holds for the standalone stream, from the first:
// a client that opens its stream again gets again what it got before, and
// one that opens it late gets the notifications sent before (through the
// proxy, a client of @modelcontextprotocol/server-everything got a
// notifications/tools/list_changed it does not get from the server
// directly, which drops what comes while no stream is open). Here only a
// resumption (Last-Event-ID) replays, as the spec's resumability says. One
// thing is kept for the first GET: the upstream's requests (sampling,
// elicitation, roots) sent before it opened, which the upstream waits for
// an answer to, and which a client that opens its stream only after its
// initialized was accepted (the TypeScript SDK's) would otherwise never
// see (TestUpstreamRequestAtInitialized). Notifications sent before the
// first GET are dropped, as a server without a store drops them.
//
// The go-sdk numbers a stream's events itself, from 0 at each GET without
// Last-Event-ID, and asks the store for those after index i on a
// resumption; so a fresh GET starts the stream's numbering here anew
// (base), and an index is translated to the memory store's.
type standaloneEvents struct {
	mcp.EventStore // the go-sdk's memory store

	mu       sync.Mutex
	sessions map[string]*standalone
}

// standalone is a session's standalone stream.
type standalone struct {
	opened bool // a GET has opened it
	count  int  // events appended to it
	base   int  // the memory store's index of its current numbering's 0
}

func newStandaloneEvents() *standaloneEvents {
	return &standaloneEvents{EventStore: mcp.NewMemoryEventStore(nil), sessions: map[string]*standalone{}}
}

func (e *standaloneEvents) stream(sessionID string) *standalone {
	st := e.sessions[sessionID]
	if st == nil {
		st = &standalone{}
		e.sessions[sessionID] = st
	}
	return st
}

func (e *standaloneEvents) Append(ctx context.Context, sessionID, streamID string, data []byte) error {
	if streamID != "" {
		return e.EventStore.Append(ctx, sessionID, streamID, data)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.stream(sessionID)
	if !st.opened && !isRequest(data) {
		return nil // dropped: nobody listens yet
	}
	if err := e.EventStore.Append(ctx, sessionID, streamID, data); err != nil {
		return err
	}
	st.count++
	return nil
}

func (e *standaloneEvents) After(ctx context.Context, sessionID, streamID string, index int) iter.Seq2[[]byte, error] {
	if streamID != "" {
		return e.EventStore.After(ctx, sessionID, streamID, index)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.stream(sessionID)
	if index < 0 {
		// A GET without Last-Event-ID: a new stream.
		if !st.opened {
			st.opened = true
			return e.EventStore.After(ctx, sessionID, streamID, st.base-1) // the requests kept for it
		}
		st.base = st.count
		return func(func([]byte, error) bool) {}
	}
	return e.EventStore.After(ctx, sessionID, streamID, st.base+index)
}

func (e *standaloneEvents) SessionClosed(ctx context.Context, sessionID string) error {
	e.mu.Lock()
	delete(e.sessions, sessionID)
	e.mu.Unlock()
	return e.EventStore.SessionClosed(ctx, sessionID)
}

// isRequest reports whether data is a JSON-RPC request (a method and an
// id), not a notification.
func isRequest(data []byte) bool {
	var m struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
	}
	return json.Unmarshal(data, &m) == nil && m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null"
}
