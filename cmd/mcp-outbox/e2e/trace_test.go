package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// otlpReceiver is a collector's OTLP/HTTP traces endpoint: it decodes
// every ExportTraceServiceRequest it is sent and keeps it.
type otlpReceiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
	raw  [][]byte
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "want POST /v1/traces", http.StatusNotFound)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var er coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &er); err != nil {
			t.Errorf("OTLP receiver: %s sent something that is not an ExportTraceServiceRequest: %v", req.Header.Get("Content-Type"), err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, &er)
		r.raw = append(r.raw, b)
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// exported is one span as received, with its service.
type exported struct {
	service string
	span    *tracepb.Span
}

func (r *otlpReceiver) spans() []exported {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []exported
	for _, er := range r.reqs {
		for _, rs := range er.ResourceSpans {
			service := attrString(rs.GetResource().GetAttributes(), "service.name")
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					out = append(out, exported{service, s})
				}
			}
		}
	}
	return out
}

// everything is all that was exported, as bytes and as JSON text.
func (r *otlpReceiver) everything() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for i, er := range r.reqs {
		b.Write(r.raw[i])
		j, _ := protojson.Marshal(er)
		b.Write(j)
	}
	return b.String()
}

func attrString(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			switch v := kv.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return strconv.FormatInt(v.IntValue, 10)
			case *commonpb.AnyValue_BoolValue:
				if v.BoolValue {
					return "true"
				}
				return "false"
			}
		}
	}
	return ""
}

func hexID(b []byte) string { return hex.EncodeToString(b) }

// TestTraceEndToEnd: the real serve binary, exporting over OTLP/HTTP to a
// receiver in this test, puts a client's call (with _meta.traceparent),
// its replay and its delivery into one trace: the two server spans are
// children of the client's span, the delivery a child of the call's span
// and linked to it, and the downstream gets the delivery's traceparent.
// Nothing exported holds the raw key or the arguments.
func TestTraceEndToEnd(t *testing.T) {
	t.Parallel()
	recv := startOTLPReceiver(t)
	var mu sync.Mutex
	var downstreamParents []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		downstreamParents = append(downstreamParents, r.Header.Get("Traceparent"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	t.Cleanup(api.Close)

	const (
		clientTrace = "5b8efff798038103d269b633813fc60c"
		clientSpan  = "eee19b7ec3c1b174"
		key         = "e2e-raw-key-never-exported"
		amount      = 73519
	)
	db := filepath.Join(t.TempDir(), "trace.db")
	cs, _ := serveStdio(t, bin, db, []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL,
		"OTEL_BSP_SCHEDULE_DELAY=50", // ms: flush fast, the test polls
		"OTEL_SERVICE_NAME=",
		"OTEL_TRACES_EXPORTER=",
		"OTEL_SDK_DISABLED=",
	}, "--dest", "payments="+api.URL)

	ctx := context.Background()
	args := map[string]any{"amount": amount}
	meta := mcp.Meta{outbox.MetaKeyIdempotency: key, "traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}
	first, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args, Meta: meta})
	if err != nil || first.IsError {
		t.Fatalf("charge: %v %+v", err, first)
	}
	replay, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args, Meta: meta})
	if err != nil || replay.IsError {
		t.Fatalf("replay: %v %+v", err, replay)
	}
	callID, _ := first.Meta[outbox.MetaKeyCall].(map[string]any)["callId"].(string)

	// Poll until the call, the replay and the delivery have arrived.
	var calls, sends []exported
	deadline := time.Now().Add(30 * time.Second)
	for {
		calls, sends = nil, nil
		for _, e := range recv.spans() {
			if hexID(e.span.TraceId) != clientTrace {
				continue
			}
			switch e.span.Name {
			case "tools/call charge":
				calls = append(calls, e)
			case "POST":
				sends = append(sends, e)
			}
		}
		mu.Lock()
		got := len(downstreamParents)
		mu.Unlock()
		if len(calls) >= 2 && len(sends) >= 1 && got >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %d call spans, %d delivery spans in trace %s, %d downstream requests; all spans: %d",
				len(calls), len(sends), clientTrace, got, len(recv.spans()))
		}
		poll := time.NewTimer(20 * time.Millisecond)
		<-poll.C
	}
	if len(calls) != 2 || len(sends) != 1 {
		t.Fatalf("%d call spans and %d delivery spans, want 2 and 1", len(calls), len(sends))
	}
	if calls[0].span.StartTimeUnixNano > calls[1].span.StartTimeUnixNano {
		calls[0], calls[1] = calls[1], calls[0]
	}
	for i, c := range calls {
		s := c.span
		if c.service != "mcp-outbox" {
			t.Errorf("call span %d: service.name %q, want mcp-outbox", i, c.service)
		}
		if s.Kind != tracepb.Span_SPAN_KIND_SERVER || hexID(s.ParentSpanId) != clientSpan {
			t.Errorf("call span %d: kind %v parent %s, want a server span under the client's %s", i, s.Kind, hexID(s.ParentSpanId), clientSpan)
		}
		want := map[string]string{
			"mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "charge",
			"network.transport": "pipe", "mcp.protocol.version": cs.InitializeResult().ProtocolVersion,
			"mcp_outbox.key_source": "meta", "mcp_outbox.key_hash": callkey.KeyHash(callkey.LocalPrincipal, key),
			"mcp_outbox.call_id": callID, "mcp_outbox.outcome": []string{"executed", "replayed"}[i],
			"mcp_outbox.effects_enqueued": []string{"1", "0"}[i],
		}
		for k, v := range want {
			if got := attrString(s.Attributes, k); got != v {
				t.Errorf("call span %d: %s = %q, want %q", i, k, got, v)
			}
		}
	}
	send := sends[0].span
	if send.Kind != tracepb.Span_SPAN_KIND_CLIENT || !bytes.Equal(send.ParentSpanId, calls[0].span.SpanId) {
		t.Errorf("delivery span: kind %v parent %s, want a client span under the call's %s", send.Kind, hexID(send.ParentSpanId), hexID(calls[0].span.SpanId))
	}
	if len(send.Links) != 1 || !bytes.Equal(send.Links[0].SpanId, calls[0].span.SpanId) {
		t.Errorf("delivery span links %v, want one to the call's span", send.Links)
	}
	for k, v := range map[string]string{"http.request.method": "POST", "http.response.status_code": "200",
		"server.address": "127.0.0.1", "mcp_outbox.destination": "payments", "mcp_outbox.delivery.result": "delivered"} {
		if got := attrString(send.Attributes, k); got != v {
			t.Errorf("delivery span: %s = %q, want %q", k, got, v)
		}
	}
	mu.Lock()
	gotParent := downstreamParents[0]
	mu.Unlock()
	if want := "00-" + clientTrace + "-" + hexID(send.SpanId) + "-01"; gotParent != want {
		t.Errorf("downstream traceparent %q, want the delivery span's %q", gotParent, want)
	}
	all := recv.everything()
	for _, secret := range []string{key, strconv.Itoa(amount)} {
		if strings.Contains(all, secret) {
			t.Errorf("the exported data holds %q", secret)
		}
	}

	if os.Getenv("MCP_OUTBOX_WRITE_TRACE_SVG") == "1" {
		var spans []exported
		for _, e := range recv.spans() {
			if hexID(e.span.TraceId) == clientTrace {
				spans = append(spans, e)
			}
		}
		svg := traceSVG(clientTrace, clientSpan, spans)
		out := filepath.Join("..", "..", "..", "testdata", "screenshots", "trace.svg")
		if err := os.WriteFile(out, []byte(svg), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", out)
	}
}

