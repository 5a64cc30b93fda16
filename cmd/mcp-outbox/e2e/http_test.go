package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestHTTPBothProtocolModes: a stateful (2025-11-25) and a stateless
// (2026-07-28) client both work, and a keyed call made on one connection is
// replayed on a new connection and in the other mode.
func TestHTTPBothProtocolModes(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	url, _ := startHTTP(t, bin, dbPath, nil)
	hc := httpClient(t, "")

	stateful := connectHTTP(t, url, statefulVersion, hc)
	stateless := connectHTTP(t, url, "", hc)
	wantTools(t, stateful)
	wantTools(t, stateless)

	first := mustSucceed(t, stateful, chargeCall("http-a", 1000))
	m := wantReplay(t, first, false, "meta")
	chargeA := structuredChargeID(t, first)
	stateful.Close()

	// A reconnect gets a new session id and new JSON-RPC ids; the key alone
	// must find the call.
	again := connectHTTP(t, url, statefulVersion, hc)
	for _, cs := range []*mcp.ClientSession{again, stateless} {
		res := mustSucceed(t, cs, chargeCall("http-a", 1000))
		rm := wantReplay(t, res, true, "meta")
		if rm["callId"] != m["callId"] || structuredChargeID(t, res) != chargeA {
			t.Errorf("replay %v charge %d, want call %v charge %d", rm, structuredChargeID(t, res), m["callId"], chargeA)
		}
	}

	// The other direction: made stateless, replayed stateful.
	second := mustSucceed(t, stateless, chargeCall("http-b", 2000))
	wantReplay(t, second, false, "meta")
	replayB := mustSucceed(t, again, chargeCall("http-b", 2000))
	wantReplay(t, replayB, true, "meta")
	if structuredChargeID(t, replayB) != structuredChargeID(t, second) {
		t.Errorf("stateful replay answered another charge than the stateless call")
	}

	// Without a key, the fingerprint spans modes too (same local principal).
	third := mustSucceed(t, stateless, chargeCall("", 3000))
	wantReplay(t, third, false, "fingerprint")
	wantReplay(t, mustSucceed(t, again, chargeCall("", 3000)), true, "fingerprint")

	db := openLedgerDB(t, dbPath)
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 3 {
		t.Errorf("charges has %d rows, want 3", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'completed'`); n != 3 {
		t.Errorf("%d completed calls, want 3", n)
	}
}

// TestHTTPIdempotencyKeyHeader: the IETF Idempotency-Key header names the
// call in both modes; a _meta key, when both are sent, wins.
func TestHTTPIdempotencyKeyHeader(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	url, _ := startHTTP(t, bin, dbPath, nil)
	withHeader := httpClient(t, "hdr-1")

	stateful := connectHTTP(t, url, statefulVersion, withHeader)
	first := mustSucceed(t, stateful, chargeCall("", 500))
	m := wantReplay(t, first, false, "header")
	if m["key"] != "hdr-1" {
		t.Errorf("key = %v, want the header's hdr-1", m["key"])
	}

	stateless := connectHTTP(t, url, "", withHeader)
	replay := mustSucceed(t, stateless, chargeCall("", 500))
	rm := wantReplay(t, replay, true, "header")
	if rm["callId"] != m["callId"] || structuredChargeID(t, replay) != structuredChargeID(t, first) {
		t.Errorf("header replay %v, want call %v", rm, m["callId"])
	}

	// Same header, other arguments: the key already names another call.
	conflict, err := stateless.CallTool(context.Background(), chargeCall("", 501))
	if err != nil || !conflict.IsError || !strings.Contains(resultText(conflict), "hdr-1") {
		t.Errorf("same header key with other arguments = %v, %v; want a tool error naming the key", conflict, err)
	}

	both := mustSucceed(t, stateless, chargeCall("meta-over-header", 600))
	if bm := wantReplay(t, both, false, "meta"); bm["key"] != "meta-over-header" {
		t.Errorf("with both a _meta key and a header, key = %v, want the _meta key", bm["key"])
	}

	db := openLedgerDB(t, dbPath)
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 2 {
		t.Errorf("charges has %d rows, want 2", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE key = 'hdr-1' AND key_source = 'header'`); n != 1 {
		t.Errorf("%d calls recorded under the header key, want 1", n)
	}
}

// rawSession speaks JSON-RPC over Streamable HTTP by hand, as a client the
// go-sdk does not model would: the only way to send a top-level
// params.idempotencyKey (SEP-3182).
type rawSession struct {
	t         *testing.T
	url       string
	hc        *http.Client
	sessionID string
}

// post sends one message and returns the HTTP response and, for a request,
// the JSON-RPC response with its id, from a JSON or an SSE body.
func (s *rawSession) post(msg map[string]any) (*http.Response, map[string]any) {
	s.t.Helper()
	body, err := json.Marshal(msg)
	if err != nil {
		s.t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if s.sessionID != "" {
		req.Header.Set("Mcp-Session-Id", s.sessionID)
		req.Header.Set("Mcp-Protocol-Version", statefulVersion)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		s.t.Fatalf("POST %v: %v", msg["method"], err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("read response to %v: %v", msg["method"], err)
	}
	id, isRequest := msg["id"]
	if !isRequest {
		return resp, nil
	}
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("POST %v: %s: %s", msg["method"], resp.Status, data)
	}
	var candidates [][]byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		candidates = sseData(data)
	} else {
		candidates = [][]byte{data}
	}
	for _, c := range candidates {
		var m map[string]any
		if json.Unmarshal(c, &m) == nil && fmt.Sprint(m["id"]) == fmt.Sprint(id) {
			return resp, m
		}
	}
	s.t.Fatalf("POST %v: no response with id %v in %s body %q", msg["method"], id, resp.Header.Get("Content-Type"), data)
	return nil, nil
}

// sseData returns the data of each event of an SSE body.
func sseData(body []byte) [][]byte {
	var events [][]byte
	var cur []byte
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	flush := func() {
		if cur != nil {
			events = append(events, cur)
			cur = nil
		}
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "data:"):
			if cur != nil {
				cur = append(cur, '\n')
			}
			cur = append(cur, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")...)
		}
	}
	flush()
	return events
}

