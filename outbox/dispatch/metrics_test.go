package dispatch_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
)

// histogram returns the sample count and sum of the histogram series of
// name whose labels include want; it fails the test if there is none.
func histogram(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (uint64, float64) {
	t.Helper()
	return outboxtest.Histogram(t, g, name, want)
}

func expectMetrics(t *testing.T, reg prometheus.Gatherer, want string, names ...string) {
	t.Helper()
	outboxtest.ExpectMetrics(t, reg, want, names...)
}

func TestMetrics_Delivery(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := outbox.NewMetrics(reg)
	s := newDispatchSetup(t, 2, nil)
	depth := prometheus.NewPedanticRegistry()
	depth.MustRegister(metrics.NewDepthCollector(s.db))
	s.fake.FailNext(1, downstream.Status(http.StatusServiceUnavailable))
	d := s.dispatcher(t, dispatch.Destination{}, &dispatch.Options{Metrics: m, BackoffBase: time.Second})

	round(t, d) // one 503, one delivered
	expectMetrics(t, depth, `
# HELP mcp_outbox_effects Effects in the database by state and destination.
# TYPE mcp_outbox_effects gauge
mcp_outbox_effects{destination="payments",state="cancelled"} 0
mcp_outbox_effects{destination="payments",state="dead"} 0
mcp_outbox_effects{destination="payments",state="delivered"} 1
mcp_outbox_effects{destination="payments",state="in_flight"} 0
mcp_outbox_effects{destination="payments",state="pending"} 1
mcp_outbox_effects{destination="payments",state="unknown"} 0
`, "mcp_outbox_effects")

	s.clk.Add(time.Second) // the retry is due after 750ms
	round(t, d)

	expectMetrics(t, reg, `
# HELP mcp_outbox_deliveries_total Recorded delivery attempt outcomes, by destination and result (delivered, retry, dead, unknown).
# TYPE mcp_outbox_deliveries_total counter
mcp_outbox_deliveries_total{destination="payments",result="delivered"} 2
mcp_outbox_deliveries_total{destination="payments",result="retry"} 1
`, "mcp_outbox_deliveries_total")
	expectMetrics(t, depth, `
# HELP mcp_outbox_effects Effects in the database by state and destination.
# TYPE mcp_outbox_effects gauge
mcp_outbox_effects{destination="payments",state="cancelled"} 0
mcp_outbox_effects{destination="payments",state="dead"} 0
mcp_outbox_effects{destination="payments",state="delivered"} 2
mcp_outbox_effects{destination="payments",state="in_flight"} 0
mcp_outbox_effects{destination="payments",state="pending"} 0
mcp_outbox_effects{destination="payments",state="unknown"} 0
# HELP mcp_outbox_oldest_pending_age_seconds Age of the oldest effect of a destination that is pending or in flight; 0 when none is.
# TYPE mcp_outbox_oldest_pending_age_seconds gauge
mcp_outbox_oldest_pending_age_seconds{destination="payments"} 0
`, "mcp_outbox_effects", "mcp_outbox_oldest_pending_age_seconds")

	dest := map[string]string{"destination": "payments"}
	if n, _ := histogram(t, reg, "mcp_outbox_delivery_duration_seconds", dest); n != 3 {
		t.Errorf("delivery_duration_seconds count = %d, want 3 attempts", n)
	}
	// Delivered at the first attempt and at the second.
	if n, sum := histogram(t, reg, "mcp_outbox_delivery_attempts", dest); n != 2 || sum != 3 {
		t.Errorf("delivery_attempts count, sum = %d, %v, want 2, 3", n, sum)
	}
	// Outcomes finishing together may share a commit; all three are written.
	if n, sum := histogram(t, reg, "mcp_outbox_commit_batch_size", map[string]string{"kind": "deliveries"}); n < 2 || sum != 3 {
		t.Errorf("commit_batch_size{kind=deliveries} count, sum = %d, %v, want 2 or 3, 3", n, sum)
	}
}
