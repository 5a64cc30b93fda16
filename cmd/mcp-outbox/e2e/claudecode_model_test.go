package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeModel is a scripted Anthropic Messages API on 127.0.0.1: the one
// fake of the Claude Code rows of the interop matrix, at the boundary
// between Claude Code and the model. It answers as the real API does for
// what Claude Code sends, and it plays a model that wants one charge:
//
//   - the first turn of the conversation asks for the MCP tool, with the
//     charge's arguments;
//   - a tool_result that is an error (Claude Code's timeout, a closed
//     connection) gets the same tool call again under a new tool_use id,
//     as models retry a failed tool;
//   - a tool_result that is a success ends the turn with a text.
//
// The main conversation is told apart from Claude Code's side requests (a
// small model titling the session, a quota probe) by the tools it offers:
// only the main loop's request carries the MCP tool. Side requests get a
// short text, which is what they ask for.
//
// Every request is kept, so that a test can assert what reached the model.
type fakeModel struct {
	t    *testing.T
	srv  *httptest.Server
	tool string         // mcp__<server>__charge
	args map[string]any // the charge's arguments
	// maxCalls bounds the tool calls of one conversation, so that a server
	// that fails every time cannot loop the script.
	maxCalls int

	// beforeRetry, when set, runs before the model answers a failed tool
	// call with a retry: a test restarts a killed server there, in the
	// seconds a real model takes to answer.
	beforeRetry func()

	mu       sync.Mutex
	requests []modelRequest
	uses     int                  // tool_use ids handed out
	asked    map[string]time.Time // tool_use id: when the model asked for it
	answered map[string]time.Time // tool_use id: when its result reached the model
}

// modelRequest is one HTTP request Claude Code made to the model API.
type modelRequest struct {
	Method, Path string
	Body         []byte
	Main         bool // a turn of the main conversation (it offers the tool)
	At           time.Time
}

// modelToolResult is a tool_result block as the model received it.
type modelToolResult struct {
	ToolUseID string
	IsError   bool
	// Took is from the model asking for the call to its result reaching
	// the model.
	Took time.Duration
	// Text is the result's content as the model reads it: the text blocks
	// joined, or the string content.
	Text string
}

func startFakeModel(t *testing.T, tool string, args map[string]any) *fakeModel {
	t.Helper()
	m := &fakeModel{t: t, tool: tool, args: args, maxCalls: 4, asked: map[string]time.Time{}, answered: map[string]time.Time{}}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serveHTTP))
	t.Cleanup(m.srv.Close)
	return m
}

// URL is what ANTHROPIC_BASE_URL is set to.
func (m *fakeModel) URL() string { return m.srv.URL }

// messagesRequest is the part of a Messages API request the script reads.
type messagesRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// contentBlock is a block of a message's content.
type contentBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
}

func (m *fakeModel) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := modelRequest{Method: r.Method, Path: r.URL.Path, Body: body, At: time.Now()}
	var mr messagesRequest
	isMessages := r.Method == http.MethodPost && r.URL.Path == "/v1/messages"
	if isMessages {
		if err := json.Unmarshal(body, &mr); err != nil {
			m.apiError(w, http.StatusBadRequest, "invalid_request_error", "body is not JSON: "+err.Error())
			return
		}
		for _, tl := range mr.Tools {
			if tl.Name == m.tool {
				req.Main = true
			}
		}
	}
	m.mu.Lock()
	m.requests = append(m.requests, req)
	m.mu.Unlock()
	m.t.Logf("model API: %s %s (%d bytes, model %q, %d tools, main %v)", r.Method, r.URL.Path, len(body), mr.Model, len(mr.Tools), req.Main)

	switch {
	case isMessages:
		var blocks []contentBlock
		stop := "end_turn"
		if req.Main {
			blocks, stop = m.nextTurn(mr)
		} else {
			blocks = []contentBlock{{Type: "text", Text: "Charge"}}
		}
		m.answer(w, mr, blocks, stop)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/messages/count_tokens":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"input_tokens":%d}`, len(body)/4+1)
	default:
		// What the real API says of a path it does not serve.
		m.apiError(w, http.StatusNotFound, "not_found_error", "Not Found")
	}
}