// TestTraceDeliveryAfterRestart: a call's effect delivered by another
// process (the next serve, or drain; the first serve had no destination
// for it) still joins the call's trace, from the traceparent stored with
// the effect; and the first process's spans, which its batch would have
// held for a minute, were flushed when it exited.
func TestTraceDeliveryAfterRestart(t *testing.T) {
	t.Parallel()
	for _, next := range []string{"serve", "drain"} {
		t.Run(next, func(t *testing.T) {
			t.Parallel()
			recv := startOTLPReceiver(t)
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `{}`)
			}))
			t.Cleanup(api.Close)
			const clientTrace, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
			db := filepath.Join(t.TempDir(), "restart.db")
			otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL, "OTEL_SERVICE_NAME=", "OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED="}

			first, _ := serveStdio(t, bin, db, append(otel, "OTEL_BSP_SCHEDULE_DELAY=60000"))
			res, err := first.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 5},
				Meta: mcp.Meta{outbox.MetaKeyIdempotency: "restart-1", "traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}})
			if err != nil || res.IsError {
				t.Fatalf("charge: %v %+v", err, res)
			}
			if err := first.Close(); err != nil { // stdin closes, serve exits and flushes
				t.Logf("close first serve: %v", err)
			}
			var call *tracepb.Span
			for _, e := range recv.spans() {
				if e.span.Name == "tools/call charge" && hexID(e.span.TraceId) == clientTrace {
					call = e.span
				}
			}
			if call == nil {
				t.Fatalf("the first serve's call span was not exported by the time it exited (%d spans)", len(recv.spans()))
			}

			service := "mcp-outbox"
			if next == "serve" {
				serveStdio(t, bin, db, append(otel, "OTEL_BSP_SCHEDULE_DELAY=50"), "--dest", "payments="+api.URL)
			} else {
				service = "mcp-outbox-drain"
				drain := exec.Command(bin, "drain", "--db", db, "--dest", "payments="+api.URL)
				drain.Env = append(append(os.Environ(), otel...), "OTEL_BSP_SCHEDULE_DELAY=60000") // exits, and flushes
				if out, err := drain.CombinedOutput(); err != nil {
					t.Fatalf("drain: %v\n%s", err, out)
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				for _, e := range recv.spans() {
					if e.span.Name != "POST" {
						continue
					}
					if hexID(e.span.TraceId) != clientTrace || !bytes.Equal(e.span.ParentSpanId, call.SpanId) || e.service != service {
						t.Fatalf("delivery by %s: service %q trace %s parent %s, want %s's span in trace %s under the call's span %s",
							next, e.service, hexID(e.span.TraceId), hexID(e.span.ParentSpanId), service, clientTrace, hexID(call.SpanId))
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("no delivery span from %s within 30s", next)
				}
				poll := time.NewTimer(20 * time.Millisecond)
				<-poll.C
			}
		})
	}
}

