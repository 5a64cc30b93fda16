package operator

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// The scrape carries the runtime's metrics, the outbox's counters from the
// registry the layer records into, and the outbox depth as the database
// holds it; it is guarded by the admin rule.
func TestMetricsHandler(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	insertEffect(t, db, "payments", "dead")
	reg := prometheus.NewRegistry()
	if outbox.NewMetrics(reg) == nil {
		t.Fatal("no outbox metrics")
	}
	mine := prometheus.NewCounter(prometheus.CounterOpts{Name: "app_things_total", Help: "A metric of the application's."})
	reg.MustRegister(mine)
	mine.Inc()
	h := NewMetricsHandler(db, &Options{Registry: reg})
	// A second handler on the same registry keeps the collectors it finds.
	NewMetricsHandler(db, &Options{Registry: reg})
	body := get(t, h, "/anywhere/metrics")
	for _, want := range []string{
		"go_goroutines ",
		"app_things_total 1",
		`mcp_outbox_effects{destination="payments",state="dead"} 1`,
		`mcp_outbox_effects{destination="payments",state="pending"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}

	remote := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	remote.RemoteAddr = "192.0.2.7:40000"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, remote)
	if rec.Code != http.StatusForbidden {
		t.Errorf("GET /metrics from another host without an admin token: %d, want 403", rec.Code)
	}
}

// A dispatcher with no destinations knows none: every pending effect is
// for a destination it does not deliver to.
func TestMetricsUnconfiguredNoDestinations(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	d, err := dispatch.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Destinations(); got == nil || len(got) != 0 {
		t.Fatalf("Destinations() = %#v, want empty and not nil", got)
	}
	insertEffect(t, db, "mailer", "pending")
	body := get(t, NewMetricsHandler(db, &Options{Dispatcher: d}), "/metrics")
	if !strings.Contains(body, `mcp_outbox_effects_unconfigured{destination="mailer"} 1`) {
		t.Errorf("scrape lacks the unconfigured mailer:\n%s", grepLines(body, "unconfigured"))
	}
}
