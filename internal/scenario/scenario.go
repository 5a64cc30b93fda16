// Package scenario reproduces the four ways one logical MCP tool call became
// several actual calls in a measurement with the reference SDKs (2, 2, 2 and
// 3 charges), against a real `mcp-outbox serve` process: once without the
// layer (serve --bare), and twice with it (with an idempotency key, and
// without one, where the layer falls back to a fingerprint of tool and
// arguments).
//
// Each run starts its own server processes on its own fresh SQLite file and,
// when the client is done, counts the rows of the ledger's charges table: one
// row is one actual charge. The client is the go-sdk client, as a caller would
// use it: it gives up after a timeout (which sends notifications/cancelled),
// restarts a server that died, or sits inside a retry policy that re-runs the
// whole step.
//
// [Run] runs one scenario in one mode; [RunAll] runs them all, a few at
// once, into the [Report] `mcp-outbox demo` prints.
package scenario

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ID names a scenario.
type ID string

// The scenarios, in the order of the write-up. The Streamable HTTP scenario
// runs twice: with a session (protocol 2025-11-25) and stateless
// (2026-07-28), because the two cancel differently.
const (
	// Timeout: stdio; the client times out on a slow charge (the go-sdk
	// sends notifications/cancelled), then retries with a longer timeout.
	Timeout ID = "timeout"
	// Crash: stdio; the server is SIGKILLed while the charge is in progress,
	// the client restarts it on the same database and retries.
	Crash ID = "crash"
	// HTTPSession: Streamable HTTP with a session (2025-11-25); the client
	// times out and retries.
	HTTPSession ID = "http-session"
	// HTTPStateless: Streamable HTTP, stateless (2026-07-28, the go-sdk
	// client's default); the client times out and retries.
	HTTPStateless ID = "http-stateless"
	// FrameworkRetry: an agent framework's retry policy (modelled on
	// LangGraph's RetryPolicy) re-runs a node that failed after its charge
	// returned, and the charge with it.
	FrameworkRetry ID = "framework-retry"
)

// Scenario describes one scenario.
type Scenario struct {
	ID ID `json:"id"`
	// Number is the scenario's number in the write-up; the HTTP variants
	// are 3a and 3b.
	Number    string `json:"number"`
	Title     string `json:"title"`
	Transport string `json:"transport"`
	// Retrier is who sends the repeated call.
	Retrier string `json:"retrier"`
	// LogicalCalls is how many charges the caller meant to make.
	LogicalCalls int `json:"logical_calls"`
	// Calls is how many tools/call requests the client sends for them.
	Calls int `json:"calls"`
}

var scenarios = []Scenario{
	{ID: Timeout, Number: "1", Title: "client timeout, retry", Transport: "stdio",
		Retrier: "caller", LogicalCalls: 1, Calls: 2},
	{ID: Crash, Number: "2", Title: "server killed mid-call, retry", Transport: "stdio",
		Retrier: "caller, after restarting the server", LogicalCalls: 1, Calls: 2},
	{ID: HTTPSession, Number: "3a", Title: "client timeout, retry", Transport: "HTTP, session (2025-11-25)",
		Retrier: "caller", LogicalCalls: 1, Calls: 2},
	{ID: HTTPStateless, Number: "3b", Title: "client timeout, retry", Transport: "HTTP, stateless (2026-07-28)",
		Retrier: "caller", LogicalCalls: 1, Calls: 2},
	{ID: FrameworkRetry, Number: "4", Title: "node fails after the call", Transport: "stdio",
		Retrier: fmt.Sprintf("framework RetryPolicy, %d attempts", nodeAttempts), LogicalCalls: 1, Calls: nodeAttempts},
}

// All returns the scenarios in order.
func All() []Scenario { return append([]Scenario(nil), scenarios...) }

// Lookup returns the scenario named id.
func Lookup(id ID) (Scenario, bool) {
	for _, s := range scenarios {
		if s.ID == id {
			return s, true
		}
	}
	return Scenario{}, false
}

