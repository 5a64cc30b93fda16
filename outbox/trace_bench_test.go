package outbox_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// What tracing costs a call. The client sends a traceparent in _meta
// throughout, the costlier case for a server that does not trace (it is
// still read). Cases:
//
//	untraced   the layer without the tracing middleware: no tracing code
//	           on the request's path but two context lookups (where the
//	           call event is logged, and where an effect is enqueued)
//	off        the layer as Install sets it up, TracerProvider nil and no
//	           SDK installed: the global no-op provider, what serve runs
//	           with when no OTEL_* variable asks for tracing
//	recording  an SDK provider that samples everything, with a batcher
//	           exporting to nowhere: the price of tracing, for reference
func tracingCases(b *testing.B) []struct {
	name    string
	tp      trace.TracerProvider
	install bool
} {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return []struct {
		name    string
		tp      trace.TracerProvider
		install bool
	}{{"untraced", nil, false}, {"off", nil, true}, {"recording", tp, true}}
}

var benchMeta = mcp.Meta{"idempotencyKey": "same", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

// BenchmarkTracing is a whole call over in-memory transports: a replay
// of a recorded charge, the layer's cheapest recorded call (it reads the
// recorded outcome and writes nothing), so that an fsync's noise does not
// hide what tracing adds.
func BenchmarkTracing(b *testing.B) {
	ctx := context.Background()
	for _, c := range tracingCases(b) {
		b.Run(c.name, func(b *testing.B) {
			l, err := outbox.New(openDB(b), &outbox.Options{TracerProvider: c.tp})
			if err != nil {
				b.Fatal(err)
			}
			s := mcp.NewServer(&mcp.Implementation{Name: "bench", Version: "v0"}, nil)
			if c.install {
				l.Install(s)
			} else {
				outbox.InstallUntraced(l, s)
			}
			ledger.Register(l, s, nil)
			cs := connect(b, s)
			p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 100}, Meta: benchMeta}
			if res, err := cs.CallTool(ctx, p); err != nil || res.IsError {
				b.Fatal(err, res)
			}
			b.ReportAllocs()
			for b.Loop() {
				if res, err := cs.CallTool(ctx, p); err != nil || res.IsError {
					b.Fatal(err, res)
				}
			}
		})
	}
}

// BenchmarkTraceMiddleware is the tracing middleware alone, around a
// handler that does nothing: what tracing adds to every request, without
// the noise of the rest of a call.
func BenchmarkTraceMiddleware(b *testing.B) {
	ctx := context.Background()
	req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "charge", Arguments: []byte(`{"amount":100}`), Meta: benchMeta}}
	res := &mcp.CallToolResult{}
	next := func(context.Context, string, mcp.Request) (mcp.Result, error) { return res, nil }
	bare := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "charge", Arguments: []byte(`{"amount":100}`)}}
	for _, c := range tracingCases(b)[1:] {
		for _, r := range []struct {
			name string
			req  *mcp.CallToolRequest
		}{{"", req}, {"/no-traceparent", bare}} {
			b.Run(c.name+r.name, func(b *testing.B) {
				l, err := outbox.New(openDB(b), &outbox.Options{TracerProvider: c.tp})
				if err != nil {
					b.Fatal(err)
				}
				h := outbox.TraceMiddleware(l)(next)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := h(ctx, "tools/call", r.req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
