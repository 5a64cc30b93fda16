package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
)

// Claude Code in the interop matrix: its CLI (testdata/claude-code, npm's
// native build) in print mode, the mode agents built on it run in, with a
// scripted fake of the model API (claudecode_model_test.go) as the only
// fake. The model asks for the charge; when Claude Code hands it an error
// it asks again under a new tool_use id, as models do; Claude Code itself
// never retries. The case's report is what reached the model: each
// tool_result is one attempt.

// claudeCodeVersion is the @anthropic-ai/claude-code version pinned in
// testdata/claude-code/package.json.
const claudeCodeVersion = "2.1.332"

const (
	// claudeCodeToolTimeout is MCP_TOOL_TIMEOUT in the timeout runs.
	// Claude Code times out no sooner than 1 s (MCP_TOOL_TIMEOUT=300 timed
	// out after 1005 ms; its per-server "timeout" setting documents the
	// same 1000 ms floor), so its tool timeout cannot be as short as
	// testTimeout is for the other clients.
	claudeCodeToolTimeout = time.Second
	// claudeCodeDelay is how long the charge takes in its runs: longer
	// than the tool timeout, so that the first attempt times out, and
	// shorter than two of them, so that the model's retry, which runs
	// under the same timeout, can join the running call and get its result.
	claudeCodeDelay = 1500 * time.Millisecond
	// claudeCodeCrashTimeout is MCP_TOOL_TIMEOUT in the crash runs, where
	// the SIGKILL and not the timeout must end the first attempt.
	claudeCodeCrashTimeout = 60 * time.Second
)

// claudeCodeRuns: a timeout and a SIGKILL after the commit, over stdio and
// Streamable HTTP. The model's retry has no key (Claude Code sends none and
// lets no one add one: its _meta is its own), so the fingerprint is what
// catches it.
var claudeCodeRuns = []matrixRun{
	{scenario.Timeout, overStdio, false, "none: Claude Code sends none"},
	{scenario.Crash, overStdio, false, "none: Claude Code sends none"},
	{scenario.Timeout, overHTTP, false, "none: Claude Code sends none"},
	{scenario.Crash, overHTTP, false, "none: Claude Code sends none"},
}

// claudeCodeClient is the matrix's Claude Code client.
func claudeCodeClient() matrixClient {
	return matrixClient{
		name: "claude-code", label: "Claude Code " + claudeCodeVersion + " (print mode)", runs: claudeCodeRuns,
		run: runClaudeCode, delay: claudeCodeDelay,
		// An attempt is timed from the model's side: from the tool_use it
		// answered to the tool_result it got, which includes Claude Code's
		// dispatch (up to 0.65 s seen in CI, with other tests running, and
		// more under heavier load) besides its 1 s tool timeout. That the
		// first attempt timed out is Claude Code's own word ("timed out
		// after 1s"); that it ended while the charge ran, the retry's
		// "Joined" note (checkMatrixPremise), which load does not move.
		// The time is the fallback when the retry replayed instead.
		overhead: time.Second,
		// Without the layer, a charge slower than the tool timeout never
		// answers in time: every retry of the model charges again and
		// times out again until the model gives up, so the timeout runs
		// cannot end with an answered charge. The crash runs show the
		// duplicate.
		bare: func(r matrixRun) bool { return r.scenario == scenario.Crash },
		labels: map[scenario.ID]string{
			scenario.Timeout: "1 (timeout, the model retries)",
			scenario.Crash:   "2 (SIGKILL after the commit, restart, the model retries)",
		},
	}
}

var claudeCodeCheck struct {
	once sync.Once
	err  error
}

// claudeCodeBin returns the CLI, or skips the test (fails it under
// MCP_OUTBOX_REQUIRE_INTEROP=1) when it is not installed.
func claudeCodeBin(t *testing.T) string {
	t.Helper()
	dir := matrixNodeDir(t, "claude-code", "@anthropic-ai/claude-code")
	// npm's postinstall puts the native build for this platform in place
	// of bin/claude.exe, which is otherwise a stub that says so.
	claude := filepath.Join(dir, "node_modules", "@anthropic-ai", "claude-code", "bin", "claude.exe")
	claudeCodeCheck.once.Do(func() {
		out, err := exec.Command(claude, "--version").Output()
		switch {
		case err != nil:
			claudeCodeCheck.err = fmt.Errorf("%s --version: %v", claude, err)
		case !strings.HasPrefix(string(out), claudeCodeVersion+" "):
			claudeCodeCheck.err = fmt.Errorf("%s is version %q, want %s: run npm ci in testdata/claude-code", claude, strings.TrimSpace(string(out)), claudeCodeVersion)
		}
	})
	if claudeCodeCheck.err != nil {
		skipInterop(t, "Claude Code", claudeCodeCheck.err.Error())
	}
	return claude
}

