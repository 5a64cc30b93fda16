package operator

import (
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
)

// The page's delivery chart, drawn as inline SVG by the template, and how
// the page words times.

// ago says how long ago something happened, as a person would.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "in the future"
	case d < 2*time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

func tookText(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return "<1 ms"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return d.Round(100 * time.Millisecond).String()
}

// chartWindow is a span the delivery chart can show.
type chartWindow struct {
	Name    string
	Label   string
	Step    time.Duration
	Buckets int
	tick    int // a tick label every tick buckets
	format  string
}

var chartWindows = []chartWindow{
	{Name: "1h", Label: "last hour, per minute", Step: time.Minute, Buckets: 60, tick: 10, format: "15:04"},
	{Name: "24h", Label: "last 24 hours, per hour", Step: time.Hour, Buckets: 24, tick: 4, format: "15:04"},
}

// end is the end of the last bucket: the next whole step after now, so
// that buckets fall on whole minutes or hours and now is in the last one.
func (cw chartWindow) end(now time.Time) time.Time { return now.Truncate(cw.Step).Add(cw.Step) }

// chart is the geometry of the delivery chart, drawn as inline SVG by the
// template: bars of deliveries with failures stacked on top.
type chart struct {
	Window          chartWindow
	Windows         []chartWindow
	Width, Height   int
	Left, Top       int // the plot area's top left corner
	PlotW, PlotH    int
	Bottom          int // y of the baseline
	Right, Middle   float64
	LabelX, TickY   float64
	TopLabelY       float64
	BottomLabelY    float64
	Max             int // the tallest bar: deliveries and failures of one bucket
	Bars            []chartBar
	Ticks           []chartTick
	Delivered, Fail int
}

type chartBar struct {
	X, W                     float64
	DeliveredY, DeliveredH   float64
	FailedY, FailedH         float64
	Label                    string
	Delivered, Failed, Empty bool
}

type chartTick struct {
	X     float64
	Label string
}

func newChart(cw chartWindow, buckets []opsquery.Bucket) chart {
	c := chart{Window: cw, Windows: chartWindows, Width: 760, Height: 170, Left: 40, Top: 10, PlotW: 710, PlotH: 130}
	c.Bottom = c.Top + c.PlotH
	c.Right, c.Middle = float64(c.Left+c.PlotW), float64(c.Top)+float64(c.PlotH)/2
	c.LabelX, c.TopLabelY, c.BottomLabelY = float64(c.Left)-6, float64(c.Top)+4, float64(c.Bottom)+4
	c.TickY = float64(c.Bottom) + 18
	for _, b := range buckets {
		c.Max = max(c.Max, b.Delivered+b.Failed)
		c.Delivered += b.Delivered
		c.Fail += b.Failed
	}
	scaleMax := max(c.Max, 1)
	slot := float64(c.PlotW) / float64(len(buckets))
	for i, b := range buckets {
		x := float64(c.Left) + float64(i)*slot
		dh := float64(b.Delivered) / float64(scaleMax) * float64(c.PlotH)
		fh := float64(b.Failed) / float64(scaleMax) * float64(c.PlotH)
		bar := chartBar{X: x + slot*0.12, W: slot * 0.76, DeliveredH: dh, FailedH: fh,
			DeliveredY: float64(c.Bottom) - dh, FailedY: float64(c.Bottom) - dh - fh,
			Delivered: b.Delivered > 0, Failed: b.Failed > 0,
			Label: fmt.Sprintf("%s: %d delivered, %d failed", b.Start.Format("2006-01-02 15:04")+" UTC", b.Delivered, b.Failed)}
		c.Bars = append(c.Bars, bar)
		if i%cw.tick == 0 {
			c.Ticks = append(c.Ticks, chartTick{X: x, Label: b.Start.Format(cw.format)})
		}
	}
	return c
}
