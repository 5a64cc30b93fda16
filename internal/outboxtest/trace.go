package outboxtest

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func RecordingProvider(t testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// spansNamed returns the ended spans called name, in the order they ended.
func SpansNamed(sr *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// wantAttrs checks attributes by their values' string forms.
func WantAttrs(t testing.TB, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	got := AttrsOf(s)
	for k, v := range want {
		a, ok := got[attribute.Key(k)]
		if !ok {
			t.Errorf("span %q: no attribute %s (want %q); has %v", s.Name(), k, v, s.Attributes())
			continue
		}
		if a.String() != v {
			t.Errorf("span %q: %s = %q, want %q", s.Name(), k, a.String(), v)
		}
	}
}

// noneContains fails if any attribute value of any recorded span contains
// one of secrets.
func NoneContains(t testing.TB, sr *tracetest.SpanRecorder, secrets ...string) {
	t.Helper()
	for _, s := range sr.Ended() {
		for _, kv := range s.Attributes() {
			for _, secret := range secrets {
				if strings.Contains(kv.Value.String(), secret) {
					t.Errorf("span %q attribute %s = %q holds %q", s.Name(), kv.Key, kv.Value.String(), secret)
				}
			}
		}
		if strings.Contains(s.Status().Description, secrets[0]) {
			t.Errorf("span %q status %q holds a secret", s.Name(), s.Status().Description)
		}
	}
}

func CallTraced(t testing.TB, cs *mcp.ClientSession, name, key string, args any, traceparent string) *mcp.CallToolResult {
	t.Helper()
	meta := mcp.Meta{}
	if key != "" {
		meta["idempotencyKey"] = key
	}
	if traceparent != "" {
		meta["traceparent"] = traceparent
		meta["tracestate"] = "vendor=1"
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func AttrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}
