package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The interop matrix: clients that nobody on this project wrote (the
// official TypeScript and Python SDKs, LangGraph in both languages with
// their MCP adapters) run the four seed scenarios against `serve` and
// against `proxy` in front of a TypeScript and a Python upstream, with a
// key and without one. Every run must end with exactly one row in the
// charges table, every answer naming it, the last attempt answered with
// it, and exactly one distinct Idempotency-Key delivered downstream. Runs
// against `serve --bare` (the same ledger without the layer) must show the
// duplicates, or the one charge above would prove nothing.
//
// A client is an external program (testdata/ts-client/matrix.mjs,
// testdata/langgraph-js/graph.mjs, testdata/python/client.py and graph.py)
// that runs one scenario from a plan file and prints a report as its last
// line of stdout (the contract is matrixPlan and matrixReport below). The
// program reports what its library did; this file judges it. A client that
// cannot print a report has a run function instead: Claude Code's
// (claudecode_test.go) builds it from what its scripted model saw.

// matrixPlan is the plan file a client program reads.
type matrixPlan struct {
	Scenario       string         `json:"scenario"`
	Key            string         `json:"key,omitempty"`
	Server         *matrixCommand `json:"server,omitempty"`
	URL            string         `json:"url,omitempty"`
	DB             string         `json:"db"`
	KillWhen       string         `json:"killWhen,omitempty"`
	Tool           string         `json:"tool"`
	Arguments      map[string]any `json:"arguments"`
	ChargeIDField  string         `json:"chargeIdField"`
	TimeoutMS      int64          `json:"timeoutMs"`
	RetryTimeoutMS int64          `json:"retryTimeoutMs"`
	NodeAttempts   int            `json:"nodeAttempts"`
}

// matrixCommand is a stdio server the client spawns itself, directly.
type matrixCommand struct {
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
}

// matrixReport is what a client program prints.
type matrixReport struct {
	Client          string            `json:"client"`
	Versions        map[string]string `json:"versions"`
	ProtocolVersion string            `json:"protocolVersion"`
	Tools           []string          `json:"tools"`
	Attempts        []matrixAttempt   `json:"attempts"`
	Error           string            `json:"error"`
}

type matrixAttempt struct {
	What      string `json:"what"`
	ErrorKind string `json:"errorKind"` // "", "timeout", "closed", "other"
	Error     string `json:"error"`
	ToolError string `json:"toolError"`
	ChargeID  int64  `json:"chargeId"`
	Replayed  *bool  `json:"replayed"` // nil where the client hides _meta
	// Joined: the result says the retry joined a call still running
	// (Claude Code's report sets it; the scripts' do not).
	Joined bool `json:"joined"`
	// EndedBeforeCharge: the client gave up on this attempt before the
	// charge's outcome was recorded, by the clock of the machine both run
	// on (Claude Code's report sets it, from its debug log and the
	// ledger; the scripts' do not).
	EndedBeforeCharge bool   `json:"endedBeforeCharge"`
	NodeError         string `json:"nodeError"`
	MS                int64  `json:"ms"`
}

func (a matrixAttempt) ok() bool { return a.ErrorKind == "" && a.ToolError == "" && a.ChargeID != 0 }

// A matrix transport is how the client reaches the server.
type matrixTransport string

const (
	overStdio matrixTransport = "stdio"
	overHTTP  matrixTransport = "Streamable HTTP"
)

// matrixRun is one scenario over one transport.
type matrixRun struct {
	scenario  scenario.ID
	transport matrixTransport
	keyed     bool   // the client can send a key on this run
	keyVia    string // how, for the README
}

func (r matrixRun) name() string {
	if r.scenario != scenario.HTTPSession && r.transport == overHTTP {
		return string(r.scenario) + "-http"
	}
	return string(r.scenario)
}

// matrixClient is one client program, in one version.
type matrixClient struct {
	name  string // subtest name
	label string // the README table's
	runs  []matrixRun
	// command returns the unstarted program for plan; it skips the test
	// (fails it under MCP_OUTBOX_REQUIRE_INTEROP=1) when the program's
	// packages are missing.
	command func(t *testing.T, plan string) *exec.Cmd
	// stateless reports whether the client must end up speaking
	// 2026-07-28 to server over tr; nil: never.
	stateless func(s matrixServer, tr matrixTransport) bool
	// run, when set, runs the case in place of command and returns its
	// report: for a client that cannot print one (Claude Code, whose
	// report is what its scripted model saw).
	run func(t *testing.T, mc matrixCase) *matrixReport
	// delay is how long the charge takes where the scenario needs a call
	// in progress; zero means testDelay.
	delay time.Duration
	// overhead is what the client's own measure of an attempt adds to the
	// tool call itself, allowed when checking that a timed-out attempt
	// ended before the charge could have.
	overhead time.Duration
	// bare reports whether run also goes against `serve --bare`; nil:
	// every run does.
	bare func(r matrixRun) bool
	// labels name its runs' scenarios in the README's table where they
	// differ from scenarioLabels.
	labels map[scenario.ID]string
}

// matrixCase is one case as a run function gets it.
type matrixCase struct {
	client matrixClient
	server matrixServer
	run    matrixRun
	mode   scenario.Mode
	// plan holds the database, the tool, its arguments, the charge id
	// field and killWhen; the run function starts the server itself.
	plan matrixPlan
	// command returns the server on the case's database: over Streamable
	// HTTP on 127.0.0.1:0, or over stdio.
	command func(http bool) *exec.Cmd
}

// The runs of the plain SDK clients and of the agent frameworks.
var (
	sdkRuns = []matrixRun{
		{scenario.Timeout, overStdio, true, "`_meta.idempotencyKey`"},
		{scenario.Crash, overStdio, true, "`_meta.idempotencyKey`"},
		{scenario.HTTPSession, overHTTP, true, "`_meta.idempotencyKey`"},
	}
	// @langchain/mcp-adapters 1.1 sends {name, arguments} only, and its
	// one per-call hook (beforeToolCall) sets headers over HTTP only: no
	// key over stdio.
	langgraphJSRuns = []matrixRun{
		{scenario.FrameworkRetry, overStdio, false, "none: the adapter cannot send one"},
		{scenario.FrameworkRetry, overHTTP, true, "`Idempotency-Key` header, set in `beforeToolCall`"},
	}
	// langchain-mcp-adapters 0.3.2 cannot put _meta on a call either, but
	// its tool interceptor can make the call on the session itself (stdio)
	// or set headers (HTTP).
	langgraphPyRuns = []matrixRun{
		{scenario.FrameworkRetry, overStdio, true, "`_meta.idempotencyKey`, from a tool interceptor that makes the call on the session"},
		{scenario.FrameworkRetry, overHTTP, true, "`Idempotency-Key` header, set by a tool interceptor"},
	}
)

func matrixClients() []matrixClient {
	var cs []matrixClient
	for _, v := range []string{"1.32.2", "1.30.0"} {
		cs = append(cs, matrixClient{
			name: "ts-sdk-" + v, label: "TypeScript SDK " + v, runs: sdkRuns,
			command: func(t *testing.T, plan string) *exec.Cmd {
				dir := tsClientDir(t)
				cmd := exec.Command("node", filepath.Join(dir, "matrix.mjs"), plan)
				cmd.Dir = dir
				cmd.Env = append(matrixEnv(), "MCP_OUTBOX_TS_SDK="+v)
				return cmd
			},
		})
	}
	cs = append(cs, matrixClient{
		name: "langgraph-js", label: "LangGraph JS 1.7.3 + @langchain/mcp-adapters 1.1.4", runs: langgraphJSRuns,
		command: func(t *testing.T, plan string) *exec.Cmd {
			dir := matrixNodeDir(t, "langgraph-js", "@langchain/langgraph", "@langchain/mcp-adapters")
			cmd := exec.Command("node", filepath.Join(dir, "graph.mjs"), plan)
			cmd.Dir = dir
			cmd.Env = matrixEnv()
			return cmd
		},
	})
	for _, venv := range []struct{ name, mcp, langgraph string }{
		{"seed", "mcp 1.29.1", "LangGraph 1.2.11 + langchain-mcp-adapters 0.3.2"},
		{"latest", "mcp 1.30.0", "LangGraph 1.2.24 + langchain-mcp-adapters 0.3.2"},
		// langchain-mcp-adapters 0.3.2 wants mcp < 2: the newest SDK runs
		// alone. It speaks 2026-07-28 where the server does (serve, and
		// the proxy in front of the newest Python upstream).
		{"newest", "mcp 2.3.0", ""},
	} {
		py := func(program string) func(t *testing.T, plan string) *exec.Cmd {
			return func(t *testing.T, plan string) *exec.Cmd {
				_, python := pyUpstreamVenv(t, venv.name)
				dir, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "python"))
				if err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(python, filepath.Join(dir, program), plan)
				cmd.Dir = dir
				cmd.Env = matrixEnv()
				return cmd
			}
		}
		c := matrixClient{name: "python-mcp-" + venv.name, label: "Python SDK (" + venv.mcp + ")", runs: sdkRuns, command: py("client.py")}
		if venv.name == "newest" {
			c.label = "Python SDK (mcp 2.3.0; 2026-07-28 with `serve`, and over stdio with the proxy in front of the Python upstream)"
			// serve speaks it over both transports; the proxy passes
			// server/discover on to the upstream over stdio, and its HTTP
			// front serves sessions only.
			c.stateless = func(s matrixServer, tr matrixTransport) bool {
				return s.upstream == nil || (s.name == "proxy-py" && tr == overStdio)
			}
		}
		cs = append(cs, c)
		if venv.langgraph != "" {
			cs = append(cs, matrixClient{name: "python-langgraph-" + venv.name, label: "Python " + venv.langgraph, runs: langgraphPyRuns, command: py("graph.py")})
		}
	}
	cs = append(cs, claudeCodeClient())
	return cs
}

