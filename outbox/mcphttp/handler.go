package mcphttp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/inflight"
	"github.com/mcp-outbox/mcp-outbox/internal/origin"
)

// StatelessVersion is the first protocol version whose requests carry their
// own _meta and need no session. The go-sdk serves it over HTTP only from a
// handler with Stateless set, and a stateful handler makes such clients fall
// back to 2025-11-25; so the handler routes each request by its
// Mcp-Protocol-Version header to one of two handlers on the same server.
const StatelessVersion = "2026-07-28"

// Options configure [NewHandler] and [ServeWith]; the zero value is usable.
// Each reads its own fields: ServeWith the connection's (ShutdownTimeout,
// BodyTimeout, IdleTimeout, MaxConns, MaxConnsPerClient), NewHandler the
// request's (MaxInFlight, MaxInFlightPerPrincipal,
// MaxInFlightBytesPerPrincipal, MaxDepth, AllowedOrigins). Give both the same Options: a bound given to only the
// one that does not read it is not in force, and the first request
// NewHandler serves logs a warning naming it.
type Options struct {
	// Logger gets the go-sdk's transport logs and the counts of requests
	// refused by MaxInFlight and MaxInFlightPerPrincipal ([NewHandler]),
	// and what [ServeWith] did with the requests still running when its
	// shutdown bound passed. Nil discards the transport logs and sends the
	// rest to slog.Default(): refusals and a shutdown that cut requests are
	// never silent.
	Logger *slog.Logger
	// ShutdownTimeout bounds how long [ServeWith] waits, once its context
	// ends, for the requests in flight to finish. Zero means
	// DefaultShutdownTimeout; negative waits for none of them (they are
	// handed over at once, as described on ServeWith).
	ShutdownTimeout time.Duration
	// BodyTimeout bounds, in [ServeWith], how long a request's body may
	// take to arrive once its headers did; a client slower than that gets
	// 408 and its connection is closed. It does not apply to what comes
	// after the body (a long answer, an event stream). Zero means
	// DefaultBodyTimeout; negative, no bound.
	BodyTimeout time.Duration
	// IdleTimeout is how long [ServeWith] keeps a connection open between
	// requests (HTTP keep-alive); then it closes it. A connection carrying
	// an event stream is not idle, however long the stream is silent.
	// Zero means DefaultIdleTimeout; negative, no bound.
	IdleTimeout time.Duration
	// MaxConns bounds the connections [ServeWith] holds open at once;
	// past it, a new connection is answered 503 with Retry-After and
	// closed. Zero means DefaultMaxConns, or half the process's limit of
	// open files if that is lower; negative, no bound.
	MaxConns int
	// MaxConnsPerClient bounds them per client address (the TCP peer, an
	// IPv6 client's /64). A loopback peer is not bounded per client: a
	// reverse proxy or a mesh's sidecar on the same host is every client's
	// address. Behind a proxy on another host, raise it or turn it off. Zero means
	// DefaultMaxConnsPerClient, or a quarter of the total bound if that is
	// lower; negative, no bound.
	MaxConnsPerClient int

	// MaxInFlight bounds the requests [NewHandler] serves at once, event
	// streams (a session's standalone GET stream) aside; one more is
	// refused with 503 and Retry-After before its body is read. Zero
	// means DefaultMaxInFlight; negative, no bound.
	MaxInFlight int
	// MaxInFlightPerPrincipal bounds them per principal (the
	// auth.TokenInfo.UserID the authentication in front put in the
	// request's context); one more is refused with 429 and Retry-After.
	// Requests without a principal (no authentication) count against
	// MaxInFlight only. Zero means DefaultMaxInFlightPerPrincipal;
	// negative, no bound.
	MaxInFlightPerPrincipal int
	// MaxInFlightBytesPerPrincipal bounds the bodies of a principal's
	// requests in flight, by their Content-Length (one without counts as
	// the 4 MiB the go-sdk reads at most); one more is refused with 429
	// and Retry-After. What a request holds grows with its body, so this,
	// not the count, is what bounds memory, and many small calls pass. A
	// principal with nothing in flight is always let in. Zero means
	// DefaultMaxInFlightBytesPerPrincipal; negative, no bound.
	MaxInFlightBytesPerPrincipal int64
	// MaxDepth bounds how deep a request body nests (objects and arrays,
	// the JSON-RPC message's own levels included); a deeper one is
	// refused with 400 and a JSON-RPC -32600 error before anything
	// decodes it. Zero means DefaultMaxDepth; negative, no bound of ours
	// (the go-sdk's own, 1000, stays).
	MaxDepth int

	// AllowedOrigins are the origins, besides the server's own, whose web
	// pages may use [NewHandler]'s endpoint: scheme://host[:port], such as
	// "https://app.example.com". A request with any other Origin header
	// gets 403, on every method; one without (what MCP clients that are
	// not browsers send) is served. The own origin is the request's
	// scheme://Host, the scheme https over TLS or with
	// "X-Forwarded-Proto: https". Nil allows the own origin only. An entry
	// that is not an origin matches nothing, and NewHandler logs a warning
	// for it.
	AllowedOrigins []string

	refusalLogEvery time.Duration // tests: the period refusals are counted over in the log
	boundLoopback   bool          // tests: bound loopback peers per client too
}

