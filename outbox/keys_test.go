package outbox_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

// httpServer serves the bundle's server over Streamable HTTP with bearer
// tokens "alice" and "bob" mapped to users of those names.
func httpServer(t *testing.T, s *mcp.Server) string {
	t.Helper()
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token != "alice" && token != "bob" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(mcphttp.LiftParamsKey(auth.RequireBearerToken(verify, nil)(h)))
	t.Cleanup(srv.Close)
	return srv.URL
}

// headerTransport adds headers to every request.
type headerTransport struct {
	header http.Header
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.header {
		r.Header[k] = v
	}
	return http.DefaultTransport.RoundTrip(r)
}

func connectHTTP(t *testing.T, url string, header http.Header) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: headerTransport{header}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "v0"}, nil).Connect(context.Background(), tr,
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func TestKeys_PrincipalsAreIsolated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	url := httpServer(t, b.server)
	alice := connectHTTP(t, url, http.Header{"Authorization": {"Bearer alice"}})
	bob := connectHTTP(t, url, http.Header{"Authorization": {"Bearer bob"}})

	a := callCharge(t, alice, "shared-key", 100)
	bres := callCharge(t, bob, "shared-key", 100)
	if callMeta(bres)["replayed"] != false || chargeID(t, a) == chargeID(t, bres) {
		t.Fatalf("bob's call replayed alice's: %v", bres.Meta)
	}
	if got := charges(t, b); got != 2 {
		t.Fatalf("charges = %d, want one per principal", got)
	}
	// Different arguments under the same key are not a conflict across principals.
	if res := callCharge(t, bob, "other", 5); res.IsError {
		t.Fatal(text(res))
	}
	st := call(t, alice, outbox.StatusToolName, "", map[string]any{"key": "other"})
	if !strings.Contains(text(st), `"state":"not_found"`) {
		t.Errorf("alice sees bob's call: %s", text(st))
	}
	st = call(t, bob, outbox.StatusToolName, "", map[string]any{"key": "other"})
	if !strings.Contains(text(st), `"state":"completed"`) {
		t.Errorf("bob does not see his call: %s", text(st))
	}
}

