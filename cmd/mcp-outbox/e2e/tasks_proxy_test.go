package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// stdioTaskPeer speaks raw 2026-07-28 JSON-RPC to `mcp-outbox proxy` over
// stdio (per-request _meta, no initialize), as a Tasks client does: the
// go-sdk client has no Tasks, and the proxy has no stateless HTTP path.
type stdioTaskPeer struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}

	mu      sync.Mutex
	nextID  int64
	waiting map[int64]chan map[string]any
}

func startTaskProxy(t *testing.T, cmd *exec.Cmd) *stdioTaskPeer {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &stdioTaskPeer{t: t, cmd: cmd, stdin: stdin, exited: make(chan struct{}), waiting: map[int64]chan map[string]any{}}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			id, ok := m["id"].(float64)
			if !ok || m["method"] != nil {
				continue // a notification, or a request of the upstream's
			}
			p.mu.Lock()
			ch := p.waiting[int64(id)]
			delete(p.waiting, int64(id))
			p.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// do sends method with the 2026-07-28 _meta (declaring Tasks when tasks is
// set) and returns the response: its result, or its error.
func (p *stdioTaskPeer) do(method string, params map[string]any, tasks bool) (result, rpcErr map[string]any) {
	p.t.Helper()
	caps := map[string]any{}
	if tasks {
		caps["extensions"] = map[string]any{outbox.ExtensionTasks: map[string]any{}}
	}
	meta, _ := params["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
	meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "tasks-proxy", "version": "0"}
	meta["io.modelcontextprotocol/clientCapabilities"] = caps
	params["_meta"] = meta
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	ch := make(chan map[string]any, 1)
	p.waiting[id] = ch
	p.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("%s: %v", method, err)
	}
	select {
	case m := <-ch:
		result, _ = m["result"].(map[string]any)
		rpcErr, _ = m["error"].(map[string]any)
		if result == nil && rpcErr == nil {
			p.t.Fatalf("%s: neither result nor error: %v", method, m)
		}
		return result, rpcErr
	case <-p.exited:
		p.t.Fatalf("%s: the proxy exited", method)
	case <-time.After(60 * time.Second):
		p.t.Fatalf("%s: no answer within 60s", method)
	}
	return nil, nil
}

func (p *stdioTaskPeer) result(method string, params map[string]any, tasks bool) map[string]any {
	p.t.Helper()
	r, e := p.do(method, params, tasks)
	if e != nil {
		p.t.Fatalf("%s: error %v", method, e)
	}
	return r
}

// waitTask polls tasks/get until the task leaves working.
func (p *stdioTaskPeer) waitTask(id string, timeout time.Duration) map[string]any {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := p.result("tasks/get", map[string]any{"taskId": id}, true)
		if got["status"] != "working" {
			return got
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("task %s still working after %v", id, timeout)
		}
		select { // the next poll, as a client makes it
		case <-time.After(50 * time.Millisecond):
		case <-p.exited:
			p.t.Fatalf("task %s: the proxy exited while the task was working", id)
		}
	}
}

// kill SIGKILLs the proxy and waits for it.
func (p *stdioTaskPeer) kill() {
	p.t.Helper()
	_ = p.cmd.Process.Kill()
	<-p.exited
	wantKilled(p.t, p.cmd)
}

func taskCharge(key, customer string, cents int) map[string]any {
	return map[string]any{"name": "charge", "arguments": map[string]any{"customer": customer, "amount_cents": cents},
		"_meta": map[string]any{outbox.MetaKeyIdempotency: key}}
}

// TestProxyTasks: a slow charge through `proxy --cooperating --task
// charge=after:…` becomes a task, a retry with the same key (a client whose
// CreateTaskResult was lost) gets the same task, and the task completes
// with one charge and one delivery; server/discover lists the extension.
func TestProxyTasks(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyTasks)
}

