package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/dbclock"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/otelattr"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/owner"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
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

// A Dispatcher delivers committed effects to their destinations. Every
// attempt of an effect carries the same Idempotency-Key. Claims are leases
// fenced by owner: a dispatcher whose lease passed cannot record an outcome.
//
// On PostgreSQL the dispatchers of several replicas share the effects:
// each due effect is leased to one of them (FOR UPDATE SKIP LOCKED), a
// call's effects still go out one after another, and a lease is reclaimed
// only once it has passed, since an owner on another machine cannot be
// checked any other way.
type Dispatcher struct {
	db     *schema.DB
	opts   Options
	sealer *sealing.Sealer // of opts.Keys
	dests  map[string]*destState
	names  string // JSON array of configured destination names, for SQL
	amo    string // JSON array of the at_most_once ones
	probed string // JSON array of the ones with a probe
	// probeDelays is a JSON object of destination name to the wait in ms
	// before an unknown effect is first probed.
	probeDelays string
	logger      *slog.Logger
	self        owner.Process
	owner       string // lease owner: this process and layer nonce, see owner.Process
	now         func() time.Time
	tracer      trace.Tracer

	wake        chan struct{} // Notify and finished attempts
	running     atomic.Bool   // Run is looping
	lastReclaim time.Time     // wall clock of the last reclaim; rounds run one at a time
	inflight    sync.WaitGroup
	active      atomic.Int64 // attempts started and not yet recorded (inflight also counts the outcomes' writer)
	// sending holds the ids of effects whose attempt has started and whose
	// outcome is not yet written: reclaim never takes these back, whatever
	// this process's clock says (see heldIDs).
	sending  sync.Map
	stopping atomic.Bool // Run or Drain is ending: claim nothing more
	stmts    atomic.Pointer[dispatchStmts]

	recMu    sync.Mutex // guards recQueue and writing: see record
	recQueue []*pendingRecord
	writing  bool

	mu        sync.Mutex
	cancelReq context.CancelFunc // cancels requests in flight at the end of shutdown

	// Tests' hooks: testHookListening runs when the PostgreSQL listener is
	// listening (see listenOnce), testHookIdle when Run is about to wait
	// with no wake-up pending.
	testHookListening, testHookIdle func()
}

type destState struct {
	Destination
	client *http.Client
	slots  chan struct{} // one token per attempt in flight

	mu sync.Mutex // guards queue and exchange
	// queue holds effects claimed ahead of a free slot (see fill and
	// commitOutcomes), in claim order.
	queue []*claimedEffect
	// exchange is the moving average of attempts' HTTP exchanges; zero
	// until the first.
	exchange time.Duration
}

