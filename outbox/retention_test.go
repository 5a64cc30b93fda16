package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// settle puts the effects of the call with key into state, as of at: the
// dispatcher or an operator would have written delivered_at for delivered
// and updated_at for every change.
func settle(t *testing.T, db *schema.DB, key, state string, at time.Time) {
	t.Helper()
	_, err := db.Write.Exec(`
UPDATE effects SET state = $1, updated_at = $2, delivered_at = CASE WHEN $1 = 'delivered' THEN CAST($2 AS BIGINT) END
WHERE call_id = (SELECT id FROM calls WHERE key = $3)`, state, at.UnixMilli(), key)
	if err != nil {
		t.Fatal(err)
	}
}

func keysOf(t *testing.T, db *schema.DB, q string) string {
	t.Helper()
	return fmt.Sprint(outboxtest.Strings(t, db.Read, q))
}

// logRecords is a slog handler that hands each record to a test.
type logRecords chan slog.Record

func (h logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h logRecords) Handle(_ context.Context, r slog.Record) error {
	h <- r.Clone()
	return nil
}
func (h logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logRecords) WithGroup(string) slog.Handler      { return h }

func TestRunReaper_PurgesAtOnceAndStopsWithContext(t *testing.T) {
	t.Parallel()
	// The calls are made eight days ago by the layer's clock, so that the
	// reaper, on the real clock, finds them expired. The clock goes back
	// after the layer started: on PostgreSQL a layer takes the server's
	// time when it starts, and then follows its clock.
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now}, nil)
	clk.Add(-8 * 24 * time.Hour)
	callCharge(t, b.session, "reaped", 100)
	settle(t, b.db, "reaped", "delivered", clk.Now())

	logs := make(logRecords, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- outbox.RunReaper(ctx, b.db, outbox.Retention{}, time.Hour, slog.New(logs)) }()
	r := <-logs
	if r.Message != "purged expired records" {
		t.Errorf("first reaper log: %q, want the purge", r.Message)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls`) + count(t, b.db.Read, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d rows left after the reaper's first pass", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("reaper returned %v", err)
	}
}