// Mode is how the server runs and whether the client sends a key.
type Mode string

// The modes every scenario runs in.
const (
	// Bare runs `serve --bare`: the same ledger without the layer.
	Bare Mode = "bare"
	// LayerKey runs the layer; the client sends _meta.idempotencyKey, the
	// same on every attempt of the logical call.
	LayerKey Mode = "layer+key"
	// LayerNoKey runs the layer; the client sends no key, as most clients
	// do today, and the layer recognises the retry by its fingerprint.
	LayerNoKey Mode = "layer+no-key"
)

// Modes returns the modes in the order of the demo's columns.
func Modes() []Mode { return []Mode{Bare, LayerKey, LayerNoKey} }

// Config configures a run.
type Config struct {
	// Binary is the mcp-outbox executable to run as the server.
	Binary string
	// Dir is where each run creates its own directory with a fresh SQLite
	// file. It must exist.
	Dir string
	// Delay is how long charge takes (serve --demo-delay) in the scenarios
	// that need a call to be in progress; zero means DefaultDelay.
	Delay time.Duration
	// Timeout is the client's timeout on the first attempt in the timeout
	// scenarios; it must be well below Delay. Zero means DefaultTimeout.
	Timeout time.Duration
	// RetryTimeout bounds each later attempt, which may wait for the
	// original; zero means Delay plus 20 seconds.
	RetryTimeout time.Duration
	// ServerLog receives the servers' stderr; nil discards it.
	ServerLog io.Writer
	// Logf receives a line per step of a run; nil discards them.
	Logf func(format string, args ...any)
	// Server describes the server to run; the zero value is
	// `Binary serve`, the demo's.
	Server Server
}

// Server describes the tool server the scenarios drive, when it is not
// `mcp-outbox serve` (say, `mcp-outbox proxy` in front of another server).
// Every field left at zero keeps serve's behaviour.
type Server struct {
	// Command returns an unstarted server process for the run's SQLite
	// file db in mode, whose charge takes delay (zero: no delay). It speaks
	// MCP on stdio, or, when http is set, serves Streamable HTTP on a free
	// loopback port and prints "serving MCP at URL" on stderr. Its Stderr
	// is set by the run. It must be the server itself, not a shell, so that
	// the crash scenario's SIGKILL reaches it. nil: `Binary serve`.
	Command func(db string, mode Mode, delay time.Duration, http bool) (*exec.Cmd, error)
	// Prepare runs once per run, on the path of the run's fresh database,
	// before the first server starts; nil does nothing.
	Prepare func(ctx context.Context, db string) error
	// ChargeArgs are the arguments of tool "charge", the same on every
	// attempt; nil: {"amount": 4200, "currency": "usd"}.
	ChargeArgs map[string]any
	// ChargeIDField names the charge's id in the structured content of
	// charge's answer; "": "charge_id".
	ChargeIDField string
	// CountCharges is the query that counts the charges made, one row per
	// actual charge; "": SELECT count(*) FROM charges.
	CountCharges string
	// SessionsOnly says the server serves Streamable HTTP with sessions
	// only (protocol 2025-11-25 at most). Scenario 3b's client still asks
	// for its default, the stateless 2026-07-28, and then goes on over the
	// session the server negotiates, instead of failing the run.
	SessionsOnly bool
}

// defaultChargeArgs are serve's charge arguments.
var defaultChargeArgs = map[string]any{"amount": 4200, "currency": "usd"}

// Defaults for Config fields left at zero. The margin between them is what
// makes the first attempt time out while the charge is in progress.
const (
	DefaultDelay   = 800 * time.Millisecond
	DefaultTimeout = 250 * time.Millisecond
)

// startTimeout bounds starting a server and connecting to it, and each wait
// for something observable in the database.
const startTimeout = 20 * time.Second

