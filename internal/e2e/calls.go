// The calls and checks the end-to-end tests make against a server under
// test: tools/call params, the layer's _meta, call_status, HTTP clients.

package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

// ChargeCall is a charge of amount cents, under _meta key when key is not "".
// Each call needs its own params: the SDK writes into the _meta it is given.
func ChargeCall(key string, amount int) *mcp.CallToolParams {
	p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": amount, "currency": "eur"}}
	if key != "" {
		p.Meta = mcp.Meta{outbox.MetaKeyIdempotency: key}
	}
	return p
}

// CallMetaOf returns the layer's record of a call carried in a result's
// _meta, or nil.
func CallMetaOf(res *mcp.CallToolResult) map[string]any {
	m, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
	return m
}

// ResultText joins a result's text content, for messages and assertions.
func ResultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// StructuredChargeID reads charge_id from a charge result's structured
// content.
func StructuredChargeID(t *testing.T, res *mcp.CallToolResult) int64 {
	t.Helper()
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		t.Fatalf("structured content is %T (%v), want an object", res.StructuredContent, res.StructuredContent)
	}
	id, ok := m["charge_id"].(float64)
	if !ok {
		t.Fatalf("structured content %v has no numeric charge_id", m)
	}
	return int64(id)
}

// MustSucceed calls a tool and fails the test on a protocol error or a tool
// error.
func MustSucceed(t *testing.T, cs *mcp.ClientSession, p *mcp.CallToolParams) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, p)
	if err != nil {
		t.Fatalf("call %s: %v", p.Name, err)
	}
	if res.IsError {
		t.Fatalf("call %s: tool error: %s", p.Name, ResultText(res))
	}
	return res
}

// WantReplay checks the layer's _meta of a result: replayed or not, and
// the key source.
func WantReplay(t *testing.T, res *mcp.CallToolResult, replayed bool, keySource string) map[string]any {
	t.Helper()
	m := CallMetaOf(res)
	if m == nil {
		t.Fatalf("result has no %s in _meta: %v", outbox.MetaKeyCall, res.Meta)
	}
	if m["replayed"] != replayed {
		t.Errorf("replayed = %v, want %v (meta %v)", m["replayed"], replayed, m)
	}
	if m["keySource"] != keySource {
		t.Errorf("keySource = %v, want %q (meta %v)", m["keySource"], keySource, m)
	}
	if m["state"] != "completed" {
		t.Errorf("state = %v, want completed (meta %v)", m["state"], m)
	}
	return m
}

// CompletedAt is a call's completedAt from its _meta record.
func CompletedAt(t *testing.T, meta map[string]any) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, meta["completedAt"].(string))
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// CallStatus calls the status tool for key and returns its structured
// answer.
func CallStatus(t *testing.T, cs *mcp.ClientSession, key string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: outbox.StatusToolName, Arguments: map[string]any{"key": key}})
	if err != nil || res.IsError {
		t.Fatalf("call_status %q: %v %v", key, err, res)
	}
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		t.Fatalf("call_status %q: structured content %T", key, res.StructuredContent)
	}
	return m
}

// StatefulVersion is the last protocol version with sessions; clients get
// mcphttp.StatelessVersion (http.go) by default.
const StatefulVersion = "2025-11-25"

// HTTPClient returns a client of its own for one test, optionally adding
// an Idempotency-Key header to every request.
func HTTPClient(t *testing.T, key string) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	var rt http.RoundTripper = tr
	if key != "" {
		rt = header{name: outbox.HeaderIdempotencyKey, value: key, base: tr}
	}
	return &http.Client{Transport: rt, Timeout: 30 * time.Second}
}

// BearerClient returns an HTTP client of its own that sends token on every
// request.
func BearerClient(t *testing.T, token string) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: header{name: "Authorization", value: "Bearer " + token, base: tr}, Timeout: 30 * time.Second}
}

// header sends a header with every request, as an HTTP client library
// with idempotency support (or a bearer token) would.
type header struct {
	name, value string
	base        http.RoundTripper
}

func (h header) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.name, h.value)
	return h.base.RoundTrip(r)
}

// ConnectHTTP opens an MCP session at url: stateful when version is
// StatefulVersion, stateless (the SDK's default, 2026-07-28) when it is "".
// It checks the negotiated version and that the layer is advertised.
func ConnectHTTP(t *testing.T, url, version string, hc *http.Client) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "http-test", Version: "v0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect (protocol %q): %v", version, err)
	}
	t.Cleanup(func() { cs.Close() })
	want := version
	if want == "" {
		want = mcphttp.StatelessVersion
	}
	ir := cs.InitializeResult()
	if ir.ProtocolVersion != want {
		t.Fatalf("negotiated protocol %s, want %s", ir.ProtocolVersion, want)
	}
	if stateful := cs.ID() != ""; stateful != (want < mcphttp.StatelessVersion) {
		t.Errorf("protocol %s: session id %q", want, cs.ID())
	}
	if ir.Capabilities == nil || ir.Capabilities.Experimental[outbox.CapabilityName] == nil {
		t.Errorf("protocol %s: capability experimental.%s not advertised: %+v", want, outbox.CapabilityName, ir.Capabilities)
	}
	return cs
}