// DefaultIdleTimeout is [Options.IdleTimeout] when zero. It is longer than
// the idle bound of the clients that keep connections (Go's
// http.DefaultTransport and so go-sdk: 90 s; Node's fetch: 4 s), so that
// they close an idle connection before the server does: a server closing
// one just as the client sends its next POST on it fails that request,
// which the client does not retry (a POST is not idempotent to it). And
// it is short enough that idle connections do not pile up: at most what
// clients opened in two minutes.
const DefaultIdleTimeout = 2 * time.Minute

// The defaults of [Options]' bounds on what one client can make the
// server hold.
//
// Each request in flight holds its body (up to the go-sdk's 4 MiB limit)
// several times over while go-sdk reads and decodes it, so the bounds on
// requests are bounds on memory: DefaultMaxInFlightBytesPerPrincipal,
// eight bodies of the most go-sdk reads, keeps sixteen concurrent 4 MiB
// calls of one token under 200 MiB of peak RSS (README, Limits), while
// DefaultMaxInFlightPerPrincipal lets an agent's parallel tool calls, or
// a backend that calls for many users under one token, through; the
// count still bounds the goroutines and database turns one principal
// takes. DefaultMaxInFlight is outbox-load's highest level of concurrent
// callers, each with one call in flight. DefaultMaxDepth: a tools/call is
// three levels (message, params, arguments) before the tool's own
// arguments, which tools' input schemas and _meta keep to a handful more;
// 64 leaves them ten times that, and bounds what the go-sdk's decoder,
// whose cost grows with depth squared (see checkDepth), spends on one body.
const (
	DefaultMaxInFlight                  = 128
	DefaultMaxInFlightPerPrincipal      = 32
	DefaultMaxInFlightBytesPerPrincipal = 8 * mcp.DefaultMaxRequestBodyBytes
	DefaultMaxDepth                     = 64
)

// NewHandler returns the Streamable HTTP endpoint of s (serve mounts it at
// /mcp): stateful sessions for clients up to 2025-11-25, stateless
// requests for 2026-07-28 and later (a request of a later version that
// carries an Mcp-Session-Id stays with its session). A top-level
// params.idempotencyKey of tools/call is lifted into _meta first
// ([LiftParamsKey]). The reason of a client's notifications/cancelled in
// a session reaches the layer, which decides by it whether the call stops
// (outbox.CancelPolicy). A request whose Origin header is neither the
// server's own nor in Options.AllowedOrigins gets 403, as the transport
// spec wants. It bounds the requests in flight, in all and per principal,
// and how deep a body nests (see [Options]). Put authentication in front
// of it, such as bearer.Verifier.Require: the per-principal bound counts
// the principal it puts in the request's context.
func NewHandler(s *mcp.Server, opts *Options) http.Handler {
	var o Options
	if opts != nil {
		o = *opts
	}
	get := func(*http.Request) *mcp.Server { return s }
	stateful := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: o.Logger})
	stateless := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: o.Logger, Stateless: true})
	h := liftParamsKey(newCancels().wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Mcp-Protocol-Version"); v >= StatelessVersion && r.Header.Get("Mcp-Session-Id") == "" {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})), orDefault(o.MaxDepth, DefaultMaxDepth))
	logger := o.Logger
	if logger == nil {
		logger = slog.Default() // refusals are never silent
	}
	h = inflight.New(inflight.Limits{
		Total:             orDefault(o.MaxInFlight, DefaultMaxInFlight),
		PerPrincipal:      orDefault(o.MaxInFlightPerPrincipal, DefaultMaxInFlightPerPrincipal),
		TotalHow:          "mcp-outbox --max-in-flight, MCP_OUTBOX_MAX_IN_FLIGHT; mcphttp.Options.MaxInFlight",
		PerPrincipalHow:   "mcp-outbox --max-in-flight-per-principal, MCP_OUTBOX_MAX_IN_FLIGHT_PER_PRINCIPAL; mcphttp.Options.MaxInFlightPerPrincipal",
		PerPrincipalBytes: orDefault(o.MaxInFlightBytesPerPrincipal, DefaultMaxInFlightBytesPerPrincipal),
		UnknownLength:     mcp.DefaultMaxRequestBodyBytes,
		PerPrincipalBytesHow: "mcp-outbox --max-in-flight-bytes-per-principal, MCP_OUTBOX_MAX_IN_FLIGHT_BYTES_PER_PRINCIPAL; " +
			"mcphttp.Options.MaxInFlightBytesPerPrincipal",
	}, logger).Wrap(h)
	// The Origin is checked first, before a body is read or a place in
	// flight is taken: a refused page costs nothing more.
	origin.WarnInvalid(logger, o.AllowedOrigins, "mcphttp: Options.AllowedOrigins")
	return checkSplit(o, logger, origin.Check(o.AllowedOrigins, h))
}

