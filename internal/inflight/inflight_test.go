package inflight

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// records sends each log record's "refused" count to a channel.
type records chan int64

func (r records) Enabled(context.Context, slog.Level) bool { return true }
func (r records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r records) WithGroup(string) slog.Handler            { return r }
func (r records) Handle(_ context.Context, rec slog.Record) error {
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "refused" {
			r <- a.Value.Int64()
		}
		return true
	})
	return nil
}

// TestRefusalLogCounts: a flood of refusals makes one line at once and
// then lines with the count since, at most one per period, not a line per
// refusal; none of the refusals goes uncounted.
func TestRefusalLogCounts(t *testing.T) {
	got := make(records, 1000)
	logger := slog.New(got)
	l := refusalLog{every: 200 * time.Millisecond}
	for range 500 {
		l.refused(logger, "too many")
	}
	if n := <-got; n != 1 {
		t.Fatalf("first line counts %d refusals, want 1", n)
	}
	total, lines := int64(1), 1
	for total < 500 {
		select {
		case n := <-got:
			total += n
			lines++
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 500 refusals logged", total)
		}
	}
	if total != 500 || lines > 3 {
		t.Errorf("%d lines counting %d refusals; want at most 3 counting 500", lines, total)
	}
}
