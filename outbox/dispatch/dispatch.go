package dispatch

import (
	"context"
	"encoding/json"
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

	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/dbclock"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/otelattr"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/owner"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

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