// orDefault is v, def when v is zero, and 0 (no bound) when negative.
func orDefault[T int | int64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// DefaultShutdownTimeout is [Options.ShutdownTimeout] when zero. It is
// long enough for the calls in flight under the documented defaults:
//
//   - before its handler runs, a call of the outbox layer may wait up to
//     30 s (outbox.Options.InFlightWait): a duplicate for the outcome of the
//     attempt it duplicates, a claim for SQLite's write lock held by
//     another process;
//   - the handler itself has no limit the layer imposes, but a client's
//     does: the TypeScript SDK abandons a request after 60 s
//     (DEFAULT_REQUEST_TIMEOUT_MSEC), so waiting longer for an answer
//     serves no default client;
//   - a task-augmented call is answered at once with its task, which
//     runs on in the layer and is waited for by outbox.Runner.Stop, not
//     here; deliveries of effects are the dispatcher's, also after Serve.
//
// So 60 s covers a handler of up to 30 s after the longest wait, and any
// call a default client still waits for. An orchestrator's grace period
// must be longer for the bound to apply (Kubernetes' default
// terminationGracePeriodSeconds is 30 s; systemd's TimeoutStopSec 90 s):
// a SIGKILL before it hands the calls over in the same way, without the
// log line.
const DefaultShutdownTimeout = 60 * time.Second

// Serve is [ServeWith] with nil options: the default shutdown and
// connection bounds, and its log to slog.Default().
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	return ServeWith(ctx, ln, h, nil)
}

// ServeWith serves h on ln until ctx ends, then shuts down gracefully: it
// stops accepting, and waits up to opts.ShutdownTimeout for the requests in
// flight (a POST that carries a tools/call ends once its answer is
// written). An event stream (a GET that accepts text/event-stream: the
// standalone stream of a session, which never ends on its own) is not
// waited for; it is closed once the other requests finished.
//
// When the bound passes with requests still running, ServeWith closes
// their connections (their clients get no answer), logs how many were
// running, and returns nil: the requests are handed over. What "handed
// over" means for a tools/call of the outbox layer, whose outcome is all
// or nothing in its transaction: the handler, still running, either
// commits before the process exits, and a retry replays its result; or
// its transaction rolls back (at the latest when the process exits and
// its database connection ends) and a retry runs the call once. The
// call's claim either rolled back with it (on PostgreSQL, a first
// attempt's claim rides in the call's transaction: the key is free at
// once), or stays in_flight with this process as owner, and the retry
// takes it over: on SQLite at once, the owner process being gone; on
// PostgreSQL once the claim's lease (outbox.Options.Lease) passes, nobody
// renewing it. A call whose work commits outside the layer's transaction
// (the proxy's, to an upstream that does not cooperate) is marked unknown
// instead, and never runs again. outbox.Runner.Stop hands over the tasks
// it stops in the same way. So the caller should go on with its shutdown
// (the layer's Runner.Stop, then closing the database) and exit
// successfully. A handler not written against the outbox gets no such
// guarantee: what it did is what it did.
//
// While serving, it bounds what a client can hold (see Options for each
// bound's default, and how to turn it off):
//
//   - request headers must arrive within 10 s;
//   - a request's body within opts.BodyTimeout of its headers, else the
//     client gets 408 Request Timeout and the connection is closed;
//   - a connection idle between requests is closed after opts.IdleTimeout;
//   - at most opts.MaxConns connections are open, and opts.MaxConnsPerClient
//     from one client address; one more is answered 503 Service
//     Unavailable with Retry-After and closed, and the refusals are logged
//     as a count per minute.
//
// Nothing bounds how long an answer or an event stream takes once the body
// was read: a session's standalone stream lives as long as its client, and
// a silent stream's connection is not idle.
//
// The error is not nil only when serving failed before ctx ended.
func ServeWith(ctx context.Context, ln net.Listener, h http.Handler, opts *Options) error {
	var o Options
	if opts != nil {
		o = *opts
	}
	bound := o.ShutdownTimeout
	if bound == 0 {
		bound = DefaultShutdownTimeout
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	tr := newTracker()
	idle := o.IdleTimeout
	if idle == 0 {
		idle = DefaultIdleTimeout
	}
	body := o.BodyTimeout
	if body == 0 {
		body = DefaultBodyTimeout
	}
	// No ReadTimeout (see bodyTimeout for why the body has its own bound),
	// and no WriteTimeout: its deadline covers the whole answer, and would
	// cut every event stream. A negative IdleTimeout turns the keep-alive
	// bound off: net/http takes a zero one as ReadTimeout's, which is none.
	total, perClient := resolveConnLimits(o)
	ln = newLimitListener(ln, connLimits{total: total, perClient: perClient, logger: logger, logEvery: o.refusalLogEvery, boundLoopback: o.boundLoopback})
	sv := &served{opts: o}
	defer sv.checkHandled(logger)
	srv := &http.Server{Handler: tr.track(bodyTimeout(body, h)), ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: max(idle, 0), ConnState: tr.connState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return tr.connContext(withServed(ctx, sv), c) }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	// Shutdown closes the listener and the idle connections, and makes the
	// busy ones close once their response is written. It would also wait
	// for the event streams, which end only when their client leaves. So
	// the streams are ended here, but only once every other connection
	// closed, its answer written out: the go-sdk client fails its session
	// when the stream ends (at once with MaxRetries -1, else when it cannot
	// reconnect), and with it a call whose answer it has not read yet.
	if n := tr.running(); n > 0 && bound > 0 {
		// Said before the wait, so that a process that waits up to a
		// minute does not look hung.
		logger.Info("shutdown: waiting for the requests in flight to answer", "running", n, "shutdown_timeout", bound)
	}
	deadline := time.Now().Add(max(bound, 0))
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(sctx) }()
	if tr.waitSettled(sctx) {
		tr.endStreams()
		if err := <-shut; err != nil {
			srv.Close() // the bound passed while the streams ended
		}
		return nil
	}
	if n := tr.running(); n > 0 {
		logger.Warn("shutdown: requests still running when the shutdown bound passed were handed over: "+
			"their connections are closed and their clients get no answer; a call of the outbox layer among them "+
			"either commits before the process exits (a retry replays it) or rolls back, and a retry runs it once",
			"running", n, "shutdown_timeout", bound)
	}
	srv.Close()
	<-shut
	return nil
}

