package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

const serveUsage = `Usage: mcp-outbox serve [flags]

Runs the example payments ledger as an MCP server: tools charge {amount,
currency?}, refund {charge_id}, balance {} and call_status, with every
side-effecting call recorded so that a retry replays instead of charging again.

Serves stdio by default (for desktop MCP clients that start the server), or
Streamable HTTP at /mcp with --http. Logs go to stderr only.

Every flag can also be set in the environment (shown in brackets); a flag wins.`

// appConfig is what serve (and demo) need to build the example server.
type appConfig struct {
	db           string
	durability   string
	dests        []string
	demoDelay    time.Duration
	fingerprint  time.Duration
	inFlightWait time.Duration
	lease        time.Duration
	bare         bool
	logLevel     string
	logger       *slog.Logger
}

// app is a running example server: database, layer and MCP server.
type app struct {
	db     *schema.DB
	layer  *outbox.Layer // nil when bare
	server *mcp.Server
	dests  map[string]*url.URL
}

func (cfg *appConfig) flags(env *environment, fs *flag.FlagSet) error {
	fs.StringVar(&cfg.db, "db", env.envDefault("MCP_OUTBOX_DB", "./mcp-outbox.db"), "SQLite database `file`, created if missing [MCP_OUTBOX_DB]")
	fs.StringVar(&cfg.durability, "durability", env.envDefault("MCP_OUTBOX_DURABILITY", "full"),
		"full: a commit survives power loss; normal: survives a process crash, not a power loss, ~10x faster commits [MCP_OUTBOX_DURABILITY]")
	fs.Var((*multiFlag)(&cfg.dests), "dest", "destination `NAME=URL` for effects, repeatable [MCP_OUTBOX_DEST_<NAME>=URL]")
	delay, err := env.envDuration("MCP_OUTBOX_DEMO_DELAY", 0)
	if err != nil {
		return err
	}
	fs.DurationVar(&cfg.demoDelay, "demo-delay", delay, "simulated processing time inside charge, to reproduce client timeouts [MCP_OUTBOX_DEMO_DELAY]")
	window, err := env.envDuration("MCP_OUTBOX_FINGERPRINT_WINDOW", outbox.DefaultFingerprintWindow)
	if err != nil {
		return err
	}
	fs.DurationVar(&cfg.fingerprint, "fingerprint-window", window,
		"how long a call without an idempotency key is recognised by its tool and arguments; 0 turns it off [MCP_OUTBOX_FINGERPRINT_WINDOW]")
	wait, err := env.envDuration("MCP_OUTBOX_IN_FLIGHT_WAIT", outbox.DefaultInFlightWait)
	if err != nil {
		return err
	}
	fs.DurationVar(&cfg.inFlightWait, "in-flight-wait", wait,
		"how long a duplicate waits for the original call's outcome before an \"in progress\" error [MCP_OUTBOX_IN_FLIGHT_WAIT]")
	lease, err := env.envDuration("MCP_OUTBOX_LEASE", outbox.DefaultLease)
	if err != nil {
		return err
	}
	fs.DurationVar(&cfg.lease, "lease", lease,
		"how long a running call's claim keeps other processes on the same database from taking it over; 0 means the default [MCP_OUTBOX_LEASE]")
	fs.BoolVar(&cfg.bare, "bare", false, "run the ledger WITHOUT the outbox layer: every retry charges again (for demonstrations)")
	fs.StringVar(&cfg.logLevel, "log-level", env.envDefault("MCP_OUTBOX_LOG_LEVEL", "info"), "debug, info, warn or error [MCP_OUTBOX_LOG_LEVEL]")
	return nil
}

// destinations merges MCP_OUTBOX_DEST_<NAME> with --dest (flags win).
func (cfg *appConfig) destinations(env *environment) (map[string]*url.URL, error) {
	out := map[string]*url.URL{}
	for _, kv := range append(env.envPrefixed("MCP_OUTBOX_DEST_"), cfg.dests...) {
		name, raw, ok := strings.Cut(kv, "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok || name == "" {
			return nil, usagef("destination %q: want NAME=URL", kv)
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, usagef("destination %s: %q is not an http(s) URL", name, raw)
		}
		out[name] = u
	}
	return out, nil
}

