package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/otelattr"
)

// Traces: one SERVER span per MCP request the server receives, following
// the OpenTelemetry MCP conventions (open-telemetry/semantic-conventions-genai,
// model/mcp/, status Development), carrying the layer's own attributes
// (mcp_outbox.*) for tools/call; and one CLIENT span per delivery attempt
// (dispatch_trace.go). With no TracerProvider configured the global one is
// used, which is a no-op until someone installs an SDK: the spans are then
// non-recording and no attribute is built (every setter below checks
// IsRecording first), so tracing costs a context lookup or two per call.

// The layer's span attributes, listed in the package doc ("Traces"), which
// is what a user filtering spans reads: keep the two in step. They live in
// a namespace of their own: mcp.* and gen_ai.* belong to the conventions,
// which know nothing of keys and outboxes.
const (
	// attrKeySource is where the call's key came from: meta, params,
	// header, argument or fingerprint ("" when it has none).
	attrKeySource = attribute.Key("mcp_outbox.key_source")
	// attrOutcome is the call's outcome, as in the call event and the
	// mcp_outbox_calls_total metric: executed, failed, replayed, joined,
	// conflict, in_progress, unknown, not_recorded.
	attrOutcome = attribute.Key("mcp_outbox.outcome")
	// attrKeyHash is callkey.KeyHash of the call's key, never the key itself:
	// whoever holds a key can replay the call.
	attrKeyHash = attribute.Key("mcp_outbox.key_hash")
	// attrCallID is the recorded call's id (calls.uid, "callId" in the
	// result's _meta): a replay names the call it replays.
	attrCallID = attribute.Key("mcp_outbox.call_id")
	// attrEffects is how many effects the call enqueued.
	attrEffects = attribute.Key("mcp_outbox.effects_enqueued")
	// attrRecorded says whether the tool's calls are recorded at all
	// (readOnlyHint and idempotentHint tools run unrecorded by default).
	attrRecorded = attribute.Key("mcp_outbox.recorded")
)

// propagator is shared with the dispatcher: see otelattr.Propagator.
var propagator = otelattr.Propagator

// MetaCarrier carries trace context in a request's params._meta, where
// SEP-414 puts traceparent, tracestate and baggage, unprefixed. Values that
// are not strings read as absent.
type MetaCarrier map[string]any

// Get returns the string under key, or "".
func (m MetaCarrier) Get(key string) string { s, _ := m[key].(string); return s }

// Set stores value under key.
func (m MetaCarrier) Set(key, value string) { m[key] = value }

// Keys lists the carrier's keys.
func (m MetaCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

func tracerOf(tp trace.TracerProvider) trace.Tracer { return otelattr.Tracer(tp) }

// requestInfo describes an MCP request for its server span. The proxy,
// which has no go-sdk server session, gives one as a remote.RequestInfo, a
// struct of the same fields converted to this one.
type requestInfo struct {
	// Transport is the network.transport: "pipe" for stdio, "tcp" for HTTP.
	Transport string
	// ProtocolVersion is the MCP protocol version of the session or request.
	ProtocolVersion string
	// SessionID is the MCP session id, "" if none.
	SessionID string
}

// startServerSpan starts the SERVER span of an MCP request.
//
// Its parent is the trace context the client put in params._meta (SEP-414).
// Over HTTP the request's own traceparent header (the HTTP client's span)
// is a second context: the span is linked to it when both exist and
// differ, and it is the parent when _meta has none. A span already in ctx
// is linked too when _meta or the header gives the parent. The go-sdk runs
// a stateful HTTP session's handlers under the context of the request that
// opened the session, so a span an HTTP middleware put in ctx belongs to
// that request, not to this one: the header is the reliable ambient
// context, ctx's span only a fallback.
func startServerSpan(ctx context.Context, tracer trace.Tracer, name string, meta map[string]any, header http.Header) (context.Context, trace.Span) {
	metaCtx := context.Background()
	if hasTraceContext(meta) {
		metaCtx = propagator.Extract(metaCtx, MetaCarrier(meta))
	}
	fromMeta := trace.SpanContextFromContext(metaCtx)
	var fromHeader trace.SpanContext
	if header != nil && header.Get("Traceparent") != "" {
		fromHeader = trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.HeaderCarrier(header)))
	}
	ambient := trace.SpanContextFromContext(ctx)
	var links []trace.Link
	switch {
	case fromMeta.IsValid():
		ctx = trace.ContextWithRemoteSpanContext(ctx, fromMeta)
		links = appendLink(appendLink(links, fromHeader, fromMeta), ambient, fromMeta)
	case fromHeader.IsValid():
		ctx = trace.ContextWithRemoteSpanContext(ctx, fromHeader)
		links = appendLink(links, ambient, fromHeader)
	}
	if b := baggage.FromContext(metaCtx); b.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, b)
	}
	if links == nil {
		return tracer.Start(ctx, name, serverKind...)
	}
	return tracer.Start(ctx, name, append(serverKind[:1:1], trace.WithLinks(links...))...)
}

