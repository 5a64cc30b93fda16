package outbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// A client's context, as SEP-414 carries it in params._meta.
const (
	clientTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID      = "00f067aa0ba902b7"
	clientTraceparent = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

func recordingProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	return outboxtest.RecordingProvider(t)
}

// spansNamed returns the ended spans called name, in the order they ended.
func spansNamed(sr *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	return outboxtest.SpansNamed(sr, name)
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value { return outboxtest.AttrsOf(s) }

// wantAttrs checks attributes by their values' string forms.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	outboxtest.WantAttrs(t, s, want)
}

// noneContains fails if any attribute value of any recorded span contains
// one of secrets.
func noneContains(t *testing.T, sr *tracetest.SpanRecorder, secrets ...string) {
	t.Helper()
	outboxtest.NoneContains(t, sr, secrets...)
}

func callTraced(t *testing.T, cs *mcp.ClientSession, name, key string, args any, traceparent string) *mcp.CallToolResult {
	t.Helper()
	return outboxtest.CallTraced(t, cs, name, key, args, traceparent)
}

// TestTrace_CallSpans: a call and its replay are two SERVER spans, both
// children of the client's context from _meta, with the conventions' and
// the layer's attributes, and without the key or the arguments.
func TestTrace_CallSpans(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider(t)
	b := setup(t, &outbox.Options{TracerProvider: tp}, nil)
	const key = "secret-key-123"
	args := map[string]any{"amount": 4217}
	first := callTraced(t, b.session, "charge", key, args, clientTraceparent)
	replay := callTraced(t, b.session, "charge", key, args, clientTraceparent)
	if first.IsError || replay.IsError {
		t.Fatal(text(first), text(replay))
	}
	spans := spansNamed(sr, "tools/call charge")
	if len(spans) != 2 {
		t.Fatalf("%d spans named %q, want 2 (call and replay); all: %v", len(spans), "tools/call charge", sr.Ended())
	}
	callID, _ := callMeta(first)["callId"].(string)
	for i, s := range spans {
		if s.SpanKind() != trace.SpanKindServer {
			t.Errorf("span %d kind %v, want server", i, s.SpanKind())
		}
		if got := s.SpanContext().TraceID().String(); got != clientTraceID {
			t.Errorf("span %d trace %s, want the client's %s", i, got, clientTraceID)
		}
		if got := s.Parent().SpanID().String(); got != clientSpanID || !s.Parent().IsRemote() {
			t.Errorf("span %d parent %s (remote %v), want the client's span %s from _meta", i, got, s.Parent().IsRemote(), clientSpanID)
		}
		if got := s.Parent().TraceState().String(); got != "vendor=1" {
			t.Errorf("span %d parent tracestate %q, want vendor=1 from _meta", i, got)
		}
		wantAttrs(t, s, map[string]string{
			"mcp.method.name":          "tools/call",
			"gen_ai.operation.name":    "execute_tool",
			"gen_ai.tool.name":         "charge",
			"network.transport":        "pipe",
			"mcp.protocol.version":     b.session.InitializeResult().ProtocolVersion,
			"mcp_outbox.key_source":    "meta",
			"mcp_outbox.key_hash":      callkey.KeyHash(callkey.LocalPrincipal, key),
			"mcp_outbox.call_id":       callID,
			"mcp_outbox.recorded":      "true",
			"jsonrpc.protocol.version": "2.0",
		})
		if _, ok := attrsOf(s)["mcp.session.id"]; ok {
			t.Errorf("span %d has mcp.session.id, but in-memory sessions have no id", i)
		}
		if s.Status().Code == codes.Error {
			t.Errorf("span %d status error for a successful call", i)
		}
	}
	wantAttrs(t, spans[0], map[string]string{"mcp_outbox.outcome": "executed", "mcp_outbox.effects_enqueued": "1"})
	wantAttrs(t, spans[1], map[string]string{"mcp_outbox.outcome": "replayed", "mcp_outbox.effects_enqueued": "0"})
	noneContains(t, sr, key, "4217")
}