// nextTurn is the script: it reads the conversation's last user message.
func (m *fakeModel) nextTurn(mr messagesRequest) ([]contentBlock, string) {
	var last []contentBlock
	if n := len(mr.Messages); n > 0 && mr.Messages[n-1].Role == "user" {
		last = blocksOf(mr.Messages[n-1].Content)
	}
	var result *contentBlock
	for i := range last {
		if last[i].Type == "tool_result" {
			result = &last[i]
			m.mu.Lock()
			if _, ok := m.answered[result.ToolUseID]; !ok {
				m.answered[result.ToolUseID] = time.Now()
			}
			m.mu.Unlock()
		}
	}
	calls := 0
	for _, msg := range mr.Messages {
		if msg.Role != "assistant" {
			continue
		}
		for _, b := range blocksOf(msg.Content) {
			if b.Type == "tool_use" && b.Name == m.tool {
				calls++
			}
		}
	}
	switch {
	case result != nil && !result.IsError:
		return []contentBlock{{Type: "text", Text: "Done: " + modelResultText(result.Content)}}, "end_turn"
	case calls >= m.maxCalls:
		return []contentBlock{{Type: "text", Text: fmt.Sprintf("The charge failed %d times; giving up.", calls)}}, "end_turn"
	}
	if result != nil && m.beforeRetry != nil {
		m.beforeRetry()
	}
	m.mu.Lock()
	m.uses++
	id := fmt.Sprintf("toolu_%02d%s", m.uses, strings.Repeat("x", 20))
	m.asked[id] = time.Now()
	m.mu.Unlock()
	input, err := json.Marshal(m.args)
	if err != nil {
		panic(err)
	}
	text := "I will charge the customer."
	if result != nil {
		text = "The charge failed; I will try again."
	}
	return []contentBlock{{Type: "text", Text: text}, {Type: "tool_use", ID: id, Name: m.tool, Input: input}}, "tool_use"
}

// blocksOf reads a message's content, a string or a list of blocks.
func blocksOf(raw json.RawMessage) []contentBlock {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []contentBlock{{Type: "text", Text: s}}
	}
	var bs []contentBlock
	_ = json.Unmarshal(raw, &bs)
	return bs
}

// modelResultText is a tool_result's content as text: a string, or its text
// blocks joined.
func modelResultText(raw json.RawMessage) string {
	var parts []string
	for _, b := range blocksOf(raw) {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// answer writes the assistant message: as server-sent events when the
// request streams (Claude Code's main loop does), as one JSON otherwise.
func (m *fakeModel) answer(w http.ResponseWriter, mr messagesRequest, blocks []contentBlock, stop string) {
	m.mu.Lock()
	n := len(m.requests)
	m.mu.Unlock()
	msgID := fmt.Sprintf("msg_fake%04d", n)
	usage := map[string]int{"input_tokens": 100, "output_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	if !mr.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"id": msgID, "type": "message", "role": "assistant", "model": mr.Model,
			"content": blocks, "stop_reason": stop, "stop_sequence": nil, "usage": usage,
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	event := func(name string, data any) {
		b, err := json.Marshal(data)
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": msgID, "type": "message", "role": "assistant", "model": mr.Model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": 100, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
	}})
	for i, b := range blocks {
		switch b.Type {
		case "text":
			event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": b.Text}})
		case "tool_use":
			event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": map[string]any{}}})
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(b.Input)}})
		}
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": 20}})
	event("message_stop", map[string]any{"type": "message_stop"})
}

// apiError writes an error as the real API shapes it.
func (m *fakeModel) apiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

// Requests returns every request made so far.
func (m *fakeModel) Requests() []modelRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]modelRequest(nil), m.requests...)
}

// ToolResults returns the tool_result blocks for the tool that reached the
// model, in order: each is one attempt of the charge, as the model saw it.
// The last main request holds the whole conversation.
func (m *fakeModel) ToolResults() []modelToolResult {
	var last *modelRequest
	for _, r := range m.Requests() {
		if r.Main {
			last = &r
		}
	}
	if last == nil {
		return nil
	}
	var mr messagesRequest
	if err := json.Unmarshal(last.Body, &mr); err != nil {
		return nil
	}
	var out []modelToolResult
	for _, msg := range mr.Messages {
		if msg.Role != "user" {
			continue
		}
		for _, b := range blocksOf(msg.Content) {
			if b.Type == "tool_result" {
				m.mu.Lock()
				took := m.answered[b.ToolUseID].Sub(m.asked[b.ToolUseID])
				m.mu.Unlock()
				out = append(out, modelToolResult{ToolUseID: b.ToolUseID, IsError: b.IsError, Text: modelResultText(b.Content), Took: took})
			}
		}
	}
	return out
}

// TestToolFailedAt: the time Claude Code gave up on a tool call is read
// from its debug log as it writes it (Claude Code 2.1.332), and a log
// without one gives zero.
func TestToolFailedAt(t *testing.T) {
	t.Parallel()
	debug := []byte(`2026-12-07T12:05:39.856Z [DEBUG] MCP server "outbox": Calling MCP tool: charge
2026-12-07T12:05:40.904Z [DEBUG] MCP server "outbox": Tool 'charge' failed after 1s: MCP server "outbox" tool "charge" timed out after 1s
2026-12-07T12:05:42.078Z [DEBUG] MCP server "outbox": Tool 'charge' completed successfully in 73ms
`)
	want := time.Date(2026, 12, 7, 12, 5, 40, 904_000_000, time.UTC)
	if got := toolFailedAt(debug); !got.Equal(want) {
		t.Errorf("toolFailedAt = %v, want %v", got, want)
	}
	if got := toolFailedAt(debug[:80]); !got.IsZero() {
		t.Errorf("toolFailedAt of a log without a failed call = %v, want zero", got)
	}
}
