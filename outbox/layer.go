package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/dbclock"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/layerinfo"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// FingerprintOff as a fingerprint window turns fingerprints off: calls
// without a key then run unrecorded.
const FingerprintOff time.Duration = -1

// StatusToolName is the name of the status tool every layer adds.
const StatusToolName = "call_status"

// Options configure a [Layer]. The zero value of each field selects the
// default documented on it.
type Options struct {
	// Logger receives the layer's logs. Nil sends its warnings and errors
	// to slog.Default() and drops the rest (the per-call events): the
	// answer to a call whose handler failed names the call id under which
	// the log has the error, so errors must go somewhere.
	Logger *slog.Logger
	// FingerprintWindow is the default window of tools without their own;
	// zero means 5 minutes, FingerprintOff turns it off.
	FingerprintWindow time.Duration
	// KeyRetention is how long explicit keys are remembered; zero means
	// 24 hours.
	KeyRetention time.Duration
	// InFlightWait bounds a duplicate's wait, and a claim's wait for the
	// write lock of another process; zero means 30 s.
	InFlightWait time.Duration
	// Lease is the claim lease; zero means 1 minute.
	Lease time.Duration
	// RecordIdempotent records tools annotated idempotentHint too; by default
	// they run in a transaction but are not recorded or replayed.
	RecordIdempotent bool
	// ShowErrors lets the text of a plain error a handler returns (one not
	// marked [Final]) reach the client, as a tool error the model reads:
	// fmt.Errorf("unsupported currency %q", c). As without it, nothing of
	// the call is recorded and a retry runs the handler again. The false
	// default answers such an error with a generic not_recorded error
	// naming the call id. Either way the error goes to the log, and the
	// database's errors never reach the client: an error that wraps one
	// the handler's Tx returned, one of a driver's types (SQLite's,
	// PostgreSQL's, database/sql's), or any error after the call's
	// transaction failed, gets the generic answer. [ToolOptions.ShowErrors]
	// sets it for one tool.
	ShowErrors bool
	// Now is the clock; nil means time.Now. Tests inject one.
	Now func() time.Time
	// Metrics, if not nil, count calls and their outcomes (see [NewMetrics]).
	Metrics *Metrics
	// MaxBatchCalls bounds how many calls share one commit (group commit:
	// calls that finish while others wait for the writer commit together,
	// each in its own savepoint). Zero means 64; 1 gives
	// every call a commit of its own.
	MaxBatchCalls int
	// MaxBatchWait bounds how long a batch keeps taking calls once it has
	// begun, and so what its first call can wait for the others; zero means
	// 10 ms. No call ever waits for others to arrive: a batch
	// commits as soon as nobody is waiting for the writer.
	MaxBatchWait time.Duration
	// LogSensitive adds each call's raw idempotency key and arguments to its
	// "call" log event. For debugging only: keys let anyone who reads the log
	// replay a call, and arguments may hold personal or payment data.
	LogSensitive bool
	// TracerProvider makes the spans of the requests the server receives
	// (see Traces in the package doc); nil means the global provider (otel.GetTracerProvider),
	// a no-op until the program installs an SDK. With LogSensitive the
	// spans carry arguments and results too.
	TracerProvider trace.TracerProvider
	// Keys, if not nil, encrypt what the layer stores that may hold
	// personal data (results, task arguments, effect bodies and headers)
	// and key the hashes of arguments (package seal: seal.LoadKeyFile, or
	// a KMS's seal.KeyRing). Nil stores them in plaintext, on a database
	// that was never encrypted (or was decrypted with mcp-outbox
	// encryption decrypt): on one that holds data keys, New fails with
	// [ErrKeyRequired], as it does when the ring lacks the key that wraps
	// the database's hash key.
	Keys seal.KeyRing
}

