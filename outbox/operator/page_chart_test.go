package operator

import (
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
)

// TestNewChart draws the buckets of cmd/mcp-outbox's
// TestPageDeliveryHistory: the tallest bar fills the plot, an empty bucket
// draws none.
func TestNewChart(t *testing.T) {
	t.Parallel()
	cw := chartWindows[0]
	end := cw.end(time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC))
	buckets := make([]opsquery.Bucket, cw.Buckets)
	for i := range buckets {
		buckets[i].Start = end.Add(time.Duration(i-cw.Buckets) * cw.Step)
	}
	buckets[0].Failed = 1
	buckets[58].Delivered = 1
	buckets[59].Delivered, buckets[59].Failed = 1, 1
	c := newChart(cw, buckets)
	if c.Max != 2 || c.Delivered != 2 || c.Fail != 2 || len(c.Bars) != 60 || len(c.Ticks) != 6 {
		t.Errorf("chart: max %d, %d delivered, %d failed, %d bars, %d ticks", c.Max, c.Delivered, c.Fail, len(c.Bars), len(c.Ticks))
	}
	if top := c.Bars[59]; top.DeliveredH+top.FailedH != float64(c.PlotH) || top.FailedY != float64(c.Top) {
		t.Errorf("the tallest bar %+v does not fill the plot (%d high from %d)", top, c.PlotH, c.Top)
	}
	if empty := c.Bars[30]; empty.Delivered || empty.Failed {
		t.Errorf("an empty bucket draws a bar: %+v", empty)
	}
}