// New returns a dispatcher for the destinations in opts.
func New(db *schema.DB, opts *Options) (*Dispatcher, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = DefaultBackoffBase
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.ResponseLimit <= 0 {
		o.ResponseLimit = DefaultResponseLimit
	}
	now := o.Now
	if db.Dialect == schema.Postgres {
		// Leases and due times are written and judged by every replica:
		// in the server's clock (see dbclock), never in this machine's.
		now = dbclock.New(db.Read, o.Now).Now
	} else if now == nil {
		now = time.Now
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Rand == nil {
		o.Rand = mrand.Float64
	}
	if o.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		o.Transport = t
	}
	logger := o.Logger
	if logger == nil {
		// Disabled, not merely discarded: delivery events are then not
		// even built (report asks the logger first).
		logger = slog.New(slog.DiscardHandler)
	}
	d := &Dispatcher{
		db: db, opts: o, sealer: sealing.Of(o.Keys), dests: map[string]*destState{}, now: now,
		logger: logger.With("subsystem", "dispatch"),
		self:   owner.Current(),
		wake:   make(chan struct{}, 1),
		tracer: otelattr.Tracer(o.TracerProvider),
	}
	var names, amo, probed []string
	delays := map[string]int64{}
	longest := time.Duration(0)
	for _, dst := range o.Destinations {
		if dst.Name == "" || dst.URL == nil || (dst.URL.Scheme != "http" && dst.URL.Scheme != "https") {
			return nil, fmt.Errorf("destination %q: want a name and an http(s) URL", dst.Name)
		}
		if _, dup := d.dests[dst.Name]; dup {
			return nil, fmt.Errorf("destination %q configured twice", dst.Name)
		}
		if dst.Timeout <= 0 {
			dst.Timeout = DefaultDeliveryTimeout
		}
		if dst.Concurrency <= 0 {
			dst.Concurrency = DefaultConcurrency
		}
		if dst.MaxAttempts <= 0 {
			dst.MaxAttempts = DefaultMaxAttempts
		}
		if dst.MaxAge <= 0 {
			dst.MaxAge = DefaultMaxAge
		}
		if dst.Probe != nil && !dst.AtMostOnce {
			return nil, fmt.Errorf("destination %q: a probe is only for at_most_once destinations", dst.Name)
		}
		switch dst.KeyForm {
		case "":
			dst.KeyForm = KeyQuoted
		case KeyQuoted, KeyBare:
		default:
			return nil, fmt.Errorf("destination %q: key form %q: want %q or %q", dst.Name, dst.KeyForm, KeyQuoted, KeyBare)
		}
		longest = max(longest, dst.Timeout)
		transport := o.Transport
		if dst.AtMostOnce {
			// net/http resends a request that carries Idempotency-Key by
			// itself when a reused keep-alive connection breaks before the
			// response (Request.isReplayable). A destination that cannot
			// dedup would apply that second copy, so its requests never
			// ride a reused connection.
			if t, ok := transport.(*http.Transport); ok {
				t = t.Clone()
				t.DisableKeepAlives = true
				transport = t
			}
		}
		d.dests[dst.Name] = &destState{
			Destination: dst,
			client: &http.Client{
				Transport: transport,
				// A redirect is an answer to record, not to follow: following
				// would re-send the effect somewhere else.
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			},
			slots: make(chan struct{}, dst.Concurrency),
		}
		names = append(names, dst.Name)
		if dst.AtMostOnce {
			amo = append(amo, dst.Name)
			delays[dst.Name] = d.dests[dst.Name].unknownProbeDelay().Milliseconds()
		}
		if dst.Probe != nil {
			probed = append(probed, dst.Name)
		}
	}
	if o.Lease <= 0 {
		d.opts.Lease = max(2*longest, defaultDispatchLeaseMin)
	}
	nb, _ := json.Marshal(append([]string{}, names...))
	ab, _ := json.Marshal(append([]string{}, amo...))
	pb, _ := json.Marshal(append([]string{}, probed...))
	dl, _ := json.Marshal(delays)
	d.names, d.amo, d.probed, d.probeDelays = string(nb), string(ab), string(pb), string(dl)
	d.owner = string(d.self) + "#dispatch"
	return d, nil
}

// Running reports whether Run is delivering (for readiness checks).
func (d *Dispatcher) Running() bool { return d.running.Load() }

// Notify tells the dispatcher that new effects were committed. It never
// blocks. outbox.Layer.Start connects its dispatcher so; by hand,
// Layer.OnEnqueue(d.Notify) does.
func (d *Dispatcher) Notify() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// requireKeyFile refuses to deliver from an encrypted database without a
// key ring (sealing.ErrKeyRequired): every sealed effect would be claimed,
// fail to open, and lose an attempt and its place in time, which a
// stranger's drain without the key file did to all of them.
func (d *Dispatcher) requireKeyFile(ctx context.Context) error {
	if d.sealer != nil {
		return nil
	}
	if err := sealing.RequireKeyFile(ctx, d.db.Read, nil); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	return nil
}

