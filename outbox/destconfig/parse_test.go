package destconfig

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	vars := map[string]string{
		"MCP_OUTBOX_DEST_MY_API":              "http://127.0.0.1:9/base",
		"MCP_OUTBOX_DEST_MY_API_AUTH":         "Bearer sk_test",
		"MCP_OUTBOX_DEST_MY_API_AT_MOST_ONCE": "true",
		"MCP_OUTBOX_DEST_MY_API_PROBE":        "GET /v1/idempotency/{key}",
		"MCP_OUTBOX_DEST_MY_API_TIMEOUT":      "3s",
		"MCP_OUTBOX_DEST_PAYMENTS":            "http://127.0.0.1:8;concurrency=2",
	}
	dests, err := Parse(environ(vars), []string{"payments=http://127.0.0.1:7;timeout=1s;max_attempts=3"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dests) != 2 {
		t.Fatalf("destinations = %+v", dests)
	}
	api, pay := dests[0], dests[1]
	if api.Name != "my_api" || api.URL.String() != "http://127.0.0.1:9/base" || !api.AtMostOnce ||
		api.AuthHeader != "Authorization" || api.AuthValue != "Bearer sk_test" || api.Timeout != 3*time.Second ||
		api.Probe == nil || api.Probe.Method != "GET" || api.Probe.Path != "/v1/idempotency/{key}" {
		t.Errorf("my_api = %+v", api)
	}
	// The flag's URL and settings win; the environment's other settings stay.
	if pay.Name != "payments" || pay.URL.Host != "127.0.0.1:7" || pay.Concurrency != 2 || pay.Timeout != time.Second ||
		pay.MaxAttempts != 3 || pay.AuthHeader != "" {
		t.Errorf("payments = %+v", pay)
	}
}

// environ is vars as os.Environ gives them, in no particular order.
func environ(vars map[string]string) []string {
	var out []string
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}