// claudeCodeEnv is Claude Code's whole environment: nothing of the test's
// own (no credentials can leak in), and every setting the runs need.
func claudeCodeEnv(home, modelURL string, toolTimeout time.Duration) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		// A throwaway home: no user settings, MCP servers, credentials or
		// session history are read, and nothing is left behind.
		"HOME=" + home,
		"TMPDIR=" + home,
		// The scripted model on 127.0.0.1, with a key that is not one.
		"ANTHROPIC_BASE_URL=" + modelURL,
		"ANTHROPIC_API_KEY=sk-ant-test-not-a-key",
		// No telemetry, error reports, update checks or other traffic
		// that is not the conversation: nothing leaves 127.0.0.1.
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"DISABLE_TELEMETRY=1",
		"DISABLE_ERROR_REPORTING=1",
		"DISABLE_AUTOUPDATER=1",
		// Print mode would otherwise start the conversation while MCP
		// servers are still connecting, and the first turn could go out
		// without the tool.
		"MCP_CONNECTION_NONBLOCKING=false",
		// With tool search on, MCP tools are deferred behind a search tool
		// and the first request does not offer them: the script would have
		// to search first. Off, the tool is in every request.
		"ENABLE_TOOL_SEARCH=false",
		// The tool-call timeout, in milliseconds (1000 at least).
		"MCP_TOOL_TIMEOUT=" + strconv.FormatInt(toolTimeout.Milliseconds(), 10),
	}
}

// stdioWrapper starts a server over stdio and writes its pid to the file
// "$0" (exec keeps the pid), so that the test can SIGKILL the server Claude
// Code spawned. A second start (Claude Code reconnecting) runs without the
// failpoints: only the first server is to be killed after its commit.
const stdioWrapper = `if [ -e "$0" ]; then unset ` + failpoint.EnvVar + `; fi; echo $$ >"$0"; cd "$1" || exit 1; shift; exec "$@"`