// TestTraceProxyEndToEnd: the real proxy in front of a real serve (as an
// upstream tool server that knows nothing of the proxy), both exporting to
// one receiver. The client's context reaches the proxy's server span; the
// proxy's span for the forwarded call is its child; and serve's server
// span is a child of that one, because the proxy put its context in the
// forwarded _meta: one trace across three processes.
func TestTraceProxyEndToEnd(t *testing.T) {
	t.Parallel()
	recv := startOTLPReceiver(t)
	const clientTrace, clientSpan = "a3ce929d0e0e47364bf92f3577b34da6", "53995c3f42cd8ad8"
	dir := t.TempDir()
	cmd := exec.Command(bin, "proxy", "--db", filepath.Join(dir, "proxy.db"), "--log-level", "warn",
		"--", bin, "serve", "--db", filepath.Join(dir, "upstream.db"), "--log-level", "warn")
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT="+recv.URL, "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_SERVICE_NAME=", "OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED=")
	cmd.Stderr = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "v0"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 5},
		Meta: mcp.Meta{outbox.MetaKeyIdempotency: "proxied-1", "traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}})
	if err != nil || res.IsError {
		t.Fatalf("charge through the proxy: %v %+v", err, res)
	}

	var proxyServer, proxyClient, upstream *tracepb.Span
	deadline := time.Now().Add(30 * time.Second)
	for proxyServer == nil || proxyClient == nil || upstream == nil {
		if time.Now().After(deadline) {
			t.Fatalf("within 30s: proxy server span %v, proxy client span %v, upstream span %v", proxyServer != nil, proxyClient != nil, upstream != nil)
		}
		poll := time.NewTimer(20 * time.Millisecond)
		<-poll.C
		for _, e := range recv.spans() {
			s := e.span
			if s.Name != "tools/call charge" || hexID(s.TraceId) != clientTrace {
				continue
			}
			switch {
			case e.service == "mcp-outbox-proxy" && s.Kind == tracepb.Span_SPAN_KIND_SERVER:
				proxyServer = s
			case e.service == "mcp-outbox-proxy" && s.Kind == tracepb.Span_SPAN_KIND_CLIENT:
				proxyClient = s
			case e.service == "mcp-outbox" && s.Kind == tracepb.Span_SPAN_KIND_SERVER:
				upstream = s
			}
		}
	}
	if hexID(proxyServer.ParentSpanId) != clientSpan {
		t.Errorf("proxy's server span parent %s, want the client's %s", hexID(proxyServer.ParentSpanId), clientSpan)
	}
	if !bytes.Equal(proxyClient.ParentSpanId, proxyServer.SpanId) {
		t.Errorf("proxy's forward span parent %s, want its server span %s", hexID(proxyClient.ParentSpanId), hexID(proxyServer.SpanId))
	}
	if !bytes.Equal(upstream.ParentSpanId, proxyClient.SpanId) {
		t.Errorf("upstream's span parent %s, want the proxy's forward span %s", hexID(upstream.ParentSpanId), hexID(proxyClient.SpanId))
	}
	if got := attrString(proxyServer.Attributes, "mcp_outbox.outcome"); got != "executed" {
		t.Errorf("proxy's server span outcome %q, want executed", got)
	}
	if got := attrString(proxyClient.Attributes, "network.transport"); got != "pipe" {
		t.Errorf("proxy's forward span network.transport %q, want pipe (a command upstream)", got)
	}
}
