package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/otelattr"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// Traces of the proxy: a tools/call gets the layer's SERVER span (parent:
// the client's context from _meta; see remote.Layer's StartToolCallSpan),
// and the forwarded call a CLIENT span of the proxy, whose context goes to
// the upstream in the forwarded params._meta (SEP-414), in place of the
// client's: the upstream's span is then a child of the proxy's, which is
// a child of the client's, one trace across the three processes. Without a
// recording span the client's _meta passes through untouched, trace
// context included.

const tracerName = "github.com/mcp-outbox/mcp-outbox/outbox/sidecar"

// requestInfo describes a client's tools/call for its server span.
func (s *session) requestInfo(req *mcp.CallToolRequest) remote.RequestInfo {
	info := remote.RequestInfo{Transport: "pipe"}
	if req.Extra != nil && req.Extra.Header != nil {
		info.Transport = "tcp"
		info.SessionID = req.Extra.Header.Get(sessionHeader)
		info.ProtocolVersion = req.Extra.Header.Get("Mcp-Protocol-Version")
	}
	if v, ok := req.Params.Meta[mcp.MetaKeyProtocolVersion].(string); ok {
		info.ProtocolVersion = v
	}
	if info.ProtocolVersion == "" {
		s.mu.Lock()
		raw := s.initParams
		s.mu.Unlock()
		var init struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		if json.Unmarshal(raw, &init) == nil {
			info.ProtocolVersion = init.ProtocolVersion
		}
	}
	return info
}

// forwardTraced is forwardCall inside a CLIENT span of the proxy.
func (s *session) forwardTraced(ctx, waitCtx context.Context, clientParams json.RawMessage, claim *remote.Claim, tool string) (*mcp.CallToolResult, error) {
	ctx, span := s.p.tracer.Start(ctx, "tools/call "+tool, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(s.p.upstreamAttributes(tool)...)
		// A params that cannot take the context goes on as it is: the
		// forward reports what is wrong with it.
		if withCtx, err := injectMeta(ctx, clientParams); err == nil {
			clientParams = withCtx
		}
	}
	res, err := s.forwardCall(ctx, waitCtx, clientParams, claim)
	if span.IsRecording() {
		var wire *jsonrpc.Error
		switch {
		case errors.As(err, &wire):
			c := strconv.FormatInt(wire.Code, 10)
			span.SetAttributes(semconv.ErrorTypeKey.String(c), semconv.RPCResponseStatusCodeKey.String(c))
			span.SetStatus(codes.Error, "JSON-RPC error "+c)
		case errors.Is(err, remote.ErrNotForwarded):
			span.SetAttributes(semconv.ErrorTypeKey.String("not_forwarded"))
			span.SetStatus(codes.Error, "not forwarded")
		case err != nil:
			// The answer was lost: the upstream went away, or the wait ended.
			span.SetAttributes(semconv.ErrorTypeKey.String("answer_lost"))
			span.SetStatus(codes.Error, "answer lost")
		case res != nil && res.IsError:
			span.SetAttributes(semconv.ErrorTypeKey.String("tool_error"))
			span.SetStatus(codes.Error, "tool_error")
		}
	}
	span.End()
	return res, err
}

// upstreamAttributes are the conventions' attributes of a call the proxy
// forwards, as the upstream's client.
func (p *Proxy) upstreamAttributes(tool string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.McpMethodNameKey.String("tools/call"),
		semconv.GenAIOperationNameExecuteTool,
		semconv.GenAIToolNameKey.String(tool),
		semconv.JSONRPCProtocolVersionKey.String("2.0"),
	}
	switch u := p.opts.Upstream.(type) {
	case *HTTP:
		attrs = append(attrs, semconv.NetworkTransportTCP)
		if parsed, err := url.Parse(u.URL); err == nil {
			attrs = append(attrs, semconv.ServerAddressKey.String(parsed.Hostname()))
			if port, err := strconv.Atoi(parsed.Port()); err == nil {
				attrs = append(attrs, semconv.ServerPortKey.Int(port))
			}
		}
	case *Command:
		attrs = append(attrs, semconv.NetworkTransportPipe)
	}
	return attrs
}

// injectMeta puts the trace context of ctx into params._meta, replacing
// the client's traceparent and tracestate; everything else stays as the
// client wrote it (raw JSON, so numbers keep their digits).
func injectMeta(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(params, &fields); err != nil {
		return nil, err
	}
	set := map[string]json.RawMessage{"traceparent": nil, "tracestate": nil}
	carrier := outbox.MetaCarrier{}
	otelattr.Propagator.Inject(ctx, carrier)
	for k, v := range carrier {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		set[k] = b
	}
	return paramskey.SetMeta(fields, set)
}
