package outbox_test

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// A client carries its span's context in a tools/call's _meta, where
// SEP-414 puts it and where the layer looks for the parent of the call's
// span: keep the same _meta for a retry, and the retry's span joins the
// same trace.
func ExampleMetaCarrier() {
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled}))

	params := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 100},
		Meta: mcp.Meta{outbox.MetaKeyIdempotency: "order-1234"}}
	propagation.TraceContext{}.Inject(ctx, outbox.MetaCarrier(params.Meta))
	fmt.Println(params.Meta["traceparent"])
	// Output: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}