// TestHTTPParamsKeyRaw: a top-level params.idempotencyKey, which the go-sdk
// would drop, names the call over HTTP; and the server advertises the layer
// in its initialize result.
func TestHTTPParamsKeyRaw(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	url, _ := startHTTP(t, bin, dbPath, nil)
	s := &rawSession{t: t, url: url, hc: httpClient(t, "")}

	resp, init := s.post(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
		"protocolVersion": statefulVersion,
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": "raw", "version": "v0"},
	}})
	s.sessionID = resp.Header.Get("Mcp-Session-Id")
	if s.sessionID == "" {
		t.Fatal("initialize returned no Mcp-Session-Id")
	}
	result, _ := init["result"].(map[string]any)
	caps, _ := result["capabilities"].(map[string]any)
	exp, _ := caps["experimental"].(map[string]any)
	idem, _ := exp[outbox.CapabilityName].(map[string]any)
	if idem == nil || idem["statusTool"] != outbox.StatusToolName {
		t.Fatalf("initialize result does not advertise experimental.%s: %v", outbox.CapabilityName, init)
	}
	if sources, _ := idem["keySources"].([]any); !slices.Contains(sources, any("params.idempotencyKey")) {
		t.Errorf("advertised key sources %v lack params.idempotencyKey", idem["keySources"])
	}

	if resp, _ := s.post(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"}); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %s, want 202", resp.Status)
	}

	call := func(id int) map[string]any {
		_, r := s.post(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": map[string]any{
			"name":           "charge",
			"arguments":      map[string]any{"amount": 333},
			"idempotencyKey": "raw-params-1",
		}})
		res, _ := r["result"].(map[string]any)
		if res == nil || res["isError"] == true {
			t.Fatalf("tools/call: %v", r)
		}
		meta, _ := res["_meta"].(map[string]any)
		cm, _ := meta[outbox.MetaKeyCall].(map[string]any)
		if cm == nil || cm["key"] != "raw-params-1" || cm["keySource"] != "params" {
			t.Fatalf("tools/call: call meta %v, want key raw-params-1 from params", cm)
		}
		return cm
	}
	first := call(2)
	if first["replayed"] != false {
		t.Errorf("first call replayed: %v", first)
	}
	second := call(3)
	if second["replayed"] != true || second["callId"] != first["callId"] {
		t.Errorf("second call meta %v, want a replay of %v", second, first["callId"])
	}

	// The same key reaches the same call from an SDK client in _meta.
	cs := connectHTTP(t, url, "", s.hc)
	viaMeta := mustSucceed(t, cs, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 333},
		Meta: mcp.Meta{outbox.MetaKeyIdempotency: "raw-params-1"}})
	if m := wantReplay(t, viaMeta, true, "meta"); m["callId"] != first["callId"] {
		t.Errorf("_meta replay of the params key: %v, want call %v", m, first["callId"])
	}

	db := openLedgerDB(t, dbPath)
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges has %d rows, want 1", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE key_source = 'params'`); n != 1 {
		t.Errorf("%d calls recorded with key source params, want 1", n)
	}
}
