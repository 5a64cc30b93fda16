package dispatch_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// logBuffer collects JSON log records; deliveries log from their own
// goroutines, hence the lock.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns the records whose msg is msg, decoded.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
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