// hasTraceContext reports whether meta holds anything the propagator
// reads: most requests carry none, and then extracting costs allocations
// for nothing.
func hasTraceContext(meta map[string]any) bool {
	if len(meta) == 0 {
		return false
	}
	_, tp := meta["traceparent"]
	_, bg := meta["baggage"]
	return tp || bg
}

// serverKind is the start option of every server span, shared so that a
// span without links allocates no option slice.
var serverKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// appendLink adds a link to sc unless it is invalid or the parent itself.
func appendLink(links []trace.Link, sc, parent trace.SpanContext) []trace.Link {
	if sc.IsValid() && !sc.Equal(parent) {
		links = append(links, trace.Link{SpanContext: sc})
	}
	return links
}

// spanName is "{mcp.method.name} {target}" for requests that name a tool
// or a prompt, as the conventions have it, else the method.
func spanName(method, target string) string {
	if target == "" {
		return method
	}
	return method + " " + target
}

// requestAttributes are the conventions' attributes of a request.
//
// jsonrpc.request.id is missing: the go-sdk does not show a request's
// JSON-RPC id to middleware or handlers (go-sdk#1264), so no span of this
// package can carry it.
func requestAttributes(method, tool string, info requestInfo) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, semconv.McpMethodNameKey.String(method), semconv.JSONRPCProtocolVersionKey.String("2.0"))
	if method == "tools/call" {
		attrs = append(attrs, semconv.GenAIOperationNameExecuteTool, semconv.GenAIToolNameKey.String(tool))
	}
	if info.ProtocolVersion != "" {
		attrs = append(attrs, semconv.McpProtocolVersionKey.String(info.ProtocolVersion))
	}
	if info.Transport != "" {
		attrs = append(attrs, semconv.NetworkTransportKey.String(info.Transport))
	}
	// 2026-07-28 has no sessions: an id seen there is the transport's, and
	// the conventions name mcp.session.id for earlier versions only.
	if info.SessionID != "" && (info.ProtocolVersion == "" || info.ProtocolVersion < newProtocolVersion) {
		attrs = append(attrs, semconv.McpSessionIDKey.String(info.SessionID))
	}
	return attrs
}

// endServerSpan records how the request ended and ends span: a JSON-RPC
// error by its code (error.type and rpc.response.status_code), a tool
// result with isError as error.type=tool_error.
func endServerSpan(span trace.Span, res mcp.Result, err error, sensitive bool) {
	if !span.IsRecording() {
		span.End()
		return
	}
	if err != nil {
		// The go-sdk sends a plain Go error with code 0 (jsonrpc2's
		// toWireError keeps only a wrapped wire error's code).
		code := int64(0)
		var wire *jsonrpc.Error
		if errors.As(err, &wire) {
			code = wire.Code
		}
		c := strconv.FormatInt(code, 10)
		span.SetAttributes(semconv.ErrorTypeKey.String(c), semconv.RPCResponseStatusCodeKey.String(c))
		// The message may quote arguments back: it stays out of the span.
		span.SetStatus(codes.Error, "JSON-RPC error "+c)
		span.End()
		return
	}
	if cr, ok := res.(*mcp.CallToolResult); ok && cr != nil {
		if id := callIDOf(cr); id != "" {
			span.SetAttributes(attrCallID.String(id))
		}
		if cr.IsError {
			span.SetAttributes(semconv.ErrorTypeKey.String("tool_error"))
			span.SetStatus(codes.Error, "tool_error")
		}
		if sensitive {
			if b, err := json.Marshal(cr); err == nil {
				span.SetAttributes(semconv.GenAIToolCallResultKey.String(string(b)))
			}
		}
	}
	span.End()
}

