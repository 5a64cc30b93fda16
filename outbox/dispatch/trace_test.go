package dispatch_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
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

// TestTrace_Delivery: the effect stores its call's span context, and a
// dispatcher that did not see the call (as after a restart) makes a CLIENT
// span per attempt, child of and linked to the call's span, and sends the
// attempt's traceparent downstream.
func TestTrace_Delivery(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider(t)
	s := newDispatchSetup(t, 0, nil)
	l, err := outbox.New(s.db, &outbox.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	srv := l.NewServer(&mcp.Implementation{Name: "traced", Version: "v0"}, nil)
	ledger.Register(l, srv, nil)
	cs := connect(t, srv)
	const key = "deliver-me"
	if res := callTraced(t, cs, "charge", key, map[string]any{"amount": 5}, clientTraceparent); res.IsError {
		t.Fatal(text(res))
	}
	call := spansNamed(sr, "tools/call charge")[0]
	var stored string
	if err := s.db.Read.QueryRow(`SELECT traceparent FROM effects`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if want := "00-" + clientTraceID + "-" + call.SpanContext().SpanID().String() + "-01"; stored != want {
		t.Fatalf("effects.traceparent = %q, want the call span's %q", stored, want)
	}

	// The layer above wrote with the real clock.
	d := s.dispatcher(t, dispatch.Destination{}, &dispatch.Options{TracerProvider: tp, Now: time.Now})
	round(t, d)
	sends := spansNamed(sr, "POST")
	if len(sends) != 1 {
		t.Fatalf("%d POST spans, want 1", len(sends))
	}
	send := sends[0]
	if send.SpanKind() != trace.SpanKindClient {
		t.Errorf("delivery span kind %v, want client", send.SpanKind())
	}
	if send.Parent().SpanID() != call.SpanContext().SpanID() || send.SpanContext().TraceID() != call.SpanContext().TraceID() {
		t.Errorf("delivery span parent %v, want the call's span %v", send.Parent(), call.SpanContext())
	}
	if links := send.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != call.SpanContext().SpanID() {
		t.Errorf("delivery span links %v, want one to the call's span", links)
	}
	wantAttrs(t, send, map[string]string{
		"http.request.method":        "POST",
		"http.response.status_code":  "200",
		"server.address":             "127.0.0.1",
		"mcp_outbox.destination":     "payments",
		"mcp_outbox.delivery.result": "delivered",
		"mcp_outbox.effect.seq":      "1",
	})
	reqs := s.fake.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests downstream, want 1", len(reqs))
	}
	want := fmt.Sprintf("00-%s-%s-01", clientTraceID, send.SpanContext().SpanID())
	if got := reqs[0].Header.Get("Traceparent"); got != want {
		t.Errorf("downstream traceparent %q, want the attempt's span %q", got, want)
	}
	noneContains(t, sr, key)
}

// TestTrace_DeliveryFailure: an attempt the destination refuses is an
// error span with error.type the status code.
func TestTrace_DeliveryFailure(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider(t)
	s := newDispatchSetup(t, 1, nil)
	fail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(fail.Close)
	d := s.dispatcher(t, dispatch.Destination{}, &dispatch.Options{TracerProvider: tp, Transport: redirectTo(fail.URL)})
	round(t, d)
	sends := spansNamed(sr, "POST")
	if len(sends) != 1 {
		t.Fatalf("%d POST spans, want 1", len(sends))
	}
	wantAttrs(t, sends[0], map[string]string{"error.type": "503", "http.response.status_code": "503", "mcp_outbox.delivery.result": "retry"})
	if sends[0].Status().Code != codes.Error {
		t.Errorf("status %v, want error", sends[0].Status())
	}
	if sends[0].Parent().IsValid() {
		t.Errorf("an effect of an untraced call: parent %v, want none", sends[0].Parent())
	}
	var stored string
	if err := s.db.Read.QueryRow(`SELECT traceparent FROM effects`).Scan(&stored); err != nil || stored != "" {
		t.Errorf("effects.traceparent of an untraced call = %q (%v), want empty", stored, err)
	}
}

// redirectTo sends every request to base instead, keeping its path.
type redirectTo string

func (base redirectTo) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	u, _ := r.URL.Parse(string(base))
	r.URL.Scheme, r.URL.Host = u.Scheme, u.Host
	return http.DefaultTransport.RoundTrip(r)
}
