package dispatch_test

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// logBuffer collects the JSON log records of a test (outboxtest.LogBuffer).
type logBuffer struct{ outboxtest.LogBuffer }

func (b *logBuffer) logger() *slog.Logger { return b.Logger() }

// records returns the records whose msg is msg, decoded.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	return b.Records(t, msg)
}

func sha12(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}

func TestEvents_Delivery(t *testing.T) {
	t.Parallel()
	for _, sensitive := range []bool{false, true} {
		s := newDispatchSetup(t, 1, nil)
		s.fake.FailNext(1, downstream.Status(503))
		logs := &logBuffer{}
		d := s.dispatcher(t, dispatch.Destination{}, &dispatch.Options{Logger: logs.logger(), LogSensitive: sensitive})
		round(t, d)
		s.clk.Add(time.Minute)
		round(t, d)

		key := effect(t, s.db.Read, 1).key
		events := logs.records(t, "delivery")
		want := []struct {
			result string
			status float64
		}{{"retry", 503}, {"delivered", 200}}
		if len(events) != len(want) {
			t.Fatalf("sensitive=%v: %d delivery events, want %d:\n%s", sensitive, len(events), len(want), logs)
		}
		for i, w := range want {
			e := events[i]
			if e["destination"] != "payments" || e["effect"] != 1.0 || e["attempt"] != float64(i+1) ||
				e["result"] != w.result || e["status"] != w.status || e["key_hash"] != sha12(key) {
				t.Errorf("sensitive=%v: delivery event %d = %v, want attempt %d, %s, status %v", sensitive, i, e, i+1, w.result, w.status)
			}
		}
		if events[0]["error"] != "HTTP 503" {
			t.Errorf("retry event's error = %v, want the recorded last error", events[0]["error"])
		}
		if leaked := strings.Contains(logs.String(), key); leaked != sensitive {
			t.Errorf("sensitive=%v: raw Idempotency-Key in the log = %v:\n%s", sensitive, leaked, logs)
		}
	}
}