// runClaudeCode runs one case with Claude Code and returns the report built
// from what its model saw.
func runClaudeCode(t *testing.T, mc matrixCase) *matrixReport {
	claude := claudeCodeBin(t)
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	const serverName = "outbox"
	model := startFakeModel(t, "mcp__"+serverName+"__"+mc.plan.Tool, mc.plan.Arguments)
	crash := mc.run.scenario == scenario.Crash
	bare := mc.mode == scenario.Bare
	overHTTPRun := mc.run.transport == overHTTP

	srv := mc.command(overHTTPRun)
	killWhen := `SELECT count(*) FROM charges`
	if crash && !bare {
		// SIGKILL after the commit, before the answer: a failpoint holds
		// the answer back until the test has killed the server. serve
		// commits the call itself; the proxy's cooperating upstream commits
		// it while the proxy waits for its answer.
		srv.Path, srv.Args[0] = failpointBin, failpointBin
		if srv.Env == nil {
			srv.Env = matrixEnv()
		}
		fp := failpoint.CallAfterCommit
		if mc.server.upstream != nil {
			fp = failpoint.ProxyAfterForward
		}
		srv.Env = append(srv.Env, failpoint.EnvVar+"="+fp+"=sleep(1m)")
		killWhen = `SELECT count(*) FROM calls WHERE state = 'completed'`
	}
	var server map[string]any
	var url string
	pidFile := filepath.Join(dir, "server.pid")
	switch mc.run.transport {
	case overStdio:
		env := map[string]string{}
		for _, kv := range srv.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		cwd := srv.Dir
		if cwd == "" {
			cwd = dir
		}
		server = map[string]any{"type": "stdio", "command": "/bin/sh",
			"args": append([]string{"-c", stdioWrapper, pidFile, cwd, srv.Path}, srv.Args[1:]...), "env": env}
	case overHTTP:
		url = startHTTPCommand(t, srv)
		server = map[string]any{"type": "http", "url": url}
	}
	cfg, err := json.Marshal(map[string]any{"mcpServers": map[string]any{serverName: server}})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "mcp.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}

	toolTimeout := claudeCodeToolTimeout
	restarted := make(chan struct{})
	var restartedOnce sync.Once
	release := func() { restartedOnce.Do(func() { close(restarted) }) }
	// Released on every way out, t.Fatal included: a model request held
	// open would hold the fake's Close, and the test, forever.
	defer release()
	if crash {
		toolTimeout = claudeCodeCrashTimeout
		// A real model takes seconds to answer; this one waits for the
		// restart, so that the retry meets the new server.
		model.beforeRetry = func() { <-restarted }
	}
	debugFile := filepath.Join(dir, "claude-debug.log")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, claude,
		"-p", "Charge the customer.",
		// Only the server above: none from the (empty) home.
		"--mcp-config", cfgFile, "--strict-mcp-config",
		// Print mode asks no one: a tool not allowed here is denied.
		"--allowedTools", "mcp__"+serverName+"__"+mc.plan.Tool,
		"--output-format", "json",
		"--no-session-persistence",
		// What Claude Code did on the wire (protocol, timeouts, restarts),
		// for the report and the log.
		"--debug-file", debugFile,
	)
	cmd.Dir = dir
	cmd.Env = claudeCodeEnv(home, model.URL(), toolTimeout)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var runErr error
	done := false
	if crash {
		why := ""
		why, done, runErr = killWhenCommitted(t, mc.plan.DB, killWhen, exited, func() {
			if overHTTPRun {
				srv.Process.Kill()
				return
			}
			killPidFile(t, pidFile)
		})
		t.Logf("%s", why)
		if !done && overHTTPRun {
			srv.Wait()
			restartHTTP(t, mc, url)
		}
		release()
	}
	if !done {
		runErr = <-exited
	}
	took := time.Since(start)
	debug, _ := os.ReadFile(debugFile)
	logClaudeCodeDebug(t, debug)
	if stderr.Len() > 0 {
		t.Logf("claude stderr: %s", stderr.String())
	}
	if reqs := model.Requests(); len(reqs) > 0 {
		// What a start of Claude Code costs: up to its first request to
		// the model, the MCP server connected.
		t.Logf("claude -p: first model request %v after start", reqs[0].At.Sub(start).Round(time.Millisecond))
	}
	t.Logf("claude -p: %v, exit %v: %s", took.Round(time.Millisecond), runErr, truncate(lastLine(stdout.String()), 300))
	logLedger(t, mc.plan.DB)
	if runErr != nil {
		t.Fatalf("claude -p: %v", runErr)
	}
	checkClaudeCodeConnects(t, debug)
	rep := claudeCodeReport(t, mc, model, debug, took)
	if !bare {
		checkModelToldOfReplay(t, rep.Attempts)
	}
	return rep
}

// claudeCodeConnectBound is how long a connection (or reconnection) of
// Claude Code to the server may take. Its own bound is 30 s (MCP_TIMEOUT).
// A server that starts in a second connects in about 0.6 s on a quiet
// machine, but a CI machine running the other suites at once took over
// 10 s; the fault this bound is for is a fixed wait of Claude Code's own,
// 27 s for a listen's notifications/subscriptions/acknowledged (connect
// took 28 s while the proxy misnamed the listen), which load does not
// shorten. 20 s lies between: wide for load, short of that wait.
const claudeCodeConnectBound = 20 * time.Second

var connected = regexp.MustCompile(`MCP server "[^"]+": (?:Successfully connected \(transport: \w+\) in|Connection failed after) (\d+)ms`)

// checkClaudeCodeConnects fails the test when Claude Code took longer than
// claudeCodeConnectBound to connect to the server. Over stdio it first
// sends server/discover as a probe with a short bound; a server that
// answers after it (the proxy waiting for a slow upstream to start) gets
// initialize next on the same pipe, and a proxy that refuses initialize
// on a connection that answered server/discover leaves Claude Code waiting
// until its connect timeout.
func checkClaudeCodeConnects(t *testing.T, debug []byte) {
	t.Helper()
	for _, m := range connected.FindAllSubmatch(debug, -1) {
		ms, _ := strconv.Atoi(string(m[1]))
		if d := time.Duration(ms) * time.Millisecond; d > claudeCodeConnectBound {
			t.Errorf("Claude Code took %v to connect to the server, over %v: %s", d, claudeCodeConnectBound, m[0])
		}
	}
}