// A Layer is the idempotent execution layer of MCP servers on one
// database. Create it with [New], then create a server with
// [Layer.NewServer] (or call [Layer.Install] on an existing one) and register
// side-effecting tools with [AddTool]. One layer serves any number of
// servers, each with its own tools (one per tenant, or one per request).
type Layer struct {
	db     *schema.DB
	group  *groupCommit // the writer's transactions, shared among calls
	opts   Options
	sealer *sealing.Sealer // of opts.Keys, shared with whatever else is given the same ring
	logger *slog.Logger
	now    func() time.Time
	self   processID
	tracer trace.Tracer

	mu     sync.Mutex
	local  map[localKey]*attempt // attempts of this layer between claim and outcome
	nextID uint64
	notify func() // called after a commit that enqueued effects: every hook (lifecycle.go)
	hooks  []*enqueueHook
	runner *Runner // the work of Start, until its Stop

	known atomic.Pointer[destSet] // the dispatcher's destinations once Start ran; see checkDestination

	// servers holds the tools of each server the layer is installed on
	// (servers.go); guarded by mu.
	servers map[weak.Pointer[mcp.Server]]*serverTools

	renewing bool // the lease renewal loop runs (PostgreSQL; renew.go)

	// plainFingerprintsUntil: until this unix ms, calls without a key made
	// before encryption was turned on may still name identical calls under
	// their plain fingerprint (sealed.go); 0 when there are none.
	plainFingerprintsUntil atomic.Int64

	// tasks: the tasks this layer runs, by id (task_run.go); guarded by mu.
	tasks map[string]*attempt
	// taskRuns counts the goroutines running tasks, for Runner.Stop.
	taskRuns sync.WaitGroup
	// taskOrphans: tasks in flight whose tool this layer does not have,
	// logged once each (task_runner.go); guarded by mu.
	taskOrphans map[string]bool
	// warnedNoFront: a session without a transport front was logged
	// (task_2025.go, fronted).
	warnedNoFront atomic.Bool
	// started: a Start succeeded once (lifecycle.go, enqueued); guarded
	// by mu.
	started bool
	// warnedUndelivered: effects enqueued by a layer never started were
	// logged (lifecycle.go, enqueued).
	warnedUndelivered atomic.Bool
	// warnedCooperating: a proxy's upstream that records its own
	// outcomes without --cooperating was logged (remote.go).
	warnedCooperating atomic.Bool
	// plainTools: tools registered with mcp.AddTool on a server of the
	// layer, whose first call was logged (servers.go); name → struct{}.
	plainTools sync.Map
	// unrecordingTools: a cooperating proxy's tools that answered without
	// recording, logged once each (remote.go); name → struct{}.
	unrecordingTools sync.Map
	// taskTick is closed when a task of this layer ends or is asked to
	// cancel, waking the listens that watch tasks (task_listen.go);
	// guarded by mu.
	taskTick chan struct{}
	// remoteTasks: the proxy's tools that run tasks (task_remote.go);
	// guarded by mu.
	remoteTasks *serverTools
}

// ErrKeyRequired is the error of [New] (tested with errors.Is) on an
// encrypted database without [Options].Keys (serve's
// --encryption-key-file), or with one whose key file lacks the key that
// wraps the hash key: the layer would store new values in plaintext, or
// hash arguments without the database's secret, and run a keyless retry
// of a recorded call again. Give the key file; to turn encryption off,
// run mcp-outbox encryption decrypt first.
var ErrKeyRequired = sealing.ErrKeyRequired

