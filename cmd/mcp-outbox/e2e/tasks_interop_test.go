package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

// Durable Tasks with the official Tasks clients. Each client program runs
// one case of one logical charge against `serve --task`, over stdio and
// over Streamable HTTP, on SQLite:
//   - @modelcontextprotocol/ext-tasks with @modelcontextprotocol/client 2.x
//     (testdata/ext-tasks/tasks.mjs), on 2026-07-28 (the
//     io.modelcontextprotocol/tasks extension) and on 2025-11-25 (that
//     revision's experimental Tasks, which ext-tasks speaks too);
//   - the TypeScript SDK 1.32.2's client.experimental.tasks
//     (testdata/ts-client/tasks.mjs) and the Python SDK 1.30.0's
//     session.experimental (testdata/python/tasks.py), 2025-11-25 only.
// serve speaks both generations, on one server: a 2025-11-25 session
// (initialize, then a stateful session over HTTP) gets that revision's
// Tasks, a 2026-07-28 request the extension. A program reports what its library did (the
// contract is extTasksPlan and extTasksReport below); this file starts,
// kills and restarts the servers, and judges: one task per logical call, the
// final status, exactly one charge row (none when cancelled), after a drain
// exactly one delivery downstream, and call_status naming the task.

// The versions testdata/ext-tasks/package.json pins: ext-tasks 0.2.2 accepts
// any client ^2.0.0 (an optional peer dependency); 2.4.0 is the newest.
const (
	extTasksVersion       = "0.2.2"
	extTasksClientVersion = "2.4.0"
)

const (
	// extTasksDelay is how long a charge takes: long enough to cancel or
	// kill it while it runs, short enough to keep each case a few seconds.
	extTasksDelay = 2 * time.Second
	// extTasksAfter turns a charge not done within it into a task.
	extTasksAfter = 300 * time.Millisecond
	// extTasksLease bounds how long a killed server's claim holds the task
	// from the restarted one: the default (a minute) would make the crash
	// case wait a minute. Longer than the charge, so that a second server
	// on the same database does not take over a charge that is running.
	extTasksLease = 3 * time.Second
	// extTasksDeadline bounds one case, in the program and here.
	extTasksDeadline = 45 * time.Second
)

// The protocol revisions whose Tasks the cases run on.
const (
	extTasksModern = "2026-07-28"
	extTasksLegacy = "2025-11-25"
)

var extTasksProtocols = []string{extTasksModern, extTasksLegacy}

// extTasksPlan is the plan file tasks.mjs reads.
type extTasksPlan struct {
	Case             string         `json:"case"`
	Protocol         string         `json:"protocol"`
	Server           *matrixCommand `json:"server,omitempty"`
	URL              string         `json:"url,omitempty"`
	ResumeURL        string         `json:"resumeUrl,omitempty"` // crash over HTTP: resume on another replica
	Tool             string         `json:"tool"`
	Arguments        map[string]any `json:"arguments"`
	ChargeIDField    string         `json:"chargeIdField"`
	Key              string         `json:"key,omitempty"`
	Token            string         `json:"token,omitempty"`
	OtherToken       string         `json:"otherToken,omitempty"`
	CreatedFile      string         `json:"createdFile,omitempty"`
	ResumeFile       string         `json:"resumeFile,omitempty"`
	KeepFirstOpen    bool           `json:"keepFirstOpen,omitempty"`
	Listen           bool           `json:"listen,omitempty"` // 2026-07-28: subscriptions/listen for the task
	RequestTimeoutMS int64          `json:"requestTimeoutMs"`
	DeadlineMS       int64          `json:"deadlineMs"`
}

// extTasksReport is what tasks.mjs prints.
type extTasksReport struct {
	Client          string            `json:"client"`
	Versions        map[string]string `json:"versions"`
	ProtocolVersion string            `json:"protocolVersion"`
	ServerTasks     *bool             `json:"serverTasks"` // server/discover lists the extension as {}
	Tools           []string          `json:"tools"`
	Case            string            `json:"case"`
	Calls           []extTasksCall    `json:"calls"`
	NoTask          string            `json:"noTask"` // why the first call was not made a task
	Listen          string            `json:"listen"` // what plan.Listen's subscriptions/listen did
	OtherPrincipal  *struct {
		Status    string `json:"status"`
		Error     string `json:"error"`
		ErrorCode int    `json:"errorCode"`
	} `json:"otherPrincipal"`
	Error string `json:"error"`
}

