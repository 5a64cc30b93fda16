package operator

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// NewMetrics returns the handler of GET /metrics (for Options.Metrics) and
// the outbox's metrics to record into (for outbox.Options and
// outbox.DispatcherOptions). It serves a registry of its own rather than
// the global one, so nothing a dependency registers leaks into the scrape:
// the Go runtime's and the process's metrics, the outbox's, and the outbox
// depth read from db at each scrape.
func NewMetrics(db *schema.DB) (http.Handler, *outbox.Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		outbox.NewDepthCollector(db),
	)
	m := outbox.NewMetrics(reg)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), m
}
