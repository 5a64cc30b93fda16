// Package otelattr holds what the layer (package outbox) and the dispatcher
// (package outbox/dispatch) share of tracing: the instrumentation scope and
// the propagator. Both must agree on them, and the dispatcher cannot import
// outbox, which starts it.
package otelattr

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the layer's and the
// dispatcher's spans: one scope, as before the dispatcher had a package of
// its own, so that users' span filters keep working.
const ScopeName = "github.com/mcp-outbox/mcp-outbox/outbox"

// Propagator is W3C Trace Context and Baggage, fixed rather than the
// global propagator, which is a no-op unless a program sets one: SEP-414
// names exactly these keys (traceparent, tracestate, baggage), and the
// downstream's traceparent header is what item 4 of the design promises.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Tracer returns tp's tracer of ScopeName; nil tp means the global
// provider.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		// The global provider delegates to whatever SDK the program
		// installs, even later; until then it is a no-op.
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}