// extTasksCall is one tools/call and what became of it.
type extTasksCall struct {
	What      string   `json:"what"`
	Kind      string   `json:"kind"` // "task", "immediate", "error"
	TaskID    string   `json:"taskId"`
	Statuses  []string `json:"statuses"`
	Status    string   `json:"status"` // the final one; "dropped" for a lost handle
	ChargeID  int64    `json:"chargeId"`
	ToolError string   `json:"toolError"`
	Error     string   `json:"error"`
	ErrorCode int      `json:"errorCode"`
	MS        int64    `json:"ms"`
}

func (c extTasksCall) String() string {
	s := fmt.Sprintf("%s: %s %s [%s] -> %q, charge %d, %d ms", c.What, c.Kind, c.TaskID, strings.Join(c.Statuses, " "), c.Status, c.ChargeID, c.MS)
	if c.Error != "" {
		s += fmt.Sprintf(", error %d %s", c.ErrorCode, c.Error)
	}
	if c.ToolError != "" {
		s += ", tool error " + c.ToolError
	}
	return s
}

// extTasksCase is one case of tasks.mjs.
type extTasksCase struct {
	name  string
	keyed bool
	// httpOnly: the case needs bearer tokens, which serve takes over HTTP
	// only.
	httpOnly bool
	// keepFirstOpen: a lost handle's first connection stays open until the
	// retry is answered. Over stdio, closing it ends its server, which
	// finishes the task before it exits: the retry then finds the task done.
	// Kept open, the retry reaches a second server process while the first
	// still runs the task.
	keepFirstOpen bool
	// charges is how many charge rows the case must leave.
	charges int
	// clients, when set, are the only clients (extTasksClient.name) that
	// run the case.
	clients []string
}

var extTasksCases = []extTasksCase{
	{name: "complete", keyed: true, charges: 1},
	{name: "lost-handle", keyed: true, charges: 1},
	{name: "lost-handle-nokey", keepFirstOpen: true, charges: 1},
	{name: "cancel", keyed: true, charges: 0},
	// A cancel before the commit leaves nothing, so the same call asked
	// again (Claude Code's user re-asks) runs: a new task, one charge, and
	// the first task still cancelled to tasks/get.
	{name: "cancel-again", keyed: true, charges: 1, clients: cancelAgainClients},
	{name: "cancel-again-nokey", charges: 1, clients: cancelAgainClients},
	{name: "crash", keyed: true, charges: 1},
	{name: "other-principal", keyed: true, httpOnly: true, charges: 1},
}

// cancelAgainClients run the cancel-again cases (the Python client has
// none).
var cancelAgainClients = []string{"ext-tasks", "ts-sdk-" + tsSDKVersion}

// runsOn reports whether client c runs the case.
func (tc extTasksCase) runsOn(c extTasksClient) bool {
	return tc.clients == nil || slices.Contains(tc.clients, c.name)
}

// extTasksClient is one Tasks client program: it reads an extTasksPlan and
// prints an extTasksReport.
type extTasksClient struct {
	name  string // subtest name
	label string // the README's
	// protocols are the revisions whose Tasks it speaks.
	protocols []string
	// command returns the unstarted program for the plan file; it skips the
	// test (fails it under MCP_OUTBOX_REQUIRE_INTEROP=1) when the program's
	// packages are missing.
	command func(t *testing.T, plan string) *exec.Cmd
}

