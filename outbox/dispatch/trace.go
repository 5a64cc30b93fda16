package dispatch

import (
	"context"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/otelattr"
)

// Attributes of a delivery attempt's span, beside the HTTP client
// conventions' own.
const (
	// attrDestination is the effect's destination, by its configured name.
	attrDestination = attribute.Key("mcp_outbox.destination")
	// attrEffectID is the effect's row id, as the operator tools name it.
	attrEffectID = attribute.Key("mcp_outbox.effect.id")
	// attrEffectSeq is the effect's position in its call (from 1).
	attrEffectSeq = attribute.Key("mcp_outbox.effect.seq")
	// attrDeliveryResult is what the attempt came to, as in the delivery
	// event: delivered, retry, dead or unknown.
	attrDeliveryResult = attribute.Key("mcp_outbox.delivery.result")
	// attrEffectKeyHash is the hash prefix of the effect's Idempotency-Key,
	// as the delivery event's key_hash: the key itself would let anyone
	// who reads the trace send a request the destination takes for the
	// effect.
	attrEffectKeyHash = attribute.Key("mcp_outbox.effect.idempotency_key_hash")
)

// tracedAttempt is attempt inside a CLIENT span of its own.
//
// The span's parent is the span of the call that enqueued the effect, read
// from the effects row (effects.traceparent), so the delivery shows in the
// call's trace however much later, and in whatever process, it happens;
// it is also linked to that span, which is how backends that draw a trace
// per request still tie the two together. The attempt sends its own span's
// traceparent downstream (attempt injects it), so the destination's server
// span is a child of this one.
func (d *Dispatcher) tracedAttempt(ctx context.Context, ds *destState, e *claimedEffect) outcome {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
	if e.traceparent != "" {
		parent := trace.SpanContextFromContext(otelattr.Propagator.Extract(context.Background(),
			propagation.MapCarrier{"traceparent": e.traceparent}))
		if parent.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: parent}))
		}
	}
	// The HTTP client conventions name the span by the method alone when
	// there is no URL template; an effect's path is concrete (it may hold
	// ids), so it has none.
	ctx, span := d.tracer.Start(ctx, e.method, opts...)
	o := d.attempt(ctx, ds, e)
	if span.IsRecording() {
		d.describeAttempt(span, ds, e, o)
	}
	span.End()
	return o
}

// describeAttempt puts the conventions' and the dispatcher's attributes on
// an attempt's span. The full URL, whose path may hold personal data, only
// with LogSensitive.
func (d *Dispatcher) describeAttempt(span trace.Span, ds *destState, e *claimedEffect, o outcome) {
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		semconv.HTTPRequestMethodKey.String(e.method),
		semconv.ServerAddressKey.String(ds.URL.Hostname()),
		attrDestination.String(ds.Name),
		attrEffectID.Int64(e.id),
		attrEffectSeq.Int(e.seq),
		attrDeliveryResult.String(deliveryResult(o)),
		attrEffectKeyHash.String(callkey.HashPrefix(e.key)),
	)
	if port := ds.URL.Port(); port != "" {
		if n, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, semconv.ServerPortKey.Int(n))
		}
	} else if ds.URL.Scheme == "https" {
		attrs = append(attrs, semconv.ServerPortKey.Int(443))
	} else {
		attrs = append(attrs, semconv.ServerPortKey.Int(80))
	}
	if e.attempts > 1 {
		attrs = append(attrs, semconv.HTTPRequestResendCountKey.Int(e.attempts-1))
	}
	if o.status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCodeKey.Int(o.status))
	}
	if d.opts.LogSensitive {
		if u, err := joinURL(ds.URL, e.path); err == nil {
			attrs = append(attrs, semconv.URLFullKey.String(u))
		}
	}
	switch {
	case o.status >= 400:
		attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(o.status)))
		span.SetStatus(codes.Error, "HTTP "+strconv.Itoa(o.status))
	case o.status == 0 && o.err != "":
		kind := "transport_error"
		if strings.HasSuffix(o.err, "timed out") {
			kind = "timeout"
		}
		attrs = append(attrs, semconv.ErrorTypeKey.String(kind))
		span.SetStatus(codes.Error, o.err)
	}
	span.SetAttributes(attrs...)
}