// TestTrace_Errors: a tool error is error.type tool_error with the span's
// status set; a JSON-RPC error carries its code as error.type and
// rpc.response.status_code.
func TestTrace_Errors(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider(t)
	b := setup(t, &outbox.Options{TracerProvider: tp}, nil)
	callTraced(t, b.session, "charge", "k1", map[string]any{"amount": 1}, "")
	conflict := callTraced(t, b.session, "charge", "k1", map[string]any{"amount": 2}, "")
	if !conflict.IsError {
		t.Fatal("same key, other arguments: want a conflict")
	}
	spans := spansNamed(sr, "tools/call charge")
	if len(spans) != 2 {
		t.Fatalf("%d charge spans, want 2", len(spans))
	}
	wantAttrs(t, spans[1], map[string]string{"mcp_outbox.outcome": "conflict", "error.type": "tool_error"})
	if spans[1].Status().Code != codes.Error {
		t.Errorf("conflict span status %v, want error", spans[1].Status())
	}
	if spans[0].Parent().IsValid() {
		t.Errorf("a call without trace context got parent %v", spans[0].Parent())
	}

	_, err := b.session.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}})
	if err == nil {
		t.Fatal("unknown tool: want a JSON-RPC error")
	}
	unknown := spansNamed(sr, "tools/call no_such_tool")
	if len(unknown) != 1 {
		t.Fatalf("%d spans for the unknown tool, want 1", len(unknown))
	}
	code := attrsOf(unknown[0])["rpc.response.status_code"].String()
	if code == "" || code == "0" || !strings.HasPrefix(code, "-32") {
		t.Errorf("rpc.response.status_code = %q, want the JSON-RPC error's code", code)
	}
	wantAttrs(t, unknown[0], map[string]string{"error.type": code})
	if _, ok := attrsOf(unknown[0])["mcp_outbox.outcome"]; ok {
		t.Error("a tool the layer does not know got the layer's outcome")
	}
}

// TestTrace_Sensitive: arguments and results appear only with LogSensitive.
func TestTrace_Sensitive(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider(t)
	b := setup(t, &outbox.Options{TracerProvider: tp, LogSensitive: true}, nil)
	callTraced(t, b.session, "charge", "k1", map[string]any{"amount": 4217}, "")
	s := spansNamed(sr, "tools/call charge")[0]
	a := attrsOf(s)
	if got := a["gen_ai.tool.call.arguments"].String(); !strings.Contains(got, "4217") {
		t.Errorf("gen_ai.tool.call.arguments = %q, want the arguments", got)
	}
	if got := a["gen_ai.tool.call.result"].String(); !strings.Contains(got, "charge_id") {
		t.Errorf("gen_ai.tool.call.result = %q, want the result", got)
	}
}

// TestTrace_HTTP: over Streamable HTTP the span says tcp and names the
// session; the HTTP request's own traceparent is linked when _meta gives
// the parent, and is the parent when _meta has none.
func TestTrace_HTTP(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider(t)
	b := setup(t, &outbox.Options{TracerProvider: tp}, nil)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return b.server }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	const headerTrace = "11111111111111111111111111111111"
	const headerSpan = "2222222222222222"
	hc := &http.Client{Transport: headerTransport{http.Header{"Traceparent": {"00-" + headerTrace + "-" + headerSpan + "-01"}}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "v0"}, nil).
		Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	callTraced(t, cs, "charge", "h1", map[string]any{"amount": 1}, clientTraceparent)
	callTraced(t, cs, "charge", "h2", map[string]any{"amount": 1}, "")
	spans := spansNamed(sr, "tools/call charge")
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	wantAttrs(t, spans[0], map[string]string{"network.transport": "tcp", "mcp.session.id": cs.ID()})
	if spans[0].Parent().SpanID().String() != clientSpanID {
		t.Errorf("with _meta: parent %v, want _meta's", spans[0].Parent())
	}
	if l := spans[0].Links(); len(l) != 1 || l[0].SpanContext.SpanID().String() != headerSpan {
		t.Errorf("with _meta: links %v, want one to the HTTP request's context", l)
	}
	if spans[1].Parent().SpanID().String() != headerSpan || spans[1].Parent().TraceID().String() != headerTrace {
		t.Errorf("without _meta: parent %v, want the HTTP request's context", spans[1].Parent())
	}
}

// TestTrace_SessionIDByProtocol: mcp.session.id only for protocol
// versions that have sessions (before 2026-07-28), as the conventions say.
func TestTrace_SessionIDByProtocol(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider(t)
	l, err := outbox.New(openDB(t), &outbox.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "v" + version}}
		_, end := remote.Of(l).StartToolCallSpan(context.Background(), req, func() remote.RequestInfo {
			return remote.RequestInfo{Transport: "tcp", ProtocolVersion: version, SessionID: "sess-1"}
		})
		end(&mcp.CallToolResult{}, nil)
	}
	old, stateless := spansNamed(sr, "tools/call v2025-11-25"), spansNamed(sr, "tools/call v2026-07-28")
	if len(old) != 1 || len(stateless) != 1 {
		t.Fatalf("spans: %v", sr.Ended())
	}
	wantAttrs(t, old[0], map[string]string{"mcp.session.id": "sess-1", "mcp.protocol.version": "2025-11-25", "network.transport": "tcp"})
	if v, ok := attrsOf(stateless[0])["mcp.session.id"]; ok {
		t.Errorf("2026-07-28: mcp.session.id = %q, want none", v.String())
	}
}