// matrixEnv is the environment of a client program: the test's, without
// what would leak into the servers it starts or the Python it runs.
func matrixEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "UPSTREAM_") && !strings.HasPrefix(kv, "MCP_OUTBOX_") && !strings.HasPrefix(kv, "PYTHON") {
			env = append(env, kv)
		}
	}
	return env
}

// matrixNodeDir returns testdata/<name>, or skips the test (fails it under
// MCP_OUTBOX_REQUIRE_INTEROP=1) when node or one of pkgs is missing.
func matrixNodeDir(t *testing.T, name string, pkgs ...string) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	why := ""
	if _, err := exec.LookPath("node"); err != nil {
		why = "node is not in PATH"
	}
	for _, pkg := range pkgs {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil && why == "" {
			why = fmt.Sprintf("testdata/%s/node_modules is missing: run `npm ci` there, or `make test`", name)
		}
	}
	if why != "" {
		skipInterop(t, name, why)
	}
	return dir
}

// A matrix server is what the clients run against.
type matrixServer struct {
	name  string // subtest name
	label string // the README table's column
	// upstream is the proxy's upstream; nil for serve.
	upstream *upstreamKind
}

var pyNewestUpstreamKind = pyUpstreamKindVenv("newest")

func matrixServers() []matrixServer {
	return []matrixServer{
		{name: "serve", label: "`serve`"},
		{name: "proxy-ts", label: "`proxy` + TypeScript upstream", upstream: &tsUpstreamKind},
		// The newest Python SDK upstream, which speaks 2026-07-28 to the
		// clients that do (the proxy passes server/discover through); the
		// contract and proxy tests run the other versions.
		{name: "proxy-py", label: "`proxy` + Python upstream (FastMCP, mcp 2.3.0)", upstream: &pyNewestUpstreamKind},
	}
}