// callIDOf reads the call id the layer put in a result's _meta.
func callIDOf(cr *mcp.CallToolResult) string {
	m, _ := cr.Meta[MetaKeyCall].(map[string]any)
	id, _ := m["callId"].(string)
	return id
}

// traceMiddleware gives every request the server receives a SERVER span;
// notifications pass untraced. Install adds it outside the layer's own
// middleware, so the layer's call event and its span attributes see the
// span in ctx, and so does the handler (an effect it enqueues records the
// span as the one that enqueued it).
func (l *Layer) traceMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if strings.HasPrefix(method, "notifications/") {
			return next(ctx, method, req)
		}
		var meta map[string]any
		var target string
		params := req.GetParams()
		switch p := params.(type) {
		case *mcp.CallToolParamsRaw:
			if p != nil {
				target, meta = p.Name, p.Meta
			}
		case *mcp.GetPromptParams:
			if p != nil {
				target, meta = p.Name, p.Meta
			}
		default:
			// Params of requests that may omit them (ping, list methods)
			// arrive as typed nil pointers, whose promoted GetMeta would
			// dereference nil.
			if params != nil && !reflect.ValueOf(params).IsNil() {
				meta = params.GetMeta()
			}
		}
		var header http.Header
		extra := req.GetExtra()
		if extra != nil {
			header = extra.Header
		}
		ctx, span := startServerSpan(ctx, l.tracer, spanName(method, target), meta, header)
		if span.IsRecording() {
			span.SetAttributes(requestAttributes(method, target, requestInfoOf(req, meta, header))...)
			if l.opts.LogSensitive {
				if p, ok := params.(*mcp.CallToolParamsRaw); ok {
					span.SetAttributes(semconv.GenAIToolCallArgumentsKey.String(string(p.Arguments)))
				}
			}
		}
		res, err := next(ctx, method, req)
		endServerSpan(span, res, err, l.opts.LogSensitive)
		return res, err
	}
}

// requestInfoOf finds what the conventions want to know about the
// request's session. The go-sdk tells middleware no transport: Extra is
// set by the HTTP transports only (it carries the headers), so a request
// without it came over stdio, or over in-memory transports, which are
// pipes too. The protocol version is the request's own (2026-07-28 names
// it in every request's _meta; over HTTP the Mcp-Protocol-Version header),
// else the one the client asked for in initialize.
func requestInfoOf(req mcp.Request, meta map[string]any, header http.Header) requestInfo {
	info := requestInfo{Transport: "pipe"}
	if header != nil {
		info.Transport = "tcp"
	}
	if v, ok := meta[mcp.MetaKeyProtocolVersion].(string); ok {
		info.ProtocolVersion = v
	} else if v := header.Get("Mcp-Protocol-Version"); v != "" {
		info.ProtocolVersion = v
	}
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil {
		if info.ProtocolVersion == "" {
			if p := ss.InitializeParams(); p != nil {
				info.ProtocolVersion = p.ProtocolVersion
			}
		}
		info.SessionID = ss.ID()
	}
	return info
}

// tracerProvider is the provider of the layer's spans, for the proxy's
// own spans of the calls it forwards.
func (l *Layer) tracerProvider() trace.TracerProvider {
	if l.opts.TracerProvider == nil {
		return otel.GetTracerProvider()
	}
	return l.opts.TracerProvider
}

// traceCall puts the layer's attributes on the call's span, once its
// outcome is final: called where the call event is logged.
func (l *Layer) traceCall(ctx context.Context, a *attempt) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs,
		attrOutcome.String(a.outcome),
		attrRecorded.Bool(a.tool.record),
		attrEffects.Int(a.effects))
	if a.id.source != "" { // a call refused before its key was known, or an unrecorded tool's
		attrs = append(attrs, attrKeySource.String(string(a.id.source)))
	}
	if a.id.key != "" {
		attrs = append(attrs, attrKeyHash.String(callkey.KeyHash(a.id.principal, a.id.key)))
	}
	if a.toolCallID != "" {
		// The conventions' name for the model's tool-call id; this
		// request's own, as in the call event.
		attrs = append(attrs, semconv.GenAIToolCallIDKey.String(a.toolCallID))
	}
	span.SetAttributes(attrs...)
}

// traceparentOf renders the span context in ctx as a W3C traceparent, ""
// when there is none: what an effect stores of the call that enqueued it,
// so that its deliveries join the call's trace even after a restart.
func traceparentOf(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}
