package outbox_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// logBuffer collects the JSON log records of a test (outboxtest.LogBuffer).
type logBuffer struct{ outboxtest.LogBuffer }

func (b *logBuffer) logger() *slog.Logger { return b.Logger() }

// records returns the records whose msg is msg, decoded.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	return b.Records(t, msg)
}

// scrubbed is the log with the fields that vary from run to run removed:
// a timestamp or a duration could contain "4242" by chance.
func (b *logBuffer) scrubbed(t *testing.T) string {
	t.Helper()
	var s strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		delete(r, slog.TimeKey)
		delete(r, "duration_ms")
		enc, _ := json.Marshal(r)
		s.Write(enc)
		s.WriteByte('\n')
	}
	return s.String()
}

func sha12(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}

const secretKey = "secret-key-123"

// runScript makes a charge, its replay, a conflicting reuse of its key and a
// read-only call, and returns the layer's log.
func runScript(t *testing.T, sensitive bool) *logBuffer {
	t.Helper()
	logs := &logBuffer{}
	b := setup(t, &outbox.Options{Logger: logs.logger(), LogSensitive: sensitive}, nil)
	if res := callCharge(t, b.session, secretKey, 4242); res.IsError {
		t.Fatal(text(res))
	}
	if res := callCharge(t, b.session, secretKey, 4242); res.IsError {
		t.Fatal(text(res))
	}
	if res := callCharge(t, b.session, secretKey, 17); !res.IsError {
		t.Fatal("reusing the key with other arguments did not conflict")
	}
	if res := call(t, b.session, "balance", "", map[string]any{}); res.IsError {
		t.Fatal(text(res))
	}
	return logs
}

func TestEvents_Calls(t *testing.T) {
	t.Parallel()
	logs := runScript(t, false)
	calls := logs.records(t, "call")
	want := []struct{ tool, outcome string }{
		{"charge", "executed"}, {"charge", "replayed"}, {"charge", "conflict"}, {"balance", "executed"},
	}
	if len(calls) != len(want) {
		t.Fatalf("%d call events, want %d:\n%s", len(calls), len(want), logs)
	}
	for i, w := range want {
		c := calls[i]
		if c["tool"] != w.tool || c["outcome"] != w.outcome || c["level"] != "INFO" || c["principal"] != "local" {
			t.Errorf("call event %d = %v, want tool %s, outcome %s, level INFO, principal local", i, c, w.tool, w.outcome)
		}
		if _, ok := c["duration_ms"].(float64); !ok {
			t.Errorf("call event %d has no duration_ms: %v", i, c)
		}
		ann, _ := c["annotations"].(map[string]any)
		readOnly := w.tool == "balance"
		if ann["read_only"] != readOnly || ann["destructive"] != !readOnly || ann["idempotent"] != false {
			t.Errorf("call event %d annotations = %v", i, ann)
		}
	}
	for i, c := range calls[:3] {
		if c["key"] != sha12("local\x00"+secretKey) || c["key_source"] != "meta" {
			t.Errorf("call event %d: key %v from %v, want the hash prefix of the scoped key from meta", i, c["key"], c["key_source"])
		}
	}
	if out := logs.scrubbed(t); strings.Contains(out, secretKey) || strings.Contains(out, "4242") {
		t.Errorf("the log leaks the key or the arguments:\n%s", out)
	}
}

func TestEvents_CallsSensitive(t *testing.T) {
	t.Parallel()
	logs := runScript(t, true)
	first := logs.records(t, "call")[0]
	if first["raw_key"] != secretKey || !strings.Contains(first["arguments"].(string), "4242") {
		t.Errorf("with LogSensitive the first call event is %v, want its raw key and arguments", first)
	}
}