// checkModelToldOfReplay fails the test when the model's retry got the
// recorded result of an earlier attempt (the timeout's call it joined, the
// killed server's committed call it replays) and what reached the model
// does not say so. Claude Code gives the model only structuredContent
// when a result has it, as JSON: content blocks and _meta never reach it,
// so the note must be in structuredContent (its "mcp_outbox" property).
func checkModelToldOfReplay(t *testing.T, attempts []matrixAttempt) {
	t.Helper()
	if len(attempts) < 2 {
		return
	}
	last := attempts[len(attempts)-1]
	if !last.ok() || last.Replayed == nil || *last.Replayed {
		return
	}
	t.Errorf("the model's retry got the result of the first attempt, and what reached the model does not say so (nothing matches %s): %s", replayNote, last.What)
}

// logLedger logs the calls and the charges the run left, which is what
// says why a case failed.
func logLedger(t *testing.T, db string) {
	t.Helper()
	ldb := openLedgerDB(t, db)
	for _, q := range []string{
		`SELECT id, key_source, state, attempts, created_at, coalesce(completed_at, 0) FROM calls ORDER BY id`,
		`SELECT id, 0, 0, 0, created_at, 0 FROM charges ORDER BY id`,
	} {
		rows, err := ldb.Query(q)
		if err != nil {
			continue // serve --bare has no calls table
		}
		for rows.Next() {
			var id, attempts, created, completed int64
			var source, state any
			if err := rows.Scan(&id, &source, &state, &attempts, &created, &completed); err == nil {
				t.Logf("ledger: %s #%d %v %v attempts %d created %d completed %+dms", strings.Fields(q)[len(strings.Fields(q))-4], id, source, state, attempts, created, completed-created)
			}
		}
		rows.Close()
	}
}

// killWhenCommitted polls the database until killWhen counts a row, then
// kills the server. It stops early when Claude Code exits (done).
func killWhenCommitted(t *testing.T, db, killWhen string, exited <-chan error, kill func()) (why string, done bool, runErr error) {
	t.Helper()
	ldb := openLedgerDB(t, db)
	// Long enough for Claude Code's own connect timeout (30 s) and the
	// call: a slow connection fails the case on its own (see
	// checkClaudeCodeConnects), and the counts still say what it did.
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return "Claude Code exited before " + killWhen + " counted a row", true, err
		case <-tick.C:
		}
		var n int
		// The tables may not exist yet.
		if lastErr = ldb.QueryRow(killWhen).Scan(&n); lastErr == nil && n > 0 {
			kill()
			return fmt.Sprintf("%s: %d; SIGKILLed the server", killWhen, n), false, nil
		}
	}
	return fmt.Sprintf("%s stayed 0 for a minute (last error: %v); killed nothing", killWhen, lastErr), false, nil
}

// killPidFile SIGKILLs the process whose pid the stdio wrapper wrote.
func killPidFile(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Errorf("read the server's pid: %v", err)
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Errorf("pid file %q: %v", b, err)
		return
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("SIGKILL %d: %v", pid, err)
	}
}

// restartHTTP starts the server again on url's address, where the killed
// one listened: Claude Code's configuration names one URL.
func restartHTTP(t *testing.T, mc matrixCase, url string) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	cmd := mc.command(true)
	for i, a := range cmd.Args[:len(cmd.Args)-1] {
		if a == "--http" {
			cmd.Args[i+1] = u.Host
		}
	}
	if got := startHTTPCommand(t, cmd); got != url {
		t.Fatalf("restarted server serves at %s, want %s", got, url)
	}
	t.Logf("restarted the server at %s", url)
}

// replayNote is how the layer's note on a result that is not a new
// execution begins: "Replayed" (a recorded result), "Joined" (a call still
// running when the retry came). It is in a content block and, for a tool
// with structured output, in structuredContent's "mcp_outbox" property.
var replayNote = regexp.MustCompile(`\[mcp-outbox\] (Replayed|Joined)\b`)

var timedOut = regexp.MustCompile(`(?i)timed out|timeout`)
var closedConn = regexp.MustCompile(`(?i)connection closed|closed|not connected|ECONNRESET|ECONNREFUSED|fetch failed|terminated|socket`)