// chargePlan fills in the plan's tool, arguments and charge id field.
func (s matrixServer) chargePlan(p *matrixPlan) {
	p.Tool = "charge"
	if s.upstream == nil {
		p.Arguments, p.ChargeIDField = map[string]any{"amount": 4200, "currency": "usd"}, "charge_id"
	} else {
		p.Arguments, p.ChargeIDField = map[string]any{"customer": "ada", "amount_cents": 4200}, "chargeId"
	}
}

// command is the server on db: `serve` (bare: without the layer), or
// `proxy --cooperating` in front of the upstream; its charge takes delay.
func (s matrixServer) command(t *testing.T, db string, fake *downstream.Server, delay time.Duration, bare, http bool) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin)
	var up *exec.Cmd
	if s.upstream == nil {
		cmd.Args = append(cmd.Args, "serve", "--db", db, "--log-level", "warn", "--demo-delay", delay.String())
		if bare {
			cmd.Args = append(cmd.Args, "--bare") // which delivers nothing, and refuses --dest
		} else {
			cmd.Args = append(cmd.Args, "--dest", paymentsDest(fake))
		}
		cmd.Env = matrixEnv()
	} else {
		up = s.upstream.command(t, db, "UPSTREAM_CHARGE_DELAY_MS="+strconv.FormatInt(delay.Milliseconds(), 10))
		cmd.Args = append(cmd.Args, "proxy", "--db", db, "--cooperating", "--dest", paymentsDest(fake), "--log-level", "warn")
		cmd.Env, cmd.Dir = up.Env, up.Dir
	}
	if http {
		cmd.Args = append(cmd.Args, "--http", "127.0.0.1:0")
	}
	if up != nil {
		cmd.Args = append(append(cmd.Args, "--", up.Path), up.Args[1:]...)
	}
	return cmd
}

