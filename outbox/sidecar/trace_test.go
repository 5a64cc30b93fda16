package sidecar

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// metaUpstream is the test upstream, remembering the _meta of every
// tools/call it receives.
type metaUpstream struct {
	*upstream
	mu    sync.Mutex
	metas []map[string]any
}

func (u *metaUpstream) Dial(ctx context.Context) (mcp.Connection, error) {
	s := u.server()
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if c, ok := req.(*mcp.CallToolRequest); ok {
				u.mu.Lock()
				u.metas = append(u.metas, c.Params.Meta)
				u.mu.Unlock()
			}
			return next(ctx, method, req)
		}
	})
	proxySide, serverSide := net.Pipe()
	if _, err := s.Connect(ctx, &mcp.IOTransport{Reader: serverSide, Writer: serverSide}, nil); err != nil {
		return nil, err
	}
	return (&mcp.IOTransport{Reader: proxySide, Writer: proxySide}).Connect(ctx)
}

func (u *metaUpstream) received() []map[string]any {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]map[string]any(nil), u.metas...)
}

// TestProxyTrace: the proxy's server span continues the client's trace
// from _meta and carries the layer's attributes; the forwarded call has a
// CLIENT span of its own, whose context reaches the upstream in _meta
// beside what the client sent; a replay forwards nothing.
func TestProxyTrace(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	up := &metaUpstream{upstream: newUpstream()}
	cs := newTestProxy(t, &outbox.Options{TracerProvider: tp}, Options{Upstream: up}).connect(t)
	ctx := context.Background()

	const traceID, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	const key = "proxy-secret-key"
	for range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "work", Arguments: map[string]any{"n": 7},
			Meta: mcp.Meta{outbox.MetaKeyIdempotency: key, "traceparent": "00-" + traceID + "-" + spanID + "-01", "baggage": "tenant=acme"}})
		if err != nil || res.IsError {
			t.Fatalf("call: %v %v", err, res)
		}
	}

	var servers, clients []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() != "tools/call work" {
			continue
		}
		switch s.SpanKind() {
		case trace.SpanKindServer:
			servers = append(servers, s)
		case trace.SpanKindClient:
			clients = append(clients, s)
		}
	}
	if len(servers) != 2 || len(clients) != 1 {
		t.Fatalf("%d server and %d client spans, want 2 (call, replay) and 1 (the one forward)", len(servers), len(clients))
	}
	outcomes := []string{"executed", "replayed"}
	for i, s := range servers {
		if s.Parent().SpanID().String() != spanID || s.SpanContext().TraceID().String() != traceID {
			t.Errorf("server span %d: parent %v, want the client's context from _meta", i, s.Parent())
		}
		got := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			got[kv.Key] = kv.Value.String()
		}
		for k, v := range map[attribute.Key]string{
			"mcp.method.name": "tools/call", "gen_ai.tool.name": "work", "network.transport": "pipe",
			"mcp_outbox.outcome": outcomes[i], "mcp_outbox.key_hash": callkey.KeyHash(callkey.LocalPrincipal, key),
			"mcp.protocol.version": cs.InitializeResult().ProtocolVersion,
		} {
			if got[k] != v {
				t.Errorf("server span %d: %s = %q, want %q", i, k, got[k], v)
			}
		}
		for k, v := range got {
			if strings.Contains(v, key) {
				t.Errorf("server span %d: %s holds the raw key", i, k)
			}
		}
	}
	fwd := clients[0]
	if fwd.Parent().SpanID() != servers[0].SpanContext().SpanID() {
		t.Errorf("forward span's parent %v, want the call's server span", fwd.Parent())
	}
	metas := up.received()
	if len(metas) != 1 {
		t.Fatalf("upstream got %d calls, want 1", len(metas))
	}
	want := "00-" + traceID + "-" + fwd.SpanContext().SpanID().String() + "-01"
	if got := metas[0]["traceparent"]; got != want {
		t.Errorf("upstream _meta.traceparent = %v, want the forward span's %s", got, want)
	}
	if got := metas[0]["baggage"]; got != "tenant=acme" {
		t.Errorf("upstream _meta.baggage = %v, want the client's", got)
	}
	if metas[0][outbox.MetaKeyIdempotency] != key || metas[0][remote.MetaKeyClaim] == nil {
		t.Errorf("upstream _meta lost the client's key or the claim: %v", metas[0])
	}
}