func TestKeys_Header(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	url := httpServer(t, b.server)
	for _, v := range []string{`"hdr-1"`, `hdr-1`} { // the draft's sf-string and the bare form
		cs := connectHTTP(t, url, http.Header{"Authorization": {"Bearer alice"}, "Idempotency-Key": {v}})
		res := callCharge(t, cs, "", 100)
		if callMeta(res)["keySource"] != "header" || callMeta(res)["key"] != "hdr-1" {
			t.Fatalf("Idempotency-Key %s: meta = %v", v, res.Meta)
		}
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	// _meta wins over the header.
	cs := connectHTTP(t, url, http.Header{"Authorization": {"Bearer alice"}, "Idempotency-Key": {"hdr-1"}})
	if res := callCharge(t, cs, "meta-1", 100); callMeta(res)["keySource"] != "meta" {
		t.Errorf("with both: keySource = %v, want meta", callMeta(res)["keySource"])
	}
}

// rawSession speaks JSON-RPC lines to a server over pipes, as a stdio
// client does (outboxtest.RawSession), so tests can send what the Go
// client cannot.
type rawSession struct{ *outboxtest.RawSession }

func rawConnect(t *testing.T, s *mcp.Server) *rawSession {
	t.Helper()
	return &rawSession{outboxtest.RawConnect(t, s)}
}

func (rs *rawSession) send(line string) { rs.Send(line) }

func (rs *rawSession) read() map[string]any { return rs.Read() }

func TestKeys_TopLevelParamsKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	rs := rawConnect(t, b.server)
	req := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"charge","arguments":{"amount":9},"idempotencyKey":"sep-3182"}}`
	var metas []map[string]any
	for i := 1; i <= 2; i++ {
		rs.send(strings.Replace(req, "%d", string(rune('0'+i)), 1))
		res := rs.read()
		result, _ := res["result"].(map[string]any)
		meta, _ := result["_meta"].(map[string]any)
		m, _ := meta[outbox.MetaKeyCall].(map[string]any)
		metas = append(metas, m)
	}
	if metas[0]["keySource"] != "params" || metas[0]["key"] != "sep-3182" {
		t.Fatalf("first call meta = %v, want key from params", metas[0])
	}
	if metas[1]["replayed"] != true {
		t.Errorf("second call meta = %v, want replayed", metas[1])
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}

	// The same over HTTP, through mcphttp.LiftParamsKey.
	url := httpServer(t, b.server)
	cs := connectHTTP(t, url, http.Header{"Authorization": {"Bearer alice"}})
	_ = cs // a session exists; the raw request below opens its own
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`
	sid := postRaw(t, url, "", body)
	postRaw(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	postRaw(t, url, sid, strings.Replace(req, "%d", "2", 1))
	if got := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = 'sep-3182' AND key_source = 'params' AND principal = 'user:alice'`); got != 1 {
		t.Errorf("HTTP call with params.idempotencyKey not recorded under that key")
	}
}

// postRaw posts one JSON-RPC message and returns the session id.
func postRaw(t *testing.T, url, sid, body string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("POST %s: %s", body, resp.Status)
	}
	if s := resp.Header.Get("Mcp-Session-Id"); s != "" {
		return s
	}
	return sid
}

func TestKeys_ArgumentKey(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, _ := outbox.New(db, nil)
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	type in struct {
		Amount         int    `json:"amount"`
		IdempotencyKey string `json:"idempotency_key,omitempty"`
	}
	outbox.AddTool(l, s, &mcp.Tool{Name: "pay"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, struct{}, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, in.Amount)
		return nil, struct{}{}, err
	}, nil)
	cs := connect(t, s)
	r1 := call(t, cs, "pay", "", map[string]any{"amount": 3, "idempotency_key": "arg-1"})
	r2 := call(t, cs, "pay", "", map[string]any{"amount": 3, "idempotency_key": "arg-1"})
	if callMeta(r1)["keySource"] != "argument" || callMeta(r2)["replayed"] != true {
		t.Fatalf("argument key: %v / %v", r1.Meta, r2.Meta)
	}
	if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// clock is an injectable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestKeys_FingerprintWindow(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now, FingerprintWindow: time.Minute}, nil)
	callCharge(t, b.session, "", 100)
	clk.Add(59 * time.Second)
	if res := callCharge(t, b.session, "", 100); callMeta(res)["replayed"] != true {
		t.Fatalf("within the window: %v", res.Meta)
	}
	clk.Add(2 * time.Second) // the window counts from the completion
	if res := callCharge(t, b.session, "", 100); callMeta(res)["replayed"] != false {
		t.Fatalf("after the window: %v", res.Meta)
	}
	if got := charges(t, b); got != 2 {
		t.Errorf("charges = %d, want 2", got)
	}

	off := setup(t, &outbox.Options{FingerprintWindow: outbox.FingerprintOff}, nil)
	callCharge(t, off.session, "", 100)
	callCharge(t, off.session, "", 100)
	if got := charges(t, off); got != 2 {
		t.Errorf("fingerprints off: charges = %d, want 2 (no dedup without a key)", got)
	}
	if got := count(t, off.db.Read, `SELECT count(*) FROM calls`); got != 0 {
		t.Errorf("fingerprints off: %d calls recorded", got)
	}
	// Per-tool override.
	db := openDB(t)
	l, _ := outbox.New(db, nil)
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	outbox.AddTool(l, s, ledger.ChargeTool, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in ledger.ChargeIn) (*mcp.CallToolResult, struct{}, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, in.Amount)
		return nil, struct{}{}, err
	}, &outbox.ToolOptions{FingerprintWindow: outbox.FingerprintOff})
	cs := connect(t, s)
	callCharge(t, cs, "", 1)
	callCharge(t, cs, "", 1)
	if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 2 {
		t.Errorf("per-tool fingerprints off: charges = %d, want 2", got)
	}
}

func TestKeys_RetentionExpiry(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now, KeyRetention: time.Hour}, nil)
	first := callCharge(t, b.session, "k", 100)
	clk.Add(time.Hour + time.Second)
	st := call(t, b.session, outbox.StatusToolName, "", map[string]any{"key": "k"})
	if !strings.Contains(text(st), `"state":"not_found"`) || !strings.Contains(text(st), "expired") {
		t.Fatalf("status after retention: %s", text(st))
	}
	second := callCharge(t, b.session, "k", 100)
	if callMeta(second)["replayed"] != false || callMeta(second)["callId"] == callMeta(first)["callId"] {
		t.Fatalf("key reused after retention: %v", second.Meta)
	}
	// The new call's effect must not reuse the old call's Idempotency-Key.
	if got := count(t, b.db.Read, `SELECT count(DISTINCT idempotency_key) FROM effects`); got != 2 {
		t.Errorf("distinct effect keys = %d, want 2", got)
	}
}
