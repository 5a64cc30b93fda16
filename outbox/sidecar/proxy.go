package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
)

// Defaults for [Options] fields left at zero.
const (
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
	// DefaultInitTimeout bounds the re-initialization of a restarted upstream.
	DefaultInitTimeout = 30 * time.Second
	// DefaultCallTimeout bounds the wait for the upstream's answer to a
	// forwarded tools/call.
	DefaultCallTimeout = 10 * time.Minute
	// DefaultSessionIdleTimeout ends an HTTP session (and its upstream)
	// that saw no request for this long.
	DefaultSessionIdleTimeout = 10 * time.Minute
	// DefaultMaxSessions and DefaultMaxSessionsPerPrincipal bound the HTTP
	// sessions open at once. A node upstream costs about 90 MB a session;
	// the official conformance suite opens 32 in one run, all of one
	// principal, and closes none.
	DefaultMaxSessions             = 100
	DefaultMaxSessionsPerPrincipal = 50
)

// A Dialer makes a new connection to the upstream: for a command, it starts
// a new process.
type Dialer interface {
	Dial(ctx context.Context) (mcp.Connection, error)
	String() string
}

// Options configure a [Proxy].
type Options struct {
	// Layer records calls; required.
	Layer *outbox.Layer
	// Upstream connects to the tool server; required.
	Upstream Dialer
	// Cooperating says the upstream records its calls' outcomes itself
	// (schema/README.md).
	Cooperating bool
	// Logger gets the proxy's logs; nil discards them.
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before restarting an
	// upstream that died; it doubles from Min to Max, and starts again at
	// Min after the upstream ran for a minute.
	MinBackoff, MaxBackoff time.Duration
	// InitTimeout bounds re-initializing a restarted upstream.
	InitTimeout time.Duration
	// CallTimeout bounds the wait for the upstream's answer to a client's
	// forwarded tools/call, whether or not the client still waits; 0 means
	// DefaultCallTimeout. When it passes, the call is settled as for a lost
	// answer (unknown, unless a cooperating upstream recorded its outcome)
	// and the client gets an error saying so. Tasks are not bounded by it.
	CallTimeout time.Duration
	// SessionIdleTimeout ends an HTTP session (see [Proxy.HTTPHandler]),
	// and stops its upstream, once it has had no request open and no
	// tools/call running for this long; 0 means DefaultSessionIdleTimeout.
	SessionIdleTimeout time.Duration
	// MaxSessions and MaxSessionsPerPrincipal bound the HTTP sessions open
	// at once, in all and per principal; 0 means the defaults. A new
	// session beyond either is refused (503 and 429) with a JSON-RPC error
	// that names the limit.
	MaxSessions, MaxSessionsPerPrincipal int
	// Tasks makes the named tools' calls tasks of the 2026-07-28 Tasks
	// extension (see outbox.TaskOptions and "Tasks" in the outbox package
	// doc): the proxy answers with CreateTaskResult once the task is
	// durable, forwards the call over an upstream session of its own, and
	// answers tasks/get, tasks/update and tasks/cancel from the database.
	// Call [Proxy.Close] when done.
	Tasks map[string]outbox.TaskOptions
	// Retention overrides, by tool name, how long the named tools' calls
	// are remembered and kept (outbox.ToolRetention); tools not named keep
	// the layer's and the purge's defaults. New refuses a retention that
	// outbox.AddTool would.
	Retention map[string]outbox.ToolRetention
	// AllowedOrigins are the origins, besides the server's own, whose web
	// pages may use [Proxy.HTTPHandler], as mcphttp.Options.AllowedOrigins
	// are for mcphttp.NewHandler: any other Origin header gets 403, no
	// Origin header is served. Nil allows the own origin only.
	AllowedOrigins []string
}

// A Proxy serves client connections, each with its own upstream connection.
type Proxy struct {
	opts   Options
	layer  remote.Layer // opts.Layer, with what the proxy needs of it
	logger *slog.Logger
	tracer trace.Tracer // the forwarded calls' spans (trace.go)

	mu    sync.Mutex
	tools map[string]remote.Tool // by name, from the upstream's tools/list

	// The proxy's own upstream session, which forwards tasks (task_session.go).
	tasks     *session
	stopTasks context.CancelFunc
	closed    bool
	taskWG    sync.WaitGroup

	// The client sessions being served, which Close ends and waits for
	// (bounds.go).
	serving serving
}

// New returns a proxy.
func New(opts Options) (*Proxy, error) {
	if opts.Layer == nil || opts.Upstream == nil {
		return nil, errors.New("proxy: Layer and Upstream are required")
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(DefaultMaxBackoff, opts.MinBackoff)
	}
	if opts.InitTimeout <= 0 {
		opts.InitTimeout = DefaultInitTimeout
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.SessionIdleTimeout <= 0 {
		opts.SessionIdleTimeout = DefaultSessionIdleTimeout
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.MaxSessionsPerPrincipal <= 0 {
		opts.MaxSessionsPerPrincipal = DefaultMaxSessionsPerPrincipal
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for name, t := range opts.Tasks {
		if t.Mode == outbox.TasksNever {
			delete(opts.Tasks, name)
		}
	}
	layer := remote.Of(opts.Layer)
	for name, r := range opts.Retention {
		if err := layer.CheckRetention(r.Key, r.Outcome); err != nil {
			return nil, fmt.Errorf("proxy: tool %q: %w", name, err)
		}
	}
	p := &Proxy{opts: opts, layer: layer, logger: logger.With("subsystem", "proxy"), tools: map[string]remote.Tool{},
		tracer: layer.TracerProvider().Tracer(tracerName), serving: serving{ended: make(chan struct{})}}
	// The task runner of the layer's Start looks for the tools of tasks
	// whose owner died before any client lists them: register them now.
	for name := range opts.Tasks {
		p.remoteTool(name)
	}
	return p, nil
}

// anyTasks reports whether a tool may become a task.
func (p *Proxy) anyTasks() bool { return len(p.opts.Tasks) > 0 }

// remoteTool is how the layer treats the named upstream tool. A tool the
// upstream has not listed (the client called it without tools/list) is
// treated by the spec's default annotations: recorded.
func (p *Proxy) remoteTool(name string) remote.Tool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.tools[name]; t != nil {
		return t
	}
	t := p.layer.Tool(name, nil, p.remoteOptions(name))
	p.tools[name] = t
	return t
}

// learnTools records the annotations of the tools in a tools/list answer.
func (p *Proxy) learnTools(tools []*mcp.Tool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range tools {
		if t == nil || t.Name == "" || t.Name == outbox.StatusToolName {
			continue
		}
		p.tools[t.Name] = p.layer.Tool(t.Name, t, p.remoteOptions(t.Name))
	}
}

func (p *Proxy) remoteOptions(name string) remote.Options {
	o := remote.Options{Cooperating: p.opts.Cooperating}
	if r, ok := p.opts.Retention[name]; ok {
		o.KeyRetention, o.OutcomeRetention = r.Key, r.Outcome
	}
	if t, ok := p.opts.Tasks[name]; ok {
		o.Tasks = remote.TaskOptions{Mode: int(t.Mode), After: t.After, PollInterval: t.PollInterval, TTL: t.TTL}
		o.Stored = p.forwardStored
	}
	return o
}