// New returns a layer on db. The database must have been opened with
// [schema.Open], which applies the outbox migrations. It fails with
// [ErrKeyRequired] when the database is encrypted and opts lacks the key
// it needs (see [Options].Keys).
func New(db *schema.DB, opts *Options) (*Layer, error) {
	if db == nil {
		return nil, errors.New("outbox: nil database")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.FingerprintWindow == 0 {
		o.FingerprintWindow = defaults.FingerprintWindow
	}
	if o.KeyRetention <= 0 {
		o.KeyRetention = defaults.KeyRetention
	}
	if o.InFlightWait <= 0 {
		o.InFlightWait = defaults.InFlightWait
	}
	if o.Lease <= 0 {
		o.Lease = defaults.Lease
	}
	now := o.Now
	if db.Dialect == schema.Postgres {
		// Replicas on several machines judge each other's leases: they
		// read one clock, the server's (see dbclock).
		now = dbclock.New(db.Read, o.Now).Now
	} else if now == nil {
		// On SQLite every process that shares the file runs on this
		// machine, and reads the one wall clock this machine has, so a
		// lease one process writes means the same to the others. A step
		// of that clock moves every process's view alike: it changes who
		// waits, never how many run (the owner fence decides that, under
		// the write lock), and the dispatcher never reclaims its own
		// deliveries in flight however the clock jumps (dispatch's
		// heldIDs).
		now = time.Now
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxBatchCalls <= 0 {
		o.MaxBatchCalls = defaults.MaxBatchCalls
	}
	if o.MaxBatchWait <= 0 {
		o.MaxBatchWait = defaults.MaxBatchWait
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(minLevel{slog.LevelWarn, slog.Default().Handler()})
	}
	plainUntil, err := checkSealer(context.Background(), db, sealing.Of(o.Keys), logger)
	if err != nil {
		return nil, err
	}
	group := newGroupCommit(db, o.MaxBatchCalls, o.MaxBatchWait, time.Now)
	group.onCommit = func(calls int) { metrics.Commit(o.Metrics, metrics.CommitCalls, calls) }
	l := &Layer{
		db:     db,
		group:  group,
		opts:   o,
		sealer: sealing.Of(o.Keys),
		logger: logger.With("subsystem", "outbox"),
		now:    now,
		self:   currentProcess(),
		tracer: tracerOf(o.TracerProvider),
		local:  map[localKey]*attempt{},
	}
	l.plainFingerprintsUntil.Store(plainUntil)
	return l, nil
}

// OnEnqueue adds f to the functions called after each commit that enqueued
// effects, so that a dispatcher in the same process can start delivering at
// once instead of at its next poll. Functions added earlier stay; a nil f is
// ignored. [Layer.Start] adds its dispatcher's Notify itself. f must not
// block.
func (l *Layer) OnEnqueue(f func()) {
	if f != nil {
		l.addEnqueueHook(f)
	}
}

// CapabilityName is the key under capabilities.experimental where a server
// built with [Layer.NewServer] advertises its idempotency support.
const CapabilityName = "idempotency"

// capability is the value advertised under capabilities.experimental.
func (l *Layer) capability() map[string]any {
	window := int64(0)
	if l.opts.FingerprintWindow > 0 {
		window = int64(l.opts.FingerprintWindow / time.Second)
	}
	return map[string]any{
		"keySources": []string{
			"_meta.idempotencyKey", "params.idempotencyKey", "header:Idempotency-Key",
			"argument:idempotency_key", "fingerprint",
		},
		"maxKeyBytes":              callkey.MaxKeyBytes,
		"fingerprintWindowSeconds": window,
		"keyRetentionSeconds":      int64(l.opts.KeyRetention / time.Second),
		"statusTool":               StatusToolName,
		"replayMetaKey":            MetaKeyCall,
	}
}

// ServerOptions configure a server made by [Layer.NewServer]; nil means
// all defaults.
type ServerOptions struct {
	// MCP are the go-sdk's own server options; nil means its defaults.
	MCP *mcp.ServerOptions
	// Tenant scopes the calls of this server: they are recorded under
	// the caller's principal within the tenant, so servers of different
	// tenants never replay each other's results or block each other's
	// keys, even for the same key and arguments from the same principal;
	// call_status on the server sees its tenant's calls only. Servers of
	// the same tenant share its calls, as a server per request must. Empty
	// means no tenant: the layer's one shared key space. A tenant is 1 to
	// 64 letters, digits, '.', '_' or '-'; NewServer panics on any other.
	// The operator surface shows such a call's principal as
	// "tenant:NAME/PRINCIPAL".
	Tenant string
}

// NewServer creates a go-sdk server that advertises the layer under
// capabilities.experimental, and installs the layer on it (see Install).
func (l *Layer) NewServer(impl *mcp.Implementation, opts *ServerOptions) *mcp.Server {
	var so ServerOptions
	if opts != nil {
		so = *opts
	}
	if err := checkTenant(so.Tenant); err != nil {
		panic(fmt.Sprintf("outbox: Layer.NewServer: %v", err))
	}
	var o mcp.ServerOptions
	if so.MCP != nil {
		o = *so.MCP
	}
	caps := &mcp.ServerCapabilities{}
	if o.Capabilities != nil {
		c := *o.Capabilities
		caps = &c
	}
	exp := map[string]any{}
	for k, v := range caps.Experimental {
		exp[k] = v
	}
	exp[CapabilityName] = l.capability()
	caps.Experimental = exp
	o.Capabilities = caps
	s := mcp.NewServer(impl, &o)
	l.install(s, so.Tenant)
	return s
}

// Install adds the layer's receiving middleware and the status tool to s,
// once: installing again on the same server does nothing. [AddTool] needs
// it. One layer may be installed on many servers, each with its own tools;
// they share the layer's database and key space. A server for a tenant
// is made with NewServer and [ServerOptions.Tenant].
func (l *Layer) Install(s *mcp.Server) { l.install(s, "") }

func (l *Layer) install(s *mcp.Server, tenant string) {
	r, added := l.register(s, tenant)
	if !added {
		return
	}
	s.AddReceivingMiddleware(l.traceMiddleware, l.middlewareFor(r)) // the first is outermost
	l.addStatusTool(s, tenant)
	l.addTaskMethods(s)
}

func (l *Layer) newOwner() string {
	l.mu.Lock()
	l.nextID++
	n := l.nextID
	l.mu.Unlock()
	return fmt.Sprintf("%s#%d", l.self, n)
}

func randomUID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("outbox: read random: %v", err))
	}
	return "call_" + hex.EncodeToString(b[:])
}

func (l *Layer) nowMS() int64 { return l.now().UnixMilli() }

// background returns a context for cleanup that must finish even when the
// call's context is cancelled.
func background(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// minLevel passes on the records of h at level or above.
type minLevel struct {
	level slog.Level
	h     slog.Handler
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.level && m.h.Enabled(ctx, l)
}

func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }

func (m minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{m.level, m.h.WithAttrs(attrs)}
}

func (m minLevel) WithGroup(name string) slog.Handler { return minLevel{m.level, m.h.WithGroup(name)} }

func init() {
	layerinfo.Of = func(l any) layerinfo.Info { return infoOf{l.(*Layer)} }
}

// infoOf is the layer as the operator surface sees it (layerinfo.Info).
type infoOf struct{ l *Layer }

func (i infoOf) Started() bool      { return i.l.everStarted() }
func (i infoOf) Keys() seal.KeyRing { return i.l.opts.Keys }
