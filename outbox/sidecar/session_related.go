package sidecar

import (
	"context"
	"encoding/json"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Messages about a client's running request go on that request's own
// stream over Streamable HTTP (the response to its POST), not on the
// standalone stream (the client's GET), which the spec keeps for messages
// unrelated to any running request. The upstream says which request a
// notification is about by the progressToken the client gave the request
// (params._meta.progressToken), which the proxy passes on unchanged: a
// notification carrying one is about that request while it runs.
//
// The go-sdk's StreamableServerTransport puts a message on a request's
// stream when the context of its Write carries the request's id under an
// unexported key (idContextKey), which only the go-sdk's own ServerSession
// sets; the proxy has none. relatedContext answers that key, recognized
// by its type's package and name: TestProgressOnCallStream fails if a
// go-sdk release renames it.

const (
	sdkPackage = "github.com/modelcontextprotocol/go-sdk/mcp"
	sdkIDKey   = "idContextKey"
)

// relatedContext is ctx, carrying the id of the client's request that the
// message written with it is about.
type relatedContext struct {
	context.Context
	id jsonrpc.ID
}

func (c relatedContext) Value(key any) any {
	if t := reflect.TypeOf(key); t != nil && t.PkgPath() == sdkPackage && t.Name() == sdkIDKey {
		return c.id
	}
	return c.Context.Value(key)
}

// progressToken returns the progressToken of a request's params, as JSON
// text ("" without one).
func progressToken(params json.RawMessage) string {
	var p struct {
		Meta struct {
			Token json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.Meta.Token) == 0 || string(p.Meta.Token) == "null" {
		return ""
	}
	return compactJSON(p.Meta.Token)
}

// notificationToken returns the progressToken a notification carries in
// its params (notifications/progress), as JSON text.
func notificationToken(params json.RawMessage) string {
	var p struct {
		Token json.RawMessage `json:"progressToken"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.Token) == 0 || string(p.Token) == "null" {
		return ""
	}
	return compactJSON(p.Token)
}

func compactJSON(b json.RawMessage) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	c, _ := json.Marshal(v)
	return string(c)
}

// running notes the client's request m as running, so that notifications
// carrying its progressToken go on its stream until it is answered.
func (s *session) running(m *jsonrpc.Request) {
	tok := progressToken(m.Params)
	if tok == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens == nil {
		s.tokens = map[string]jsonrpc.ID{}
		s.tokenOf = map[jsonrpc.ID]string{}
	}
	s.tokens[tok] = m.ID
	s.tokenOf[m.ID] = tok
}

// settled forgets the client's request id: it was answered, or will not be.
func (s *session) settled(id jsonrpc.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if tok, ok := s.tokenOf[id]; ok {
		delete(s.tokenOf, id)
		if s.tokens[tok] == id {
			delete(s.tokens, tok)
		}
	}
}

// relatedTo returns the client's running request that the upstream's
// notification m is about, if any.
func (s *session) relatedTo(m *jsonrpc.Request) (jsonrpc.ID, bool) {
	if m.IsCall() {
		return jsonrpc.ID{}, false
	}
	tok := notificationToken(m.Params)
	if tok == "" {
		return jsonrpc.ID{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.tokens[tok]
	return id, ok
}