func extTasksClients() []extTasksClient {
	return []extTasksClient{
		{
			name:      "ext-tasks",
			label:     "`@modelcontextprotocol/ext-tasks` " + extTasksVersion + " + `@modelcontextprotocol/client` " + extTasksClientVersion,
			protocols: extTasksProtocols,
			command: func(t *testing.T, plan string) *exec.Cmd {
				dir := extTasksDir(t)
				cmd := exec.Command("node", filepath.Join(dir, "tasks.mjs"), plan)
				cmd.Dir, cmd.Env = dir, matrixEnv()
				return cmd
			},
		},
		{
			// The SDK 1.x's experimental Tasks: 2025-11-25 only.
			name:      "ts-sdk-" + tsSDKVersion,
			label:     "TypeScript SDK " + tsSDKVersion + " (`client.experimental.tasks`)",
			protocols: []string{extTasksLegacy},
			command: func(t *testing.T, plan string) *exec.Cmd {
				dir := tsClientDir(t)
				cmd := exec.Command("node", filepath.Join(dir, "tasks.mjs"), plan)
				cmd.Dir, cmd.Env = dir, append(matrixEnv(), "MCP_OUTBOX_TS_SDK="+tsSDKVersion)
				return cmd
			},
		},
		{
			// mcp 1.30.0 (the "latest" venv); 2.0 removed Tasks.
			name:      "python-mcp-1.30.0",
			label:     "Python SDK 1.30.0 (`session.experimental`)",
			protocols: []string{extTasksLegacy},
			command: func(t *testing.T, plan string) *exec.Cmd {
				_, python := pyUpstreamVenv(t, "latest")
				pyDir, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "python"))
				if err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(python, filepath.Join(pyDir, "tasks.py"), plan)
				cmd.Dir, cmd.Env = pyDir, matrixEnv()
				return cmd
			},
		},
	}
}