// stdioPlan describes cmd for the client to spawn: the variables it adds
// to the client's own environment, which is matrixEnv.
func stdioPlan(cmd *exec.Cmd) *matrixCommand {
	base := map[string]bool{}
	for _, kv := range matrixEnv() {
		base[kv] = true
	}
	env := map[string]string{}
	for _, kv := range cmd.Env {
		if !base[kv] {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	return &matrixCommand{Command: cmd.Path, Args: cmd.Args[1:], Env: env, Cwd: cmd.Dir}
}

// TestInteropMatrix runs every client × server × run × key mode, and the
// plain SDK clients and frameworks against `serve --bare` too. Its cases
// are parallel tests, beside the package's other tests: a case mostly
// waits (the charge's delay, the client's timeout, LangGraph's retry
// backoff), so make test runs more at once than go test's default
// -parallel, the number of CPUs (E2E_PARALLEL in the Makefile). Run one
// after another, with four cases at once, it made the package's serial
// phase 150 s longer.
func TestInteropMatrix(t *testing.T) {
	t.Parallel()
	skipShortInterop(t, "the interop matrix")
	for _, c := range matrixClients() {
		for _, r := range c.runs {
			for _, s := range matrixServers() {
				modes := []scenario.Mode{scenario.LayerNoKey}
				if r.keyed {
					modes = append(modes, scenario.LayerKey)
				}
				if s.upstream == nil && (c.bare == nil || c.bare(r)) {
					modes = append(modes, scenario.Bare)
				}
				for _, mode := range modes {
					t.Run(c.name+"/"+r.name()+"/"+s.name+"/"+string(mode), func(t *testing.T) {
						t.Parallel()
						runMatrixCase(t, c, s, r, mode)
					})
				}
			}
		}
	}
}

func runMatrixCase(t *testing.T, c matrixClient, s matrixServer, r matrixRun, mode scenario.Mode) {
	if s.upstream != nil {
		s.upstream.check(t)
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "run.db")
	if s.upstream != nil {
		// The outbox tables exist before the upstream starts, as the
		// contract requires.
		sdb, err := schema.Open(context.Background(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		sdb.Close()
	}
	fake := downstream.Start(t, nil)
	plan := matrixPlan{
		Scenario: string(r.scenario), DB: db,
		TimeoutMS: testTimeout.Milliseconds(), RetryTimeoutMS: (testDelay + 30*time.Second).Milliseconds(),
		NodeAttempts: 3,
	}
	if r.scenario == scenario.HTTPSession {
		// The plan's scenario names what the client does, not how the
		// server negotiates: these clients speak 2025-11-25 at most.
		plan.Scenario = "http-session"
	}
	s.chargePlan(&plan)
	if mode == scenario.LayerKey {
		plan.Key = "matrix-" + c.name + "-" + r.name() + "-" + contractHex(t, 8)
	}
	plan.KillWhen = `SELECT count(*) FROM calls WHERE state = 'in_flight'`
	if mode == scenario.Bare {
		plan.KillWhen = `SELECT count(*) FROM charges`
	}
	var delay time.Duration
	if r.scenario != scenario.FrameworkRetry {
		delay = testDelay
		if c.delay != 0 {
			delay = c.delay
		}
	}
	bare := mode == scenario.Bare
	var rep *matrixReport
	if c.run != nil {
		rep = c.run(t, matrixCase{client: c, server: s, run: r, mode: mode, plan: plan,
			command: func(http bool) *exec.Cmd { return s.command(t, db, fake, delay, bare, http) }})
	} else {
		rep = runMatrixPlan(t, c, s, r, plan, dir, func(http bool) *exec.Cmd { return s.command(t, db, fake, delay, bare, http) })
	}
	t.Logf("%s %v, protocol %s, tools %v", rep.Client, rep.Versions, rep.ProtocolVersion, rep.Tools)
	for i, a := range rep.Attempts {
		t.Logf("attempt %d: %s (%d ms)", i+1, a.What, a.MS)
	}
	if !slices.Contains(rep.Tools, "charge") && len(rep.Tools) > 0 {
		t.Errorf("tools/list through %s: %v, no charge", s.name, rep.Tools)
	}
	checkMatrixPremise(t, r.scenario, rep.Attempts, delay+c.overhead)
	if c.stateless != nil && c.stateless(s, r.transport) && rep.ProtocolVersion < "2026-07-28" {
		t.Errorf("negotiated protocol %q, want 2026-07-28 or later: the run was meant to cover the stateless protocol", rep.ProtocolVersion)
	}

	ldb := openLedgerDB(t, db)
	charges := countRows(t, ldb, `SELECT count(*) FROM charges`)
	if bare {
		want := 2
		if r.scenario == scenario.FrameworkRetry {
			want = 3
		}
		// Scenario 4 charges once per node attempt; the others at least
		// twice (a late original may add to it).
		if charges < want || (r.scenario == scenario.FrameworkRetry && charges != want) {
			t.Errorf("without the layer: %d charges, want %d: the duplicates did not reproduce, so the layer's one charge would prove nothing", charges, want)
		}
		t.Logf("without the layer: %d charges", charges)
		return
	}
	if charges != 1 {
		t.Fatalf("%d charges, want exactly 1", charges)
	}
	var id int64
	if err := ldb.QueryRow(`SELECT id FROM charges`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for i, a := range rep.Attempts {
		if a.ChargeID != 0 && a.ChargeID != id {
			t.Errorf("attempt %d answered with charge #%d, want #%d", i+1, a.ChargeID, id)
		}
	}
	// After a timeout the original runs on, whether the client sent a
	// cancel (the TypeScript SDK, the Python SDK 2.x over stdio: a
	// timeout's cancel does not stop a running call) or not: the retry
	// joins it, or replays it, and never runs the call again.
	if r.scenario == scenario.Timeout || r.scenario == scenario.HTTPSession {
		if a := rep.Attempts[len(rep.Attempts)-1]; a.Replayed != nil && !*a.Replayed {
			t.Errorf("the retry ran the call again (%s): the timeout stopped the original", a.What)
		}
	}
	// In scenario 4 the original completed and was never cancelled: the
	// node's re-runs are replays of it, where the client shows _meta.
	if r.scenario == scenario.FrameworkRetry {
		for i, a := range rep.Attempts[1:] {
			if a.Replayed != nil && !*a.Replayed {
				t.Errorf("attempt %d: %s; want a replay", i+2, a.What)
			}
		}
	}
	// The servers have exited; deliver what they left, as a drain after a
	// deploy would, then exactly one key must have reached the downstream.
	if out := runCLI(t, nil, "drain", "--db", db, "--dest", paymentsDest(fake), "--timeout", "30s"); out.code != 0 {
		t.Fatalf("drain: exit %d: %s%s", out.code, out.stdout, out.stderr)
	}
	effects := wantExactlyOnce(t, ldb, fake, 1)
	if len(effects) == 1 {
		t.Logf("1 charge (#%d), 1 effect delivered under key %s", id, effects[0].key)
	}
}

// runMatrixPlan starts the server over the run's transport (stdio: the
// plan tells the client how to spawn it), writes the plan and runs the
// client program on it.
func runMatrixPlan(t *testing.T, c matrixClient, s matrixServer, r matrixRun, plan matrixPlan, dir string, command func(http bool) *exec.Cmd) *matrixReport {
	t.Helper()
	switch r.transport {
	case overStdio:
		plan.Server = stdioPlan(command(false))
	case overHTTP:
		plan.URL = startHTTPCommand(t, command(true))
	}
	planFile := filepath.Join(dir, "plan.json")
	b, err := json.MarshalIndent(plan, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(planFile, b, 0o600); err != nil {
		t.Fatal(err)
	}

	return runMatrixClient(t, c.command(t, planFile))
}

// runMatrixClient runs a client program and returns its report.
func runMatrixClient(t *testing.T, cmd *exec.Cmd) *matrixReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	run.Dir, run.Env = cmd.Dir, cmd.Env
	var stdout bytes.Buffer
	run.Stdout = &stdout
	run.Stderr = testWriter{t}
	// A stdio server the program started inherits its stderr; should it
	// outlive the program, stop waiting for the pipe after a while.
	run.WaitDelay = 10 * time.Second
	err := run.Run()
	line := lastLine(stdout.String())
	var rep matrixReport
	if jerr := json.Unmarshal([]byte(line), &rep); jerr != nil {
		t.Fatalf("%s printed no report (%v; exit %v); stdout:\n%s", filepath.Base(cmd.Args[1]), jerr, err, stdout.String())
	}
	if err != nil || rep.Error != "" {
		t.Fatalf("%s: %v: %s", filepath.Base(cmd.Args[1]), err, rep.Error)
	}
	return &rep
}

// checkMatrixPremise fails the test when the attempts did not fail the way
// the scenario is about, or the logical call did not end with a charge:
// then a count proves nothing.
func checkMatrixPremise(t *testing.T, id scenario.ID, attempts []matrixAttempt, delay time.Duration) {
	t.Helper()
	if len(attempts) == 0 {
		t.Fatal("no attempt was made")
	}
	first, last := attempts[0], attempts[len(attempts)-1]
	switch id {
	case scenario.Timeout, scenario.HTTPSession:
		// The first attempt must have ended while the charge still ran.
		// The retry joining the running call proves it by the order of
		// events, whatever the machine's load, as does the client's
		// giving up before the charge's outcome was recorded; without
		// either, the attempt's own time must be under the charge's.
		if len(attempts) != 2 || first.ErrorKind != "timeout" || (first.MS >= delay.Milliseconds() && !last.Joined && !first.EndedBeforeCharge) {
			t.Fatalf("want 2 attempts, the first timing out before the charge's %v: %+v", delay, attempts)
		}
	case scenario.Crash:
		if len(attempts) != 2 || first.ErrorKind != "closed" {
			t.Fatalf("want 2 attempts, the first failing with the connection closed by the killed server: %+v", attempts)
		}
	case scenario.FrameworkRetry:
		if len(attempts) != 3 {
			t.Fatalf("the node ran %d times, want 3 (the default RetryPolicy's attempts)", len(attempts))
		}
		for i, a := range attempts[:2] {
			if !a.ok() || a.NodeError == "" {
				t.Fatalf("attempt %d: %s; want a charge, then the node failing", i+1, a.What)
			}
		}
	}
	if !last.ok() || last.NodeError != "" {
		t.Fatalf("last attempt: %s; want a charge", last.What)
	}
}
