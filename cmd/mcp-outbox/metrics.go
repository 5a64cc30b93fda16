package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// metricsHandler serves GET /metrics from a registry of its own rather than
// the global one, so nothing a dependency registers leaks into the scrape.
// The returned Metrics go into outbox.Options and outbox.DispatcherOptions;
// the outbox depth is read from db at each scrape.
func metricsHandler(db *schema.DB) (http.Handler, *outbox.Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		outbox.NewDepthCollector(db),
	)
	m := outbox.NewMetrics(reg)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), m
}