// extTasksDir returns testdata/ext-tasks, or skips the test (fails it under
// MCP_OUTBOX_REQUIRE_INTEROP=1) when node or the packages are missing.
func extTasksDir(t *testing.T) string {
	t.Helper()
	dir := matrixNodeDir(t, "ext-tasks", "@modelcontextprotocol/ext-tasks", "@modelcontextprotocol/client")
	for pkg, want := range map[string]string{"@modelcontextprotocol/ext-tasks": extTasksVersion, "@modelcontextprotocol/client": extTasksClientVersion} {
		var p struct {
			Version string `json:"version"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "node_modules", pkg, "package.json"))
		if err == nil {
			err = json.Unmarshal(b, &p)
		}
		if err != nil || p.Version != want {
			t.Fatalf("testdata/ext-tasks/node_modules/%s is %q (%v), want %s: run `npm ci` there", pkg, p.Version, err, want)
		}
	}
	return dir
}

// serveHasTaskFlag reports whether the binary under test takes --task: until
// the Tasks layer exists it does not, and the cases run without it, so that
// they fail on what the client saw (no task) rather than on a usage error.
var serveHasTaskFlag = sync.OnceValue(func() bool {
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	return bytes.Contains(out, []byte("--task"))
})

// TestTasksInteropNoTaskByDefault checks the harness against plain serve:
// the official client connects, lists tools and calls charge, and without
// --task the call is answered at once, with the charge, and no task (a tool
// never becomes a task unless told to).
func TestTasksInteropNoTaskByDefault(t *testing.T) {
	t.Parallel()
	skipShortInterop(t, "the Tasks interop tests")
	client := extTasksClients()[0]
	for _, tr := range []matrixTransport{overStdio, overHTTP} {
		t.Run(extTasksTransportName(tr), func(t *testing.T) {
			t.Parallel()
			db := filepath.Join(t.TempDir(), "run.db")
			fake := downstream.Start(t, nil)
			cmd := extTasksServe(db, fake, tr == overHTTP, false)
			plan := extTasksBasePlan(extTasksModern, "complete", "no-task-"+contractHex(t, 8))
			if tr == overHTTP {
				plan.URL = startHTTPCommand(t, cmd)
			} else {
				plan.Server = stdioPlan(cmd)
			}
			rep := runExtTasks(t, client, &plan, nil)
			if rep.Error != "" {
				t.Fatalf("tasks.mjs: %s", rep.Error)
			}
			if len(rep.Calls) != 1 {
				t.Fatalf("%d calls, want 1: %+v", len(rep.Calls), rep.Calls)
			}
			c := rep.Calls[0]
			if c.Kind != "immediate" || c.TaskID != "" || c.Status != "completed" || c.ChargeID == 0 {
				t.Fatalf("without --task: %s; want an immediate answer with the charge", c)
			}
			if rep.NoTask == "" {
				t.Errorf("the report does not say that no task came back")
			}
			if rep.ProtocolVersion != extTasksModern {
				t.Errorf("negotiated %q, want %s", rep.ProtocolVersion, extTasksModern)
			}
			if !slices.Contains(rep.Tools, "charge") {
				t.Errorf("tools/list: %v, no charge", rep.Tools)
			}
			ldb := openLedgerDB(t, db)
			if out := runCLI(t, nil, "drain", "--db", db, "--dest", paymentsDest(fake), "--timeout", "30s"); out.code != 0 {
				t.Fatalf("drain: exit %d: %s%s", out.code, out.stdout, out.stderr)
			}
			wantExactlyOnce(t, ldb, fake, 1)
		})
	}
}

// TestTasksInterop runs every case over stdio and over Streamable HTTP,
// several at once: a case mostly waits (its charge, a lease to expire), so
// make test runs more at once than go test's default -parallel, the number
// of CPUs (E2E_PARALLEL in the Makefile).
func TestTasksInterop(t *testing.T) {
	t.Parallel()
	skipShortInterop(t, "the Tasks interop tests")
	if !serveHasTaskFlag() {
		t.Log("serve --help lists no --task flag: the cases run without it and must fail with no task")
	}
	for _, c := range extTasksClients() {
		for _, protocol := range c.protocols {
			for _, tc := range extTasksCases {
				for _, tr := range []matrixTransport{overStdio, overHTTP} {
					if tc.httpOnly && tr != overHTTP || !tc.runsOn(c) {
						continue
					}
					t.Run(c.name+"/"+protocol+"/"+tc.name+"/"+extTasksTransportName(tr), func(t *testing.T) {
						t.Parallel()
						runExtTasksCase(t, c, protocol, tc, tr)
					})
				}
			}
		}
	}
}

func extTasksTransportName(tr matrixTransport) string {
	if tr == overHTTP {
		return "http"
	}
	return "stdio"
}

// extTasksServe is serve on db with the demo charge's delay, a short
// lease, and (tasks) charge made a task when not done within
// extTasksAfter; args are added at the end.
func extTasksServe(db string, fake *downstream.Server, http, tasks bool, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, "serve", "--db", db, "--dest", paymentsDest(fake), "--log-level", "warn",
		"--demo-delay", extTasksDelay.String(), "--lease", extTasksLease.String())
	if tasks && serveHasTaskFlag() {
		cmd.Args = append(cmd.Args, "--task", "charge=after:"+extTasksAfter.String())
	}
	if http {
		cmd.Args = append(cmd.Args, "--http", "127.0.0.1:0")
	}
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = matrixEnv()
	return cmd
}

func extTasksBasePlan(protocol, name, key string) extTasksPlan {
	return extTasksPlan{
		Case: name, Protocol: protocol, Key: key,
		Tool: "charge", Arguments: map[string]any{"amount": 4200, "currency": "usd"}, ChargeIDField: "charge_id",
		RequestTimeoutMS: 15_000, DeadlineMS: extTasksDeadline.Milliseconds(),
	}
}

func runExtTasksCase(t *testing.T, client extTasksClient, protocol string, tc extTasksCase, tr matrixTransport) {
	tmp := t.TempDir()
	db := filepath.Join(tmp, "run.db")
	fake := downstream.Start(t, nil)
	key := ""
	if tc.keyed {
		key = "tasks-" + tc.name + "-" + contractHex(t, 8)
	}
	plan := extTasksBasePlan(protocol, tc.name, key)
	plan.KeepFirstOpen = tc.keepFirstOpen
	var extra []string
	if tc.name == "other-principal" {
		alice, aliceLine := newTokenFor(t, "alice")
		bob, bobLine := newTokenFor(t, "bob")
		tokens := filepath.Join(tmp, "tokens")
		if err := os.WriteFile(tokens, []byte(aliceLine+bobLine), 0o600); err != nil {
			t.Fatal(err)
		}
		extra = append(extra, "--tokens", tokens)
		plan.Token, plan.OtherToken = alice, bob
	}
	cmd := extTasksServe(db, fake, tr == overHTTP, true, extra...)
	if tr == overHTTP {
		plan.URL = startHTTPCommand(t, cmd)
	} else {
		plan.Server = stdioPlan(cmd)
	}
	var during func(t *testing.T, exited <-chan struct{}) string
	if tc.name == "crash" {
		plan.CreatedFile, plan.ResumeFile = filepath.Join(tmp, "created.json"), filepath.Join(tmp, "resume")
		during = func(t *testing.T, exited <-chan struct{}) string {
			return extTasksCrash(t, plan, db, tr, cmd, fake, exited, nil)
		}
	}

	start := time.Now()
	rep := runExtTasks(t, client, &plan, during)
	t.Logf("case took %v", time.Since(start).Round(time.Millisecond))
	checkExtTasksReport(t, tc, rep)
	if rep.ProtocolVersion != protocol {
		t.Errorf("negotiated %q, want %s", rep.ProtocolVersion, protocol)
	}

	ldb := openLedgerDB(t, db)
	charges := countRows(t, ldb, `SELECT count(*) FROM charges`)
	if charges != tc.charges {
		t.Fatalf("%d charges, want %d", charges, tc.charges)
	}
	if tc.charges == 1 {
		id := onlyChargeID(t, ldb)
		for _, c := range rep.Calls {
			if c.ChargeID != 0 && c.ChargeID != id {
				t.Errorf("%s: answered charge #%d, want #%d", c.What, c.ChargeID, id)
			}
		}
	}
	// Deliver what the servers left, as a drain after a deploy would; then
	// exactly one key reached the downstream (none for a cancelled task).
	if out := runCLI(t, nil, "drain", "--db", db, "--dest", paymentsDest(fake), "--timeout", "30s"); out.code != 0 {
		t.Fatalf("drain: exit %d: %s%s", out.code, out.stdout, out.stderr)
	}
	if tc.charges == 0 {
		if n := countRows(t, ldb, `SELECT count(*) FROM effects`); n != 0 {
			t.Errorf("%d effects after a cancelled task, want 0", n)
		}
		if keys := fake.Keys(); len(keys) != 0 {
			t.Errorf("the downstream saw %v after a cancelled task, want nothing", keys)
		}
		return
	}
	wantExactlyOnce(t, ldb, fake, 1)
	// call_status names the task (issue 25: a client that lost the handle
	// can also ask). A stdio serve on the same database answers it; the
	// tokens' principals are not stdio's, and a call without a key would
	// have to be named by its arguments: keyed cases without tokens only.
	if key != "" && plan.Token == "" {
		cs, _ := serveStdio(t, bin, db, nil)
		st := callStatus(t, cs, key)
		task := rep.Calls[0].TaskID
		if strings.HasPrefix(tc.name, "cancel-again") {
			task = rep.Calls[1].TaskID // the key names the call that ran
		}
		if b, _ := json.Marshal(st); !bytes.Contains(b, []byte(task)) {
			t.Errorf("call_status %q does not name task %s: %s", key, task, b)
		}
	}
}

// checkExtTasksReport judges what the client saw: a task for the first
// call, one task id per logical call, and the final status.
func checkExtTasksReport(t *testing.T, tc extTasksCase, rep *extTasksReport) {
	t.Helper()
	t.Logf("%s %v, protocol %s, server lists Tasks: %v, tools %v", rep.Client, rep.Versions, rep.ProtocolVersion, extTasksBool(rep.ServerTasks), rep.Tools)
	for i, c := range rep.Calls {
		t.Logf("call %d: %s", i+1, c)
	}
	if rep.NoTask != "" {
		why := rep.NoTask
		if !serveHasTaskFlag() {
			why += "; and `serve --help` lists no --task flag: this binary has no Tasks (issue 25)"
		}
		t.Fatalf("no task: %s", why)
	}
	if rep.Error != "" {
		t.Fatalf("tasks.mjs: %s", rep.Error)
	}
	if len(rep.Calls) == 0 {
		t.Fatal("no call was made")
	}
	first, last := rep.Calls[0], rep.Calls[len(rep.Calls)-1]
	if first.Kind != "task" || first.TaskID == "" {
		t.Fatalf("first call: %s; want a task", first)
	}
	if strings.HasPrefix(tc.name, "cancel-again") {
		checkCancelAgain(t, rep)
		return
	}
	for _, c := range rep.Calls {
		if c.TaskID != first.TaskID {
			t.Errorf("%s: task %q, want the first call's %q: one logical call, one task", c.What, c.TaskID, first.TaskID)
		}
	}
	switch tc.name {
	case "lost-handle", "lost-handle-nokey":
		if len(rep.Calls) != 2 || rep.Calls[1].Kind != "task" {
			t.Fatalf("want 2 calls, the retry answered with the first call's task: %+v", rep.Calls)
		}
	case "other-principal":
		o := rep.OtherPrincipal
		if o == nil {
			t.Fatal("the report has no read by the other principal")
		}
		// DESIGN.md: unknown, or another principal's, task: -32602 "Task not found".
		if o.Status != "" || o.ErrorCode != -32602 {
			t.Errorf("tasks/get by another principal: status %q, error %d %q; want -32602 Task not found", o.Status, o.ErrorCode, o.Error)
		}
	}
	want := "completed"
	if tc.name == "cancel" {
		want = "cancelled"
	}
	if last.Status != want || last.Error != "" || last.ToolError != "" {
		t.Fatalf("last call: %s; want the task %s", last, want)
	}
	if want == "completed" && last.ChargeID == 0 {
		t.Fatalf("last call: %s; the completed task's result names no charge", last)
	}
}

// checkCancelAgain judges the cancel-again cases: the first task ended
// cancelled, the same call asked again became a new task that ran and
// completed with a charge, and tasks/get of the first still says cancelled.
func checkCancelAgain(t *testing.T, rep *extTasksReport) {
	t.Helper()
	if len(rep.Calls) != 3 {
		t.Fatalf("%d calls, want 3 (the cancelled call, the call asked again, tasks/get of the first): %+v", len(rep.Calls), rep.Calls)
	}
	first, again, get := rep.Calls[0], rep.Calls[1], rep.Calls[2]
	if first.Status != "cancelled" || first.Error != "" {
		t.Fatalf("%s; want the task cancelled", first)
	}
	if again.Kind != "task" || again.TaskID == first.TaskID || again.Status != "completed" || again.ChargeID == 0 || again.Error != "" || again.ToolError != "" {
		t.Fatalf("%s; want a new task, run and completed with a charge (the cancelled task is %s)", again, first.TaskID)
	}
	if get.TaskID != first.TaskID || get.Status != "cancelled" || get.Error != "" {
		t.Fatalf("%s; want the first task still cancelled", get)
	}
}

func extTasksBool(b *bool) string {
	if b == nil {
		return "unknown"
	}
	return fmt.Sprint(*b)
}

// runExtTasks writes plan, runs tasks.mjs on it and returns its report.
// during, when set, runs while the program does (the crash case's kill and
// restart) and returns what it did; exited is closed when the program ends.
func runExtTasks(t *testing.T, client extTasksClient, plan *extTasksPlan, during func(t *testing.T, exited <-chan struct{}) string) *extTasksReport {
	t.Helper()
	planFile := filepath.Join(t.TempDir(), "plan.json")
	b, err := json.MarshalIndent(plan, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(planFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The program bounds itself by plan.DeadlineMS; this is the backstop.
	ctx, cancel := context.WithTimeout(context.Background(), extTasksDeadline+15*time.Second)
	defer cancel()
	c := client.command(t, planFile)
	cmd := exec.CommandContext(ctx, c.Path, c.Args[1:]...)
	cmd.Dir, cmd.Env = c.Dir, c.Env
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, testWriter{t}
	// A stdio server the program started inherits its stderr; should it
	// outlive the program, stop waiting for the pipe after a while.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var runErr error
	go func() { runErr = cmd.Wait(); close(exited) }()
	if during != nil {
		t.Log(during(t, exited))
	}
	<-exited
	line := lastLine(stdout.String())
	var rep extTasksReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatalf("tasks.mjs printed no report (%v; exit %v); stdout:\n%s", err, runErr, stdout.String())
	}
	var exit *exec.ExitError
	if runErr != nil && rep.Error == "" && !errors.As(runErr, &exit) {
		rep.Error = runErr.Error()
	}
	return &rep
}

// extTasksCrash waits for the program to have its task, then for the
// call's row to be in flight, SIGKILLs the server that runs it, checks that
// nothing committed, restarts the server (over HTTP: at the same address;
// over stdio the program starts it) and tells the program to resume. It
// returns what it did; a failed premise fails the test.
//
// restart, when set, makes the command that serves again at host over HTTP
// (`proxy --http host`, say); nil restarts serve.
func extTasksCrash(t *testing.T, plan extTasksPlan, db string, tr matrixTransport, cmd *exec.Cmd, fake *downstream.Server, exited <-chan struct{},
	restart func(host string) *exec.Cmd) string {
	t.Helper()
	var created struct {
		TaskID string `json:"taskId"`
		PID    int    `json:"pid"`
	}
	if !extTasksPoll(exited, 30*time.Second, func() bool {
		b, err := os.ReadFile(plan.CreatedFile)
		return err == nil && json.Unmarshal(b, &created) == nil
	}) {
		return "the program ended (or 30 s passed) before it had a task: nothing was killed"
	}
	ldb := openLedgerDB(t, db)
	inFlight := func() bool {
		var n int
		return ldb.QueryRow(`SELECT count(*) FROM calls WHERE state = 'in_flight'`).Scan(&n) == nil && n > 0
	}
	if !extTasksPoll(exited, 10*time.Second, inFlight) {
		t.Fatalf("task %s: no call in flight to kill (charges: %d)", created.TaskID, countRows(t, ldb, `SELECT count(*) FROM charges`))
	}
	switch tr {
	case overStdio:
		if created.PID == 0 {
			t.Fatal("the program did not say which server runs the task")
		}
		if err := syscall.Kill(created.PID, syscall.SIGKILL); err != nil {
			t.Fatalf("SIGKILL %d: %v", created.PID, err)
		}
	case overHTTP:
		cmd.Process.Kill()
		cmd.Wait()
	}
	// The charge commits at the end of its delay: one committed before the
	// kill would leave nothing for the restart to finish.
	if n := countRows(t, ldb, `SELECT count(*) FROM charges`); n != 0 {
		t.Fatalf("the charge committed before the kill (%d rows): the case proves nothing", n)
	}
	what := fmt.Sprintf("task %s in flight: SIGKILLed the server", created.TaskID)
	if tr == overHTTP {
		u, err := url.Parse(plan.URL)
		if err != nil {
			t.Fatal(err)
		}
		var again *exec.Cmd
		if restart != nil {
			again = restart(u.Host)
		} else {
			again = extTasksServe(db, fake, true, true)
			for i, a := range again.Args[:len(again.Args)-1] {
				if a == "--http" {
					again.Args[i+1] = u.Host
				}
			}
		}
		if got := startHTTPCommand(t, again); got != plan.URL {
			t.Fatalf("restarted server serves at %s, want %s", got, plan.URL)
		}
		what += ", restarted it at " + u.Host
	}
	if err := os.WriteFile(plan.ResumeFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return what + ", told the program to resume the task from a new connection"
}

// extTasksPoll polls cond every 20 ms until it holds (true), the program
// exits or timeout passes (false).
func extTasksPoll(exited <-chan struct{}, timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-exited:
			return cond()
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}
