package operator

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// NewMetricsHandler returns the Prometheus scrape endpoint, answering at
// whatever path it is mounted (conventionally /metrics), under the admin
// rule (Options.AdminTokenSHA256): metrics name tools and destinations.
//
// It serves Options.Registry (a registry of its own when nil), into which
// it registers the Go runtime's and the process's collectors, the outbox
// depth (metrics.NewDepthCollector) read from db at each scrape, and
// mcp_outbox_effects_unconfigured: the pending effects per destination
// that Options.Dispatcher does not deliver to. Give Options.Registry the
// registry passed to outbox.NewMetrics to serve the layer's and the
// dispatcher's counters too:
//
//	reg := prometheus.NewRegistry()
//	m := outbox.NewMetrics(reg) // for outbox.Options and dispatch.Options
//	mux.Handle("GET /metrics", operator.NewMetricsHandler(db, &operator.Options{Registry: reg}))
//
// A collector the registry already holds is kept, not registered twice.
func NewMetricsHandler(db *schema.DB, opts *Options) http.Handler {
	o := mustOptions(opts)
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewDepthCollector(db),
		newUnconfiguredCollector(db, o.Dispatcher),
	} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(err) // a collector of another kind under one of these names: a programming mistake
		}
	}
	// A scrape reads, whatever its method.
	return guardFor(newAdminAuth(o), func(*http.Request) access { return accessRead })(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
}

// unconfiguredCollector reports mcp_outbox_effects_unconfigured.
type unconfiguredCollector struct {
	db         *schema.DB
	dispatcher Dispatcher
	desc       *prometheus.Desc
}

func newUnconfiguredCollector(db *schema.DB, d Dispatcher) *unconfiguredCollector {
	return &unconfiguredCollector{db: db, dispatcher: d, desc: prometheus.NewDesc("mcp_outbox_effects_unconfigured",
		"Pending effects for a destination this process's dispatcher does not deliver to: they wait until a process that knows it runs.",
		[]string{"destination"}, nil)}
}

func (c *unconfiguredCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *unconfiguredCollector) Collect(ch chan<- prometheus.Metric) {
	// A scrape must not hang on a locked or slow database.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := findUnconfigured(ctx, c.db, c.dispatcher)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, d := range u {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(d.Pending), d.Destination)
	}
}
