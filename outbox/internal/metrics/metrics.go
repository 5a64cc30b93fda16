// Package metrics holds the Prometheus metrics that a layer (package
// outbox) and a dispatcher (package outbox/dispatch) share: one value serves
// both, and the dispatcher cannot import outbox, which starts it. Users
// name the type as outbox.Metrics and create it with outbox.NewMetrics.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus metrics of layers and dispatchers (see
// outbox.Metrics, an alias of this type). A nil *Metrics records nothing.
// What records into them are functions, not methods: through the alias,
// methods would be part of outbox's API.
type Metrics struct {
	calls            *prometheus.CounterVec
	callDuration     *prometheus.HistogramVec
	commitBatch      *prometheus.HistogramVec
	deliveries       *prometheus.CounterVec
	deliveryDuration *prometheus.HistogramVec
	deliveryAttempts *prometheus.HistogramVec
}

// New creates the metrics and registers them with reg (when reg is
// not nil). It panics if they are already registered there, as
// prometheus.MustRegister does.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcp_outbox_calls_total",
			Help: "Tool calls through the layer, by tool and outcome (executed, replayed, joined, conflict, in_progress, not_recorded, failed).",
		}, []string{"tool", "outcome"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcp_outbox_call_duration_seconds",
			Help:    "Time from a tool call's arrival at the layer to its answer, waits for an original attempt included.",
			Buckets: prometheus.DefBuckets,
		}, []string{"tool"}),
		commitBatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mcp_outbox_commit_batch_size",
			Help: "Outcomes written per commit: kind=calls for recorded call outcomes, kind=deliveries for the dispatcher's delivery outcomes.",
			// Batches are bounded by delivery concurrency in practice.
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}, []string{"kind"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcp_outbox_deliveries_total",
			Help: "Recorded delivery attempt outcomes, by destination and result (delivered, retry, dead, unknown).",
		}, []string{"destination", "result"}),
		deliveryDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcp_outbox_delivery_duration_seconds",
			Help:    "Duration of one delivery attempt's HTTP exchange, by destination.",
			Buckets: prometheus.DefBuckets,
		}, []string{"destination"}),
		deliveryAttempts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mcp_outbox_delivery_attempts",
			Help: "Attempts an effect took until it was delivered, by destination.",
			// Up to DefaultMaxAttempts.
			Buckets: []float64{1, 2, 3, 5, 8, 13, 25},
		}, []string{"destination"}),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.callDuration, m.commitBatch, m.deliveries, m.deliveryDuration, m.deliveryAttempts)
	}
	return m
}

// Values of the kind label of mcp_outbox_commit_batch_size.
const (
	CommitCalls      = "calls"
	CommitDeliveries = "deliveries"
)

// Call counts a call of tool that ended with outcome after d.
func Call(m *Metrics, tool, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(tool, outcome).Inc()
	m.callDuration.WithLabelValues(tool).Observe(d.Seconds())
}

// Commit observes a commit of n outcomes of kind.
func Commit(m *Metrics, kind string, n int) {
	if m == nil {
		return
	}
	m.commitBatch.WithLabelValues(kind).Observe(float64(n))
}

// DeliveryTime observes one attempt's HTTP exchange with dest.
func DeliveryTime(m *Metrics, dest string, d time.Duration) {
	if m == nil {
		return
	}
	m.deliveryDuration.WithLabelValues(dest).Observe(d.Seconds())
}

// Delivery counts a recorded attempt of an effect for dest: result is
// delivered, retry, dead or unknown, attempts the effect's attempts so far.
func Delivery(m *Metrics, dest, result string, attempts int) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(dest, result).Inc()
	if result == "delivered" {
		m.deliveryAttempts.WithLabelValues(dest).Observe(float64(attempts))
	}
}