// Run delivers effects until ctx ends. It starts at once, reclaiming the
// expired leases of a previous run. When ctx ends it stops claiming, lets
// attempts in flight finish for up to ShutdownTimeout, then cancels the rest
// and releases what it holds.
//
// On PostgreSQL it also listens for the notifications of new effects that
// any replica commits, and wakes on them as on Notify (see
// listen.go); PollInterval then only bounds how late an effect is
// found when a notification was lost.
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.requireKeyFile(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it began: the end Run reports as nil
		}
		return err
	}
	d.running.Store(true)
	defer d.running.Store(false)
	d.stopping.Store(false)
	reqCtx, cancelReq := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReq()
	d.mu.Lock()
	d.cancelReq = cancelReq
	d.mu.Unlock()
	stopListener := d.startListener(ctx)
	defer stopListener()

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		next, err := d.round(ctx, reqCtx)
		if err != nil && ctx.Err() == nil {
			d.logger.ErrorContext(ctx, "dispatch round", "error", err)
			next = d.opts.PollInterval
		}
		timer.Reset(next)
		if h := d.testHookIdle; h != nil && len(d.wake) == 0 {
			h()
		}
		select {
		case <-ctx.Done():
			return d.shutdown(ctx, cancelReq)
		case <-d.wake:
		case <-timer.C:
		}
	}
}

func (d *Dispatcher) shutdown(ctx context.Context, cancelReq context.CancelFunc) error {
	defer d.closeStatements()
	d.stopping.Store(true)
	d.releaseQueued(ctx)
	done := make(chan struct{})
	go func() { d.inflight.Wait(); close(done) }()
	t := time.NewTimer(d.opts.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		d.logger.WarnContext(ctx, "shutdown timeout: cancelling deliveries in flight")
		cancelReq()
		<-done
	}
	d.releaseQueued(ctx) // claimed by outcomes' commits under way at the stop
	return nil
}

// claimedEffect is an effect this dispatcher holds a lease on.
type claimedEffect struct {
	id        int64
	seq       int
	method    string
	path      string
	headers   map[string]string
	body      []byte
	key       string
	attempts  int
	createdAt int64
	// traceparent is the span context of the call that enqueued the
	// effect ("" if none): the parent of each attempt's span.
	traceparent string
	// leaseUntil is when the claim's lease passes, by this dispatcher's
	// clock: a queued effect too close to it is released, not attempted.
	leaseUntil time.Time
	// unreadable: the body or headers are sealed and cannot be opened
	// (erased, changed, or a key missing); the effect is not sent.
	unreadable error
	rawHeaders string
}

// String names the effect by id only: errors that carry it end up in logs,
// which must not hold Idempotency-Keys.
func (e *claimedEffect) String() string { return fmt.Sprintf("effect %d", e.id) }

// joinURL appends an effect's path (which may carry a query) to a base URL.
func joinURL(base *url.URL, path string) (string, error) {
	ref, err := url.Parse(path)
	if err != nil {
		return "", fmt.Errorf("effect path %q: %w", path, err)
	}
	u := *base
	u.Path = strings.TrimSuffix(base.Path, "/") + ref.Path
	u.RawPath = ""
	u.RawQuery = ref.RawQuery
	return u.String(), nil
}

// drainProgressEvery is how often Drain reports progress at most.
const drainProgressEvery = 100 * time.Millisecond

