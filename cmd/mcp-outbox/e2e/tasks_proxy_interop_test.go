package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// The official Tasks clients of the 2025-11-25 revision through `mcp-outbox
// proxy --task`, in front of the real TypeScript and Python upstreams
// (testdata/ts-upstream, testdata/py-upstream), over stdio and over the
// proxy's Streamable HTTP: @modelcontextprotocol/ext-tasks with
// @modelcontextprotocol/client on a 2025-11-25 connection, the TypeScript
// SDK 1.32.2's client.experimental.tasks and Python mcp 1.30.0's
// session.experimental. The programs and their reports are
// TestTasksInterop's (tasks_interop_test.go); ext-tasks on 2026-07-28
// through the proxy is TestProxyTasksInterop.

// proxyTasksCase is one case, with the upstream it runs against on each
// transport: every case meets both upstreams, across the two transports.
type proxyTasksCase struct {
	name        string // the client program's case
	cooperating bool   // --cooperating, and the upstream records its calls itself
	stdio, http upstreamKind
}

func (c proxyTasksCase) String() string {
	if c.cooperating {
		return c.name
	}
	return c.name + "-noncooperating"
}

func (c proxyTasksCase) upstream(tr matrixTransport) upstreamKind {
	if tr == overHTTP {
		return c.http
	}
	return c.stdio
}

// proxyTasksCases: a slow call becomes a task and completes; a lost handle
// is recovered by a retry with the same key; the proxy is SIGKILLed while
// the upstream runs the task, and the restarted proxy forwards it again
// (cooperating: it completes once) or reports it failed with its outcome
// unknown, never forwarding it twice (not cooperating).
var proxyTasksCases = []proxyTasksCase{
	{name: "complete", cooperating: true, stdio: tsUpstreamKind, http: pyUpstreamKind},
	{name: "lost-handle", cooperating: true, stdio: pyUpstreamKind, http: tsUpstreamKind},
	{name: "crash", cooperating: true, stdio: tsUpstreamKind, http: pyUpstreamKind},
	{name: "crash", cooperating: false, stdio: pyUpstreamKind, http: tsUpstreamKind},
}

// TestProxyTasksInterop2025 runs every case with every client of the
// 2025-11-25 Tasks, over stdio and over HTTP.
func TestProxyTasksInterop2025(t *testing.T) {
	t.Parallel()
	skipShortInterop(t, "the Tasks interop tests")
	for _, c := range extTasksClients() {
		if !slices.Contains(c.protocols, extTasksLegacy) {
			continue
		}
		for _, tc := range proxyTasksCases {
			for _, tr := range []matrixTransport{overStdio, overHTTP} {
				up := tc.upstream(tr)
				t.Run(fmt.Sprintf("%s/%s/%s/%s", c.name, tc, extTasksTransportName(tr), up.name), func(t *testing.T) {
					t.Parallel()
					runProxyTasksInterop(t, c, extTasksLegacy, tc, tr, up)
				})
			}
		}
	}
}

func runProxyTasksInterop(t *testing.T, client extTasksClient, protocol string, tc proxyTasksCase, tr matrixTransport, up upstreamKind) {
	up.check(t)
	f := newProxyFixture(t, up)
	env := []string{"UPSTREAM_CHARGE_DELAY_MS=" + fmt.Sprint(extTasksDelay.Milliseconds()), "UPSTREAM_COOPERATE=0"}
	// after: as a slow tool would be configured; a 2025-11-25 client asks
	// for its task itself (params.task), and gets one at once.
	args := []string{"--task", "charge=after:" + extTasksAfter.String()}
	if tc.cooperating {
		env[1] = "UPSTREAM_COOPERATE=1"
		args = append(args, "--cooperating")
	}
	proxy := func(host string) *exec.Cmd {
		a := args
		if tr == overHTTP {
			a = append(slices.Clone(args), "--http", host)
		}
		return f.proxyCommand(t, bin, env, a...)
	}
	cmd := proxy("127.0.0.1:0")
	tmp := t.TempDir()
	plan := extTasksBasePlan(protocol, tc.name, "proxy-tasks-"+tc.name+"-"+contractHex(t, 8))
	plan.Arguments = map[string]any{"customer": "ada", "amount_cents": 4200}
	plan.ChargeIDField = "chargeId"
	if tr == overHTTP {
		plan.URL = startHTTPCommand(t, cmd)
	} else {
		plan.Server = stdioPlan(cmd)
	}
	var during func(t *testing.T, exited <-chan struct{}) string
	if tc.name == "crash" {
		plan.CreatedFile, plan.ResumeFile = filepath.Join(tmp, "created.json"), filepath.Join(tmp, "resume")
		during = func(t *testing.T, exited <-chan struct{}) string {
			return extTasksCrash(t, plan, f.dbPath, tr, cmd, f.fake, exited, proxy)
		}
	}
	rep := runExtTasks(t, client, &plan, during)
	if rep.ProtocolVersion != protocol {
		t.Errorf("negotiated %q, want %s", rep.ProtocolVersion, protocol)
	}
	charges := countRows(t, f.db, `SELECT count(*) FROM charges`)
	if !tc.cooperating {
		// The charge may have happened before the kill: the task ends
		// failed, its call unknown, and it is never forwarded again.
		if rep.Error != "" {
			t.Fatalf("client: %s", rep.Error)
		}
		for i, c := range rep.Calls {
			t.Logf("call %d: %s", i+1, c)
		}
		if len(rep.Calls) == 0 || rep.Calls[0].Kind != "task" {
			t.Fatalf("calls %+v: want a task", rep.Calls)
		}
		if last := rep.Calls[len(rep.Calls)-1]; last.Status != "failed" {
			t.Fatalf("last call: %s; want the task failed (outcome unknown)", last)
		}
		if n := countRows(t, f.db, `SELECT count(*) FROM calls WHERE task_id = $1 AND state = 'unknown'`, rep.Calls[0].TaskID); n != 1 {
			t.Errorf("the task's call is not unknown")
		}
		if charges > 1 {
			t.Errorf("charges = %d: the unknown task was forwarded again", charges)
		}
		return
	}
	checkExtTasksReport(t, extTasksCase{name: tc.name, keyed: true, charges: 1}, rep)
	if charges != 1 {
		t.Fatalf("%d charges, want 1", charges)
	}
	if out := runCLI(t, nil, "drain", "--db", f.dbPath, "--dest", paymentsDest(f.fake), "--timeout", "30s"); out.code != 0 {
		t.Fatalf("drain: exit %d: %s%s", out.code, out.stdout, out.stderr)
	}
	wantExactlyOnce(t, f.db, f.fake, 1)
}
