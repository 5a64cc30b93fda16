package dispatch

import (
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
)

// Defaults for Destination and Options fields left at zero.
const (
	DefaultDeliveryTimeout  = 10 * time.Second
	DefaultConcurrency      = 4
	DefaultMaxAttempts      = 25
	DefaultMaxAge           = 72 * time.Hour
	DefaultPollInterval     = time.Second
	DefaultBackoffBase      = time.Second
	DefaultBackoffMax       = 10 * time.Minute
	DefaultShutdownTimeout  = 10 * time.Second
	DefaultResponseLimit    = 4 << 10
	defaultDispatchLeaseMin = 30 * time.Second
)

// Destination is a downstream HTTP API that effects name.
type Destination struct {
	// Name is what Effect.Destination refers to.
	Name string
	// URL is the base URL; an effect's path is appended to it.
	URL *url.URL
	// Timeout bounds one delivery attempt; zero means DefaultDeliveryTimeout.
	Timeout time.Duration
	// Concurrency bounds attempts in flight; zero means DefaultConcurrency.
	Concurrency int
	// AuthHeader and AuthValue are added to every request (for example
	// "Authorization" and "Bearer sk_..."). Take the value from the
	// environment: it is never written to the database.
	AuthHeader, AuthValue string
	// MaxAttempts and MaxAge bound retries: past either the effect is dead.
	// Zero means DefaultMaxAttempts and DefaultMaxAge.
	MaxAttempts int
	MaxAge      time.Duration
	// AtMostOnce marks a destination that does not dedup on
	// Idempotency-Key. After an attempt whose outcome cannot be known (the
	// request was written, then the connection failed or timed out) its
	// effect becomes unknown and is never re-sent automatically.
	AtMostOnce bool
	// Probe, for an AtMostOnce destination, asks whether an unknown effect
	// was applied: 2xx means delivered, 404 or 410 means safe to retry.
	Probe *Probe
	// KeyForm is how the Idempotency-Key header writes the key, on
	// deliveries and probes alike; zero means KeyQuoted. Any other value
	// is refused by New.
	KeyForm KeyForm
}

// KeyForm is how a destination gets an effect's Idempotency-Key: the key
// itself is what Tx.Enqueue returned either way; only the header's
// spelling differs.
type KeyForm string

// Key forms.
const (
	// KeyQuoted sends the key as a Structured Field String (RFC 8941), in
	// double quotes, as draft-ietf-httpapi-idempotency-key-header defines
	// the header: Idempotency-Key: "call_…-1". A destination that
	// compares the header with the key Enqueue returned removes the
	// quotes first (the layer's keys hold no quote or backslash to
	// unescape).
	KeyQuoted KeyForm = "quoted"
	// KeyBare sends the key as it is, Stripe's form:
	// Idempotency-Key: call_…-1.
	KeyBare KeyForm = "bare"
)

// headerValue is key as the Idempotency-Key header of form f carries it.
func (f KeyForm) headerValue(key string) string {
	if f == KeyBare {
		return key
	}
	return callkey.HeaderValue(key)
}

// Probe is a request that looks an effect up at its destination. Path may
// contain {key}, replaced by the URL-escaped Idempotency-Key.
type Probe struct {
	Method string // empty means GET
	Path   string
}

// Options configure a Dispatcher. Zero fields take the defaults.
type Options struct {
	Destinations []Destination
	Logger       *slog.Logger
	// PollInterval is how often the dispatcher looks for work that no
	// Notify announced: effects written by another process, retries whose
	// time came. On PostgreSQL every replica's new effects are announced
	// by a notification (see Run), so polling finds retries, effects an
	// operator made pending, and what a notification lost while the
	// listener reconnected did not announce. Zero means
	// DefaultPollInterval.
	PollInterval time.Duration
	// Lease is how long a claimed effect stays owned; zero means twice the
	// longest destination timeout, at least 30s.
	Lease time.Duration
	// BackoffBase and BackoffMax shape the retry schedule: retry n waits
	// BackoffBase·2^(n-1), capped at BackoffMax, half of it fixed and half
	// random, or longer when the destination's Retry-After asks (at most
	// an hour).
	BackoffBase, BackoffMax time.Duration
	// ShutdownTimeout bounds how long Run waits for attempts in flight
	// after its context ends; zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// ResponseLimit bounds the response body recorded per attempt.
	ResponseLimit int
	// Keys open effect bodies and headers the layer sealed (package seal);
	// nil reads plaintext ones only: on a database that holds data keys,
	// Run and Drain then fail with an error that wraps
	// outbox.ErrKeyRequired before they claim anything. Layer.Start passes
	// the layer's; a dispatcher made with New (mcp-outbox drain, a process
	// of its own) needs the same key file's. With Keys the destination's
	// response is not kept (it may echo the body): only its status and
	// the error text.
	Keys seal.KeyRing
	// Now and Rand are the clock and the jitter source; tests inject them.
	Now  func() time.Time
	Rand func() float64
	// Transport carries the requests; nil means a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// Metrics, if not nil, count deliveries and their outcomes (see
	// outbox.NewMetrics); the same value can serve a layer too.
	Metrics *metrics.Metrics
	// LogSensitive adds each effect's raw Idempotency-Key to its "delivery"
	// log events. For debugging only: the key lets anyone who reads the log
	// send a request the destination takes for the effect.
	LogSensitive bool
	// TracerProvider makes a CLIENT span of each delivery attempt, a child
	// of the span of the call that enqueued the effect (see
	// trace.go); nil means the global provider
	// (otel.GetTracerProvider), a no-op until the program installs an SDK.
	TracerProvider trace.TracerProvider
}