func (cfg Config) withDefaults() (Config, error) {
	if cfg.Binary == "" {
		return cfg, errors.New("scenario: no server binary")
	}
	if cfg.Dir == "" {
		return cfg, errors.New("scenario: no directory for databases")
	}
	if cfg.Delay == 0 {
		cfg.Delay = DefaultDelay
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Delay < 0 || cfg.Timeout < 0 || cfg.RetryTimeout < 0 {
		return cfg, errors.New("scenario: durations must not be negative")
	}
	if cfg.Timeout >= cfg.Delay {
		// Otherwise the first attempt does not time out and nothing is
		// reproduced.
		return cfg, fmt.Errorf("scenario: timeout %v must be shorter than delay %v", cfg.Timeout, cfg.Delay)
	}
	if cfg.RetryTimeout == 0 {
		cfg.RetryTimeout = cfg.Delay + 20*time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.ServerLog == nil {
		cfg.ServerLog = io.Discard
	}
	if cfg.Server.ChargeArgs == nil {
		cfg.Server.ChargeArgs = defaultChargeArgs
	}
	if cfg.Server.ChargeIDField == "" {
		cfg.Server.ChargeIDField = "charge_id"
	}
	if cfg.Server.CountCharges == "" {
		cfg.Server.CountCharges = `SELECT count(*) FROM charges`
	}
	return cfg, nil
}

// Attempt is one tools/call the client sent for the logical call.
type Attempt struct {
	// Err is the client's error; nil when the server answered.
	Err error `json:"-"`
	// Error is Err's text.
	Error string `json:"error,omitempty"`
	// ChargeID is the charge_id of the answer.
	ChargeID int64 `json:"charge_id,omitempty"`
	// Replayed says the layer answered with the recorded result of an
	// earlier attempt instead of running charge.
	Replayed bool `json:"replayed,omitempty"`
	// ToolError is the text of an isError answer.
	ToolError string `json:"tool_error,omitempty"`
	// NodeErr is, in the framework scenario, the error the node failed
	// with after the tool had answered.
	NodeErr error `json:"-"`
	// NodeError is NodeErr's text.
	NodeError string `json:"node_error,omitempty"`
	// ElapsedMS is how long the call took, in milliseconds.
	ElapsedMS int64 `json:"elapsed_ms"`
	// What says what happened, in words.
	What string `json:"what"`
}

// Result is what a run observed.
type Result struct {
	Scenario ID   `json:"scenario"`
	Mode     Mode `json:"mode"`
	// LogicalCalls is how many charges the caller meant to make.
	LogicalCalls int `json:"logical_calls"`
	// Calls is how many tools/call requests the client sent.
	Calls int `json:"calls"`
	// Charges is the number of rows in the charges table of the run's
	// database once every server process has exited.
	Charges int `json:"charges"`
	// Attempts are the client's calls, in order.
	Attempts []Attempt `json:"attempts"`
	// DB is the run's SQLite file.
	DB string `json:"db,omitempty"`
	// ElapsedMS is how long the run took, in milliseconds.
	ElapsedMS int64 `json:"elapsed_ms"`
}

// Run runs scenario id in mode with a fresh database and reports what
// happened. An error means the scenario could not be run (a server did not
// start, the database could not be read); whether it reproduced what it is
// about is for [Result.Check].
func Run(ctx context.Context, cfg Config, id ID, mode Mode) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	sc, ok := Lookup(id)
	if !ok {
		return Result{}, fmt.Errorf("scenario: unknown scenario %q", id)
	}
	switch mode {
	case Bare, LayerKey, LayerNoKey:
	default:
		return Result{}, fmt.Errorf("scenario: unknown mode %q", mode)
	}
	dir, err := os.MkdirTemp(cfg.Dir, string(id)+"-"+strings.NewReplacer("+", "-").Replace(string(mode))+"-")
	if err != nil {
		return Result{}, fmt.Errorf("create run directory: %w", err)
	}
	r := &run{cfg: cfg, mode: mode, db: filepath.Join(dir, "ledger.db"), key: newKey(id)}
	r.logf("%s/%s: database %s", id, mode, r.db)
	if cfg.Server.Prepare != nil {
		if err := cfg.Server.Prepare(ctx, r.db); err != nil {
			return Result{}, fmt.Errorf("%s/%s: prepare database: %w", id, mode, err)
		}
	}
	start := time.Now()
	res := Result{Scenario: id, Mode: mode, LogicalCalls: sc.LogicalCalls, DB: r.db}
	switch id {
	case Timeout:
		err = r.timeoutStdio(ctx)
	case Crash:
		err = r.crash(ctx)
	case HTTPSession:
		err = r.timeoutHTTP(ctx, "2025-11-25")
	case HTTPStateless:
		err = r.timeoutHTTP(ctx, "")
	case FrameworkRetry:
		err = r.frameworkRetry(ctx)
	}
	res.Attempts = r.attempts
	res.Calls = len(r.attempts)
	res.ElapsedMS = time.Since(start).Milliseconds()
	if err != nil {
		return res, fmt.Errorf("%s/%s: %w", id, mode, err)
	}
	// Every server process has exited by now, so the count is final.
	if res.Charges, err = countCharges(ctx, r.db, cfg.Server.CountCharges); err != nil {
		return res, fmt.Errorf("%s/%s: %w", id, mode, err)
	}
	r.logf("%s/%s: %d tools/call, %d charges", id, mode, res.Calls, res.Charges)
	return res, nil
}

// Check reports whether the run reproduced its scenario: the first attempt
// failed the way the scenario is about, and the logical call ended with a
// charge. Without that, a count of 1 would prove nothing.
func (r Result) Check() error {
	if len(r.Attempts) == 0 {
		return fmt.Errorf("%s/%s: no attempt was made", r.Scenario, r.Mode)
	}
	first, last := r.Attempts[0], r.Attempts[len(r.Attempts)-1]
	switch r.Scenario {
	case Timeout, HTTPSession, HTTPStateless:
		if !errors.Is(first.Err, context.DeadlineExceeded) {
			return fmt.Errorf("%s/%s: the first attempt did not time out (%s)", r.Scenario, r.Mode, first.What)
		}
	case Crash:
		if !ConnectionClosed(first.Err) {
			return fmt.Errorf("%s/%s: the first attempt did not fail with a closed connection (%s)", r.Scenario, r.Mode, first.What)
		}
	case FrameworkRetry:
		if len(r.Attempts) != nodeAttempts {
			return fmt.Errorf("%s/%s: the node ran %d times, want %d", r.Scenario, r.Mode, len(r.Attempts), nodeAttempts)
		}
		for i, a := range r.Attempts[:nodeAttempts-1] {
			if a.Err != nil || a.ChargeID == 0 || !isConnectionError(a.NodeErr) {
				return fmt.Errorf("%s/%s: attempt %d did not get a charge and then fail with a connection error (%s)",
					r.Scenario, r.Mode, i+1, a.What)
			}
		}
	}
	if last.Err != nil || last.ToolError != "" || last.ChargeID == 0 || last.NodeErr != nil {
		return fmt.Errorf("%s/%s: the last attempt did not end with a charge (%s)", r.Scenario, r.Mode, last.What)
	}
	return nil
}

// ConnectionClosed reports whether err is the go-sdk client's error for a
// call whose connection went away under it: an EOF from a server that died,
// or the SDK's ErrConnectionClosed when the session was closing.
func ConnectionClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, mcp.ErrConnectionClosed)
}

// run is the state of one Run.
type run struct {
	cfg      Config
	mode     Mode
	db       string
	key      string // the logical call's idempotency key, in mode LayerKey
	attempts []Attempt
}

func (r *run) logf(format string, args ...any) { r.cfg.Logf(format, args...) }

// newKey returns a fresh idempotency key for one logical call.
func newKey(id ID) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "demo-" + string(id) + "-" + hex.EncodeToString(b[:])
}