func openApp(ctx context.Context, env *environment, cfg *appConfig) (*app, error) {
	dur, err := schema.ParseDurability(cfg.durability)
	if err != nil {
		return nil, usageError{err}
	}
	dests, err := cfg.destinations(env)
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"fingerprint-window", cfg.fingerprint}, {"in-flight-wait", cfg.inFlightWait}, {"demo-delay", cfg.demoDelay}, {"lease", cfg.lease}} {
		if d.v < 0 {
			return nil, usagef("--%s %v: must not be negative", d.flag, d.v)
		}
	}
	logger := cfg.logger
	if logger == nil {
		if logger, err = newLogger(env.stderr, cfg.logLevel); err != nil {
			return nil, err
		}
	}
	db, err := schema.Open(ctx, cfg.db, &schema.Options{Durability: dur})
	if err != nil {
		return nil, err
	}
	if err := ledger.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	impl := &mcp.Implementation{Name: "mcp-outbox-ledger", Title: "mcp-outbox example payments ledger", Version: version}
	a := &app{db: db, dests: dests}
	lopts := &ledger.Options{Delay: cfg.demoDelay}
	if cfg.bare {
		a.server = mcp.NewServer(impl, &mcp.ServerOptions{Logger: logger.With("subsystem", "mcp")})
		ledger.RegisterBare(db, a.server, lopts)
		return a, nil
	}
	window := cfg.fingerprint
	if window == 0 {
		window = outbox.FingerprintOff
	}
	a.layer, err = outbox.New(db, &outbox.Options{Logger: logger, FingerprintWindow: window, InFlightWait: cfg.inFlightWait, Lease: cfg.lease})
	if err != nil {
		db.Close()
		return nil, err
	}
	a.server = a.layer.NewServer(impl, &mcp.ServerOptions{Logger: logger.With("subsystem", "mcp")})
	ledger.Register(a.layer, a.server, lopts)
	return a, nil
}

func (a *app) Close() error { return a.db.Close() }

// version is set by the linker for releases.
var version = "dev"

func runServe(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "serve", serveUsage)
	var cfg appConfig
	if err := cfg.flags(env, fs); err != nil {
		return err
	}
	httpAddr := fs.String("http", env.envDefault("MCP_OUTBOX_HTTP", ""), "serve Streamable HTTP at `ADDR` (e.g. 127.0.0.1:8080) instead of stdio [MCP_OUTBOX_HTTP]")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *httpAddr != "" {
		// Checked before the database is opened, so that a typo creates no file.
		if _, _, err := net.SplitHostPort(*httpAddr); err != nil {
			return usagef("--http %q: want HOST:PORT (%v)", *httpAddr, err)
		}
	}
	a, err := openApp(ctx, env, &cfg)
	if err != nil {
		return err
	}
	defer a.Close()
	logger, _ := newLogger(env.stderr, cfg.logLevel)
	if len(a.dests) > 0 {
		logger.Info("destinations configured; effects are queued in the outbox table", "count", len(a.dests))
	}
	if *httpAddr != "" {
		return serveHTTP(ctx, a, *httpAddr, logger, env.stderr)
	}
	logger.Info("serving MCP on stdio", "db", cfg.db, "outbox", !cfg.bare)
	err = a.server.Run(ctx, outbox.WrapTransport(&lineTransport{in: env.stdin, out: env.stdout, logger: logger}))
	if ctx.Err() != nil || err == io.EOF {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve stdio: %w", err)
	}
	return nil
}

// lineTransport is serve's stdio transport: newline-delimited JSON-RPC on
// the command's own streams. The go-sdk's stdio transport ends the whole
// session at the first line that is not a JSON-RPC message, taking every
// call in flight with it; a client's one bad line should cost one error
// response, as JSON-RPC 2.0 asks. So lineTransport answers such lines itself
// and hands only well-formed messages to the SDK.
type lineTransport struct {
	in     io.Reader
	out    io.Writer
	logger *slog.Logger
}