func testProxyTasks(t *testing.T, up upstreamKind) {
	t.Parallel()
	f := newProxyFixture(t, up)
	p := startTaskProxy(t, f.proxyCommand(t, bin, []string{"UPSTREAM_CHARGE_DELAY_MS=1500"}, "--cooperating", "--task", "charge=after:200ms"))

	created := p.result("tools/call", taskCharge("pt-1", "ada", 700), true)
	id, _ := created["taskId"].(string)
	if created["resultType"] != "task" || created["status"] != "working" || id == "" {
		t.Fatalf("a slow charge: %v, want a working task", created)
	}
	again := p.result("tools/call", taskCharge("pt-1", "ada", 700), true)
	if again["taskId"] != id {
		t.Fatalf("retry with the same key: %v, want task %s", again, id)
	}
	done := p.waitTask(id, 60*time.Second)
	res, _ := done["result"].(map[string]any)
	if done["status"] != "completed" || !strings.Contains(fmt.Sprint(res["content"]), "charged ada 700") {
		t.Fatalf("task ended %v", done)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges = %d, want 1", n)
	}
	effects := waitEffects(t, f.db, 1, 30*time.Second, "delivered")
	if n := len(requestsFor(f.fake, effects[0].key)); n != 1 {
		t.Errorf("the effect reached the downstream %d times, want once", n)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM calls WHERE task_params IS NOT NULL`); n != 0 {
		t.Errorf("%d finished tasks keep their params", n)
	}
	if r, e := p.do("tasks/get", map[string]any{"taskId": "task_NOSUCHTASKATALL"}, true); e == nil || e["code"] != float64(-32602) {
		t.Errorf("tasks/get of an unknown task: %v %v, want -32602", r, e)
	}
}

// TestProxyTasks_SIGKILL: the proxy is SIGKILLed while the upstream runs a
// task's charge (the upstream, its child, goes with it before its commit).
// The next proxy on the database takes the task over:
//   - cooperating: it forwards it again (the upstream's fence would refuse
//     the old attempt's commit), and the task completes with one charge and
//     one delivery; a retry with the same key gets the same task.
//   - not cooperating: the charge may have happened, so the task is never
//     forwarded again; it ends failed, its outcome unknown.
func TestProxyTasks_SIGKILL(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, func(t *testing.T, up upstreamKind) {
		for _, cooperating := range []bool{true, false} {
			t.Run(fmt.Sprintf("cooperating=%v", cooperating), func(t *testing.T) {
				t.Parallel()
				testProxyTasksSIGKILL(t, up, cooperating)
			})
		}
	})
}

// TestProxyTasks_SIGKILLPostgres: the same on PostgreSQL, cooperating
// Python upstream: the second proxy stands for another replica, which
// cannot see the first one's process and takes the task over once its
// lease (1 s here) has passed, at a scan of its task runner.
func TestProxyTasks_SIGKILLPostgres(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	f := newPgProxyFixture(t)
	mk := func(env []string, args ...string) *exec.Cmd {
		cmd := pgProxyCommand(t, f, env, args...)
		cmd.Env = append(cmd.Env, "MCP_OUTBOX_LEASE=1s")
		return cmd
	}
	runProxyTasksSIGKILL(t, f, f.up, true, mk)
}

func testProxyTasksSIGKILL(t *testing.T, up upstreamKind, cooperating bool) {
	f := newProxyFixture(t, up)
	runProxyTasksSIGKILL(t, f, up, cooperating, func(env []string, args ...string) *exec.Cmd {
		return f.proxyCommand(t, bin, env, args...)
	})
}

func runProxyTasksSIGKILL(t *testing.T, f *proxyFixture, up upstreamKind, cooperating bool, proxyCommand func(env []string, args ...string) *exec.Cmd) {
	env := []string{"UPSTREAM_CHARGE_DELAY_MS=2000", "UPSTREAM_COOPERATE=0", "UPSTREAM_ANNOUNCE_CHARGES=1"}
	args := []string{"--task", "charge=always"}
	if cooperating {
		env[1] = "UPSTREAM_COOPERATE=1"
		args = append(args, "--cooperating")
	}
	cmd := proxyCommand(env, args...)
	lines := watchUpstream(cmd)
	p := startTaskProxy(t, cmd)
	created := p.result("tools/call", taskCharge("kill-1", "ada", 900), true)
	id, _ := created["taskId"].(string)
	if created["resultType"] != "task" || id == "" {
		t.Fatalf("CreateTaskResult = %v", created)
	}
	// The task is forwarded over the proxy's own upstream session. Killed
	// once the upstream has the charge, within its delay, before its
	// commit: the case where the outcome is in doubt.
	lines.wait(t, chargeStarted, 1, 60*time.Second)
	p.kill()
	if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 0 {
		t.Fatalf("charges = %d after a kill before the commit", n)
	}

	p2 := startTaskProxy(t, proxyCommand(env, args...))
	done := p2.waitTask(id, 60*time.Second)
	if !cooperating {
		errObj, _ := done["error"].(map[string]any)
		if done["status"] != "failed" || !strings.Contains(fmt.Sprint(errObj["message"]), "unknown") {
			t.Fatalf("non-cooperating task after the kill = %v, want failed with the outcome unknown", done)
		}
		if n := countRows(t, f.db, `SELECT count(*) FROM calls WHERE task_id = $1 AND state = 'unknown'`, id); n != 1 {
			t.Errorf("the call is not unknown")
		}
		if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 0 {
			t.Errorf("charges = %d: the unknown task was forwarded again", n)
		}
		return
	}
	if done["status"] != "completed" {
		t.Fatalf("task after the restart = %v", done)
	}
	again := p2.result("tools/call", taskCharge("kill-1", "ada", 900), true)
	if again["taskId"] != id || again["status"] != "completed" {
		t.Errorf("retry after the restart = %v, want the completed task %s", again, id)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges = %d, want 1", n)
	}
	effects := waitEffects(t, f.db, 1, 30*time.Second, "delivered")
	if n := len(requestsFor(f.fake, effects[0].key)); n != 1 {
		t.Errorf("the effect reached the downstream %d times, want once", n)
	}
}

// TestProxyTasks_Cancel: tasks/cancel while the upstream runs the charge.
// Cooperating: the cancel reaches the upstream, the claim is released, the
// upstream's commit fails its fence, and the task ends cancelled with no
// charge. Not cooperating: the charge may happen all the same, so the task
// ends failed with the outcome unknown.
func TestProxyTasks_Cancel(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, func(t *testing.T, up upstreamKind) {
		for _, cooperating := range []bool{true, false} {
			t.Run(fmt.Sprintf("cooperating=%v", cooperating), func(t *testing.T) {
				t.Parallel()
				testProxyTasksCancel(t, up, cooperating)
			})
		}
	})
}

func testProxyTasksCancel(t *testing.T, up upstreamKind, cooperating bool) {
	f := newProxyFixture(t, up)
	env := []string{"UPSTREAM_CHARGE_DELAY_MS=1500", "UPSTREAM_COOPERATE=0", "UPSTREAM_ANNOUNCE_CHARGES=1"}
	args := []string{"--task", "charge=always"}
	if cooperating {
		env[1] = "UPSTREAM_COOPERATE=1"
		args = append(args, "--cooperating")
	}
	cmd := f.proxyCommand(t, bin, env, args...)
	lines := watchUpstream(cmd)
	p := startTaskProxy(t, cmd)
	created := p.result("tools/call", taskCharge("cancel-1", "ada", 500), true)
	id, _ := created["taskId"].(string)
	// Cancelled once the upstream has the charge (a cancel before it is
	// written ends the task cancelled whatever the upstream: nothing was
	// sent).
	lines.wait(t, chargeStarted, 1, 60*time.Second)
	p.result("tasks/cancel", map[string]any{"taskId": id}, true)
	done := p.waitTask(id, 30*time.Second)
	// The upstream's charge, deaf to the cancel, wakes after its delay and
	// tries to commit; it has ended once it says so.
	lines.wait(t, chargeEnded, 1, 30*time.Second)
	charges := countRows(t, f.db, `SELECT count(*) FROM charges`)
	if cooperating {
		if done["status"] != "cancelled" {
			t.Fatalf("cooperating task after tasks/cancel = %v, want cancelled", done)
		}
		if charges != 0 { // the fence refused the commit
			t.Fatalf("charges = %d after the task was cancelled", charges)
		}
		// Nothing was kept, so the same call asked again runs: a new task.
		againAfterCancel(t, p, f, id, taskCharge("cancel-1", "ada", 500), lines, 2)
		return
	}
	errObj, _ := done["error"].(map[string]any)
	if done["status"] != "failed" || !strings.Contains(fmt.Sprint(errObj["message"]), "unknown") {
		t.Fatalf("non-cooperating task after tasks/cancel = %v, want failed with the outcome unknown", done)
	}
	// Why not "cancelled": this upstream's charge is deaf to the cancel and
	// happens all the same.
	if charges != 1 {
		t.Fatalf("charges = %d, want 1: the case does not show why the task is not cancelled", charges)
	}
}

// TestProxyTasks_CancelElsewhere: tasks/cancel of a cooperating task
// reaches a second proxy on the database while the first one's upstream
// runs the charge. The second proxy takes the task's claim away (it ends
// cancelled at once), so the upstream's fence refuses its commit when the
// charge wakes: no charge, no effect, and both proxies say cancelled.
func TestProxyTasks_CancelElsewhere(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, func(t *testing.T, up upstreamKind) {
		t.Parallel()
		f := newProxyFixture(t, up)
		env := []string{"UPSTREAM_CHARGE_DELAY_MS=2000", "UPSTREAM_ANNOUNCE_CHARGES=1"}
		args := []string{"--cooperating", "--task", "charge=always"}
		cmd := f.proxyCommand(t, bin, env, args...)
		lines := watchUpstream(cmd)
		owner := startTaskProxy(t, cmd)
		created := owner.result("tools/call", taskCharge("elsewhere-1", "ada", 600), true)
		id, _ := created["taskId"].(string)
		if created["resultType"] != "task" || id == "" {
			t.Fatalf("CreateTaskResult = %v", created)
		}
		lines.wait(t, chargeStarted, 1, 60*time.Second)

		other := startTaskProxy(t, f.proxyCommand(t, bin, env, args...))
		other.result("tasks/cancel", map[string]any{"taskId": id}, true)
		if got := other.result("tasks/get", map[string]any{"taskId": id}, true); got["status"] != "cancelled" {
			t.Fatalf("tasks/get after the cancel, on the proxy that took it: %v, want cancelled", got)
		}
		lines.wait(t, chargeEnded, 1, 30*time.Second) // the charge woke and tried to commit
		if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 0 {
			t.Fatalf("charges = %d: the upstream committed a cancelled task", n)
		}
		if n := countRows(t, f.db, `SELECT count(*) FROM effects`); n != 0 {
			t.Errorf("effects = %d after a cancelled task", n)
		}
		if got := owner.waitTask(id, 30*time.Second); got["status"] != "cancelled" {
			t.Fatalf("tasks/get on the owner: %v, want cancelled", got)
		}
		// Asked again, through the owner, whose attempt has ended: it runs.
		againAfterCancel(t, owner, f, id, taskCharge("elsewhere-1", "ada", 600), lines, 2)
	})
}

// againAfterCancel makes the call of the task cancelled (its id) again,
// through p: it runs as a new task (the upstream starts its charge number
// started), which completes with one charge, and the cancelled task stays
// cancelled.
func againAfterCancel(t *testing.T, p *stdioTaskPeer, f *proxyFixture, cancelled string, call map[string]any, lines *upstreamLines, started int) {
	t.Helper()
	again := p.result("tools/call", call, true)
	next, _ := again["taskId"].(string)
	if next == "" || next == cancelled {
		t.Fatalf("the same call after the cancel = %v, want a new task (the cancelled one is %s)", again, cancelled)
	}
	lines.wait(t, chargeStarted, started, 60*time.Second)
	if done := p.waitTask(next, 30*time.Second); done["status"] != "completed" {
		t.Fatalf("the call asked again after the cancel: %v, want completed", done)
	}
	if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("charges = %d after the call asked again, want 1", n)
	}
	if got := p.result("tasks/get", map[string]any{"taskId": cancelled}, true); got["status"] != "cancelled" {
		t.Errorf("the cancelled task after the call asked again: %v, want still cancelled", got)
	}
}

// The lines the upstreams print around a charge with
// UPSTREAM_ANNOUNCE_CHARGES=1, after the proxy's "[upstream] " prefix and
// the upstream's name.
const (
	chargeStarted = ": charge started"
	chargeEnded   = ": charge ended"
)

// upstreamLines passes a proxy's stderr on and counts the upstream's lines
// by what they end with, for a test to wait on.
type upstreamLines struct {
	w io.Writer

	mu      sync.Mutex
	buf     string
	counts  map[string]int
	changed chan struct{} // closed, and replaced, at each counted line
}

// watchUpstream puts an upstreamLines in front of cmd's stderr.
func watchUpstream(cmd *exec.Cmd) *upstreamLines {
	l := &upstreamLines{w: cmd.Stderr, counts: map[string]int{}, changed: make(chan struct{})}
	cmd.Stderr = l
	return l
}

func (l *upstreamLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf += string(p)
	for {
		line, rest, ok := strings.Cut(l.buf, "\n")
		if !ok {
			break
		}
		l.buf = rest
		if !strings.HasPrefix(line, "[upstream] ") {
			continue
		}
		for _, end := range []string{chargeStarted, chargeEnded} {
			if strings.HasSuffix(line, end) {
				l.counts[end]++
				close(l.changed)
				l.changed = make(chan struct{})
			}
		}
	}
	l.mu.Unlock()
	return l.w.Write(p)
}

// wait returns once n lines ending with end have been seen, and fails the
// test after timeout.
func (l *upstreamLines) wait(t *testing.T, end string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		seen, changed := l.counts[end], l.changed
		l.mu.Unlock()
		if seen >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("the upstream printed %q %d times in %v, want %d", end, seen, timeout, n)
		}
	}
}

// TestProxyTaskFlag: --task is refused when it cannot mean anything, and
// --help documents it.
func TestProxyTaskFlag(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "never.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--task", "call_status=always"}, "the proxy's own read-only tool"},
		{[]string{"--task", "charge=sometimes"}, "is not always, required or after:DURATION"},
		{[]string{"--task", "charge=after:0s"}, "positive duration"},
		{[]string{"--task", "charge=always", "--task", "charge=required"}, "given twice"},
	} {
		out := runCLI(t, nil, append(append([]string{"proxy", "--db", db}, tc.args...), "--", "node", "x.mjs")...)
		if out.code != 2 || !strings.Contains(out.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 saying %q", tc.args, out.code, out.stderr, tc.want)
		}
	}
	help := runCLI(t, nil, "proxy", "--help")
	for _, want := range []string{"-task TOOL=always|required|after:DURATION", "Tasks (MCP 2026-07-28", "MCP_OUTBOX_TASKS", "outcome unknown"} {
		if !strings.Contains(help.stdout, want) {
			t.Errorf("proxy --help does not say %q", want)
		}
	}
}

// proxyTasksModernCases are TestProxyTasksInterop's cases, each over stdio
// and over HTTP.
var proxyTasksModernCases = []string{"complete", "lost-handle", "crash"}

// TestProxyTasksInterop: the official Tasks client (@modelcontextprotocol/
// ext-tasks over @modelcontextprotocol/client, 2026-07-28) against `proxy
// --cooperating --task charge=always` in front of the Python upstream on mcp
// 2.3.0 (the "newest" venv), over stdio and over the proxy's Streamable
// HTTP (its stateless path: http_stateless.go). That upstream answers
// server/discover, which the proxy amends with the extension; the
// TypeScript upstream (SDK 1.x) answers it -32601, and the client then
// falls back to initialize at 2025-11-25, whose Tasks
// TestProxyTasksInterop2025 covers. Cases: a task completes; a lost handle
// is recovered by a retry with the same key; the proxy is SIGKILLed while
// the upstream runs the charge, and the client resumes the task from a new
// proxy process, which forwards it again.
func TestProxyTasksInterop(t *testing.T) {
	t.Parallel()
	// The Python upstream of the "newest" venv speaks 2026-07-28.
	skipShortInterop(t, "the Tasks interop tests")
	client := extTasksClients()[0]
	up := pyUpstreamKindVenv("newest")
	up.check(t)
	for _, tr := range []matrixTransport{overStdio, overHTTP} {
		for _, name := range proxyTasksModernCases {
			t.Run(name+"/"+extTasksTransportName(tr), func(t *testing.T) {
				t.Parallel()
				f := newProxyFixture(t, up)
				proxy := func(host string) *exec.Cmd {
					args := []string{"--cooperating", "--task", "charge=always"}
					if tr == overHTTP {
						args = append(args, "--http", host)
					}
					return f.proxyCommand(t, bin, []string{"UPSTREAM_CHARGE_DELAY_MS=1500"}, args...)
				}
				cmd := proxy("127.0.0.1:0")
				tmp := t.TempDir()
				plan := extTasksBasePlan("2026-07-28", name, "proxy-tasks-"+name+"-"+contractHex(t, 8))
				plan.Arguments = map[string]any{"customer": "ada", "amount_cents": 4200}
				plan.ChargeIDField = "chargeId"
				if tr == overHTTP {
					plan.URL = startHTTPCommand(t, cmd)
				} else {
					plan.Server = stdioPlan(cmd)
				}
				var during func(t *testing.T, exited <-chan struct{}) string
				if name == "crash" {
					plan.CreatedFile, plan.ResumeFile = filepath.Join(tmp, "created.json"), filepath.Join(tmp, "resume")
					during = func(t *testing.T, exited <-chan struct{}) string {
						return extTasksCrash(t, plan, f.dbPath, tr, cmd, f.fake, exited, proxy)
					}
				}
				rep := runExtTasks(t, client, &plan, during)
				checkExtTasksReport(t, extTasksCase{name: name, keyed: true, charges: 1}, rep)
				if rep.ProtocolVersion != "2026-07-28" {
					t.Errorf("negotiated %q, want 2026-07-28", rep.ProtocolVersion)
				}
				if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 1 {
					t.Fatalf("%d charges, want 1", n)
				}
				if out := runCLI(t, nil, "drain", "--db", f.dbPath, "--dest", paymentsDest(f.fake), "--timeout", "30s"); out.code != 0 {
					t.Fatalf("drain: exit %d: %s%s", out.code, out.stdout, out.stderr)
				}
				wantExactlyOnce(t, f.db, f.fake, 1)
			})
		}
	}
}

// TestProxyTasks_UpstreamCrash: a cooperating upstream dies inside a task's
// charge, before its commit. The proxy restarts it and forwards the task
// again under the same claim: the task completes with one charge, where a
// failed task would leave the client nothing to retry.
func TestProxyTasks_UpstreamCrash(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, func(t *testing.T, up upstreamKind) {
		t.Parallel()
		f := newProxyFixture(t, up)
		marker := filepath.Join(t.TempDir(), "crash-before-commit")
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		p := startTaskProxy(t, f.proxyCommand(t, bin, []string{"UPSTREAM_CRASH_BEFORE_COMMIT_ONCE_FILE=" + marker},
			"--cooperating", "--task", "charge=always"))
		created := p.result("tools/call", taskCharge("crash-up-1", "ada", 800), true)
		id, _ := created["taskId"].(string)
		done := p.waitTask(id, 60*time.Second)
		if done["status"] != "completed" {
			t.Fatalf("task after the upstream's crash = %v", done)
		}
		if _, err := os.Stat(marker); !os.IsNotExist(err) {
			t.Fatalf("the upstream never crashed (%v): the case proves nothing", err)
		}
		if n := countRows(t, f.db, `SELECT count(*) FROM charges`); n != 1 {
			t.Errorf("charges = %d, want 1", n)
		}
	})
}