// tracker follows what ServeWith waits for at shutdown: the requests other
// than event streams, and the connections that carried them.
type tracker struct {
	mu       sync.Mutex
	requests int               // running, event streams aside
	conns    map[net.Conn]bool // that carried a request; true: an event stream
	changed  chan struct{}     // closed at the next change, then made anew
	streams  context.Context   // the event streams' requests end with it
	end      context.CancelFunc
}

type connKey struct{}

func newTracker() *tracker {
	t := &tracker{conns: map[net.Conn]bool{}, changed: make(chan struct{})}
	t.streams, t.end = context.WithCancel(context.Background())
	return t
}

// changedLocked wakes the shutdown's wait.
func (t *tracker) changedLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

func (t *tracker) connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

func (t *tracker) connState(c net.Conn, s http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s {
	case http.StateActive:
		if _, ok := t.conns[c]; !ok {
			t.conns[c] = false
		}
	case http.StateIdle:
		if _, ok := t.conns[c]; ok {
			t.conns[c] = false // its stream ended; Shutdown closes it
		}
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
	default:
		return
	}
	t.changedLocked()
}

// track passes every request to h, counting all but event streams (a GET
// that accepts text/event-stream), whose context ends with endStreams.
func (t *tracker) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
				t.mu.Lock()
				t.conns[c] = true
				t.changedLocked()
				t.mu.Unlock()
			}
			ctx, stop := context.WithCancel(r.Context())
			defer stop()
			defer context.AfterFunc(t.streams, stop)()
			h.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		t.add(1)
		defer t.add(-1)
		h.ServeHTTP(w, r)
	})
}

func (t *tracker) add(d int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.requests += d
	t.changedLocked()
}

func (t *tracker) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.requests
}

// settled reports whether only event streams are left: no request runs,
// and every other connection closed (so their answers were written out);
// changed is closed at the next change.
func (t *tracker) settled() (changed <-chan struct{}, settled bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.requests > 0 {
		return t.changed, false
	}
	for _, stream := range t.conns {
		if !stream {
			return t.changed, false
		}
	}
	return t.changed, true
}

// waitSettled waits until settled, or ctx ends (false).
func (t *tracker) waitSettled(ctx context.Context) bool {
	for {
		changed, settled := t.settled()
		if settled {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// endStreams ends the event streams' requests: their handlers return, and
// Shutdown closes their connections.
func (t *tracker) endStreams() { t.end() }