// maxLineBytes bounds one inbound message, as the SDK's own default does.
const maxLineBytes = mcp.DefaultMaxLineLength

func (t *lineTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	out := &lockedWriter{w: t.out}
	pr, pw := io.Pipe()
	// This goroutine outlives the session if t.in never returns from Read,
	// like the SDK's own reader of stdin: there is no portable way to
	// interrupt it.
	go func() { pw.CloseWithError(t.filter(pw, out)) }()
	return (&mcp.IOTransport{Reader: pr, Writer: out, MaxLineLength: -1}).Connect(ctx)
}

// filter copies well-formed lines of t.in to sdk and answers the others on
// out. It returns nil at the end of the input, which the SDK sees as EOF.
func (t *lineTransport) filter(sdk *io.PipeWriter, out io.Writer) error {
	br := bufio.NewReaderSize(t.in, 64*1024)
	for {
		line, tooLong, rerr := readLine(br, maxLineBytes)
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 || tooLong {
			if reply := checkMessage(trimmed, tooLong); reply != nil {
				t.logger.Warn("rejected a malformed JSON-RPC message on stdin", "error", reply.Error.Message)
				if _, err := out.Write(reply.encode()); err != nil {
					return fmt.Errorf("write error response: %w", err)
				}
			} else if _, err := sdk.Write(append(trimmed, '\n')); err != nil {
				return err // the session is closed
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read stdin: %w", rerr)
		}
	}
}

// readLine reads up to and including the next newline. A line longer than
// limit is consumed but not returned, and reported as tooLong.
func readLine(br *bufio.Reader, limit int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > limit {
				line, tooLong = nil, true
			} else {
				line = append(line, chunk...)
			}
		}
		if err != bufio.ErrBufferFull {
			return line, tooLong, err
		}
	}
}

// errorReply is a JSON-RPC error response to a message the SDK never sees.
type errorReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (r *errorReply) encode() []byte {
	b, _ := json.Marshal(r) // only strings, numbers and valid raw JSON
	return append(b, '\n')
}

// checkMessage returns the error response for a line that is not a
// JSON-RPC message (or a non-empty batch of them), or nil for a good one.
func checkMessage(line []byte, tooLong bool) *errorReply {
	r := &errorReply{JSONRPC: "2.0", ID: json.RawMessage("null")}
	switch {
	case tooLong:
		r.Error.Code = jsonrpc.CodeInvalidRequest
		r.Error.Message = fmt.Sprintf("Invalid Request: message longer than %d bytes", maxLineBytes)
		return r
	case !json.Valid(line):
		r.Error.Code = jsonrpc.CodeParseError
		r.Error.Message = "Parse error: the line is not valid JSON"
		return r
	}
	msgs := []json.RawMessage{line}
	if line[0] == '[' {
		// Into a fresh slice: unmarshalling into msgs would reuse its
		// element, which shares line's memory, and overwrite the line.
		var batch []json.RawMessage
		if json.Unmarshal(line, &batch) != nil || len(batch) == 0 {
			r.Error.Code = jsonrpc.CodeInvalidRequest
			r.Error.Message = "Invalid Request: empty batch"
			return r
		}
		msgs = batch
	}
	for _, m := range msgs {
		if _, err := jsonrpc.DecodeMessage(m); err != nil {
			// Answer under the request's id when it has a usable one, so the
			// client can match the error to its request.
			var probe struct {
				ID json.RawMessage `json:"id"`
			}
			if len(msgs) == 1 && json.Unmarshal(m, &probe) == nil && validID(probe.ID) {
				r.ID = probe.ID
			}
			r.Error.Code = jsonrpc.CodeInvalidRequest
			r.Error.Message = fmt.Sprintf("Invalid Request: %v", err)
			return r
		}
	}
	return nil
}

// validID reports whether raw is a JSON-RPC id: a string or a number.
func validID(raw json.RawMessage) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch v.(type) {
	case string, float64:
		return true
	}
	return false
}

// lockedWriter serializes whole-message writes of the SDK and of the
// filter, so that their lines never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Close leaves the underlying stream open: it belongs to the command.
func (l *lockedWriter) Close() error { return nil }