// claudeCodeReport turns what reached the model into the matrix's report.
func claudeCodeReport(t *testing.T, mc matrixCase, model *fakeModel, debug []byte, took time.Duration) *matrixReport {
	t.Helper()
	rep := &matrixReport{Client: "Claude Code", Versions: map[string]string{"claude-code": claudeCodeVersion}}
	if m := regexp.MustCompile(`"negotiatedProtocolVersion":"([^"]+)"`).FindAllSubmatch(debug, -1); len(m) > 0 {
		rep.ProtocolVersion = string(m[len(m)-1][1])
	}
	prefix := "mcp__outbox__"
	for _, r := range model.Requests() {
		if !r.Main {
			continue
		}
		var mr messagesRequest
		if json.Unmarshal(r.Body, &mr) == nil {
			rep.Tools = nil
			for _, tl := range mr.Tools {
				if name, ok := strings.CutPrefix(tl.Name, prefix); ok {
					rep.Tools = append(rep.Tools, name)
				}
			}
		}
	}
	failedAt := toolFailedAt(debug)
	for i, r := range model.ToolResults() {
		a := matrixAttempt{MS: r.Took.Milliseconds(),
			What: fmt.Sprintf("attempt %d (%s): is_error %v: %s", i+1, r.ToolUseID, r.IsError, strings.ReplaceAll(truncate(r.Text, 300), "\n", " ⏎ "))}
		if i == 0 && r.IsError && !failedAt.IsZero() {
			if done, ok := chargeDoneAt(t, mc.plan.DB); ok {
				a.EndedBeforeCharge = failedAt.Before(done)
			}
		}
		note := replayNote.FindStringSubmatch(r.Text)
		replayed := note != nil
		a.Replayed, a.Joined = &replayed, replayed && note[1] == "Joined"
		switch {
		case !r.IsError:
			a.ChargeID = chargeIDIn(r.Text, mc.plan.ChargeIDField)
		case timedOut.MatchString(r.Text):
			a.ErrorKind, a.Error = "timeout", r.Text
		case closedConn.MatchString(r.Text):
			a.ErrorKind, a.Error = "closed", r.Text
		default:
			a.ToolError = r.Text
		}
		rep.Attempts = append(rep.Attempts, a)
	}
	return rep
}

// toolFailed is the line of Claude Code's debug log for a tool call it
// gave up on, stamped with its (the machine's) clock.
var toolFailed = regexp.MustCompile(`(?m)^(\S+) \[DEBUG\] MCP server "[^"]+": Tool '[^']+' failed after`)

// toolFailedAt is when Claude Code gave up on its first tool call, by its
// debug log; zero if it never did.
func toolFailedAt(debug []byte) time.Time {
	m := toolFailed.FindSubmatch(debug)
	if m == nil {
		return time.Time{}
	}
	at, err := time.Parse(time.RFC3339Nano, string(m[1]))
	if err != nil {
		return time.Time{}
	}
	return at
}

// chargeDoneAt is when the first call's outcome was recorded (the charge
// row's insert under serve --bare, which has no calls table), by the
// server's clock, the same machine's as Claude Code's.
func chargeDoneAt(t *testing.T, db string) (time.Time, bool) {
	t.Helper()
	ldb := openLedgerDB(t, db)
	for _, q := range []string{
		`SELECT min(completed_at) FROM calls WHERE completed_at IS NOT NULL`,
		`SELECT min(created_at) FROM charges`,
	} {
		var ms sql.NullInt64
		if err := ldb.QueryRow(q).Scan(&ms); err == nil && ms.Valid {
			return time.UnixMilli(ms.Int64), true
		}
	}
	return time.Time{}, false
}

// chargeIDIn finds the charge id in a result as the model read it: JSON
// (Claude Code passes structuredContent on as JSON), or text naming it.
func chargeIDIn(text, field string) int64 {
	var m map[string]any
	if json.Unmarshal([]byte(text), &m) == nil {
		if id, ok := m[field].(float64); ok {
			return int64(id)
		}
	}
	re := regexp.MustCompile(`"?` + regexp.QuoteMeta(field) + `"?\s*[:=]\s*(\d+)`)
	if s := re.FindStringSubmatch(text); s != nil {
		id, _ := strconv.ParseInt(s[1], 10, 64)
		return id
	}
	return 0
}

// logClaudeCodeDebug logs the lines of Claude Code's debug log that say
// what it did with the MCP server.
func logClaudeCodeDebug(t *testing.T, debug []byte) {
	t.Helper()
	for _, line := range strings.Split(string(debug), "\n") {
		if strings.Contains(line, "MCP server") || strings.Contains(line, "tool_dispatch") {
			t.Logf("claude debug: %s", line)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
