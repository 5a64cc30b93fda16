package mcphttp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
)

func TestLiftBody(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		changed  bool
		key      any // expected under _meta[paramskey.MetaKey]
	}{
		{"Call", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","idempotencyKey":"k"}}`, true, "k"},
		{"KeepsMeta", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"a":1},"idempotencyKey":"k"}}`, true, "k"},
		{"NonString", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","idempotencyKey":7}}`, true, float64(7)},
		{"NoKey", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`, false, nil},
		{"OtherMethod", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"idempotencyKey":"k"}}`, false, nil},
		{"Garbage", `{"jsonrpc":`, false, nil},
		{"Batch", `[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","idempotencyKey":"b"}}]`, true, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed := liftBody([]byte(tc.in))
			if changed != tc.changed {
				t.Fatalf("changed = %v, want %v (%s)", changed, tc.changed, out)
			}
			if !changed {
				if string(out) != tc.in {
					t.Errorf("unchanged body was rewritten: %s", out)
				}
				return
			}
			var msgs []map[string]json.RawMessage
			if strings.HasPrefix(tc.in, "[") {
				json.Unmarshal(out, &msgs)
			} else {
				var m map[string]json.RawMessage
				json.Unmarshal(out, &m)
				msgs = append(msgs, m)
			}
			var p struct {
				Meta map[string]any `json:"_meta"`
			}
			json.Unmarshal(msgs[len(msgs)-1]["params"], &p)
			if p.Meta[paramskey.MetaKey] != tc.key {
				t.Errorf("_meta = %v, want %s = %v", p.Meta, paramskey.MetaKey, tc.key)
			}
			if tc.name == "KeepsMeta" && p.Meta["a"] != float64(1) {
				t.Errorf("existing _meta lost: %v", p.Meta)
			}
		})
	}
}

func TestLiftParamsKey_TooLarge(t *testing.T) {
	reached := false
	h := LiftParamsKey(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	body := strings.NewReader(strings.Repeat(" ", mcp.DefaultMaxRequestBodyBytes+1))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mcp", body))
	if rec.Code != http.StatusRequestEntityTooLarge || reached {
		t.Errorf("status %d, reached %v; want 413 before the SDK", rec.Code, reached)
	}
}