// Drain delivers effects until none of a configured destination is pending
// or in flight, or ctx ends; retries that come due meanwhile are made.
// Effects left dead or unknown are reported, not waited for. progress, if
// not nil, is called with the current counts after a round, at most every
// drainProgressEvery: counting reads every effect's index entry (about
// 0.1 s per million), too much for every round.
func (d *Dispatcher) Drain(ctx context.Context, progress func(opsquery.Counts)) (opsquery.Counts, error) {
	if err := d.requireKeyFile(ctx); err != nil {
		return opsquery.Counts{}, err
	}
	d.stopping.Store(false)
	defer d.closeStatements()
	defer d.settle(ctx)
	stopListener := d.startListener(ctx)
	defer stopListener()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var lastProgress time.Time
	failures := 0
	for {
		next, err := d.round(ctx, ctx)
		open := true
		if err == nil {
			open, err = d.openEffects(ctx)
		}
		if err != nil {
			if !d.transient(err) || ctx.Err() != nil {
				return opsquery.Counts{}, err
			}
			// A database restarting or failing over, or a lock held by
			// another process, passes: drain is for deploy hooks, which
			// run exactly when such things happen. Its timeout (ctx)
			// bounds the waiting.
			failures++
			next = backoff(failures, drainRetryFirst, drainRetryLast, d.opts.Rand())
			d.logger.WarnContext(ctx, "drain: database error; trying again", "error", err, "failures", failures, "wait", next)
		} else {
			failures = 0
		}
		if progress != nil && time.Since(lastProgress) >= drainProgressEvery {
			lastProgress = time.Now()
			if c, err := opsquery.CountEffects(ctx, d.db); err == nil {
				progress(c)
			}
		}
		if !open {
			d.inflight.Wait()
			if open, err = d.openEffects(ctx); err != nil && d.transient(err) && ctx.Err() == nil {
				open = true // counted below, once the store answers again
			} else if err != nil || !open {
				c, cerr := opsquery.CountEffects(context.WithoutCancel(ctx), d.db)
				return c, errors.Join(err, cerr)
			}
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			d.settle(ctx)
			c, err := opsquery.CountEffects(context.WithoutCancel(ctx), d.db)
			return c, errors.Join(ctx.Err(), err)
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// Waits of Drain between rounds that failed with a transient database
// error: doubling from drainRetryFirst up to drainRetryLast, jittered.
const (
	drainRetryFirst = 100 * time.Millisecond
	drainRetryLast  = 5 * time.Second
)

// transient reports whether err is the database failing for a while rather
// than the statement: PostgreSQL unreachable, restarting or out of
// resources (schema.DB.Unavailable) or losing to another transaction
// (serialization failure, deadlock, lock timeout), or SQLite's lock held by
// another process past busy_timeout (SQLITE_BUSY, SQLITE_LOCKED) or an I/O
// error.
func (d *Dispatcher) transient(err error) bool {
	if d.db.Unavailable(err) {
		return true
	}
	switch schema.PgCode(err) {
	case schema.PgSerializationFailure, schema.PgDeadlockDetected, schema.PgLockNotAvailable:
		return true // another transaction won this time
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff { // the primary code
	case 5, 6, 10: // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR
		return true
	}
	return false
}

// settle stops claiming, releases the queued claims, and waits for the
// attempts in flight and their outcomes' commits, releasing what those
// commits claimed meanwhile.
func (d *Dispatcher) settle(ctx context.Context) {
	d.stopping.Store(true)
	d.releaseQueued(ctx)
	d.inflight.Wait()
	d.releaseQueued(ctx)
}

// openEffects reports whether effects of configured destinations still
// need delivery work.
func (d *Dispatcher) openEffects(ctx context.Context) (bool, error) {
	if d.busy() {
		return true, nil // this dispatcher's own work is open; no need to ask
	}
	st, err := d.statements(ctx)
	if err != nil {
		return false, err
	}
	for name := range d.dests {
		var open bool
		if err := st.open.QueryRowContext(ctx, name).Scan(&open); err != nil {
			return false, fmt.Errorf("look for open effects: %w", err)
		}
		if open {
			return true, nil
		}
	}
	return false, nil
}

// CancelInFlight cancels the requests of the attempts in flight now, as
// Run's shutdown does once ShutdownTimeout passes. It is for a caller whose
// own deadline for the shutdown comes first (outbox.Runner.Stop calls it
// when its context ends): cancel Run's context, then call CancelInFlight,
// then wait for Run to return. A cancelled effect is sent again, with the
// same Idempotency-Key, by the next Run, or becomes unknown if its
// destination is AtMostOnce. Outside Run's shutdown it does nothing useful:
// attempts it cancels while Run still claims are retried as any failure.
func (d *Dispatcher) CancelInFlight() {
	d.mu.Lock()
	cancel := d.cancelReq
	d.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}
