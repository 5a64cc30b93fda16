package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

// extTasksNotifyPoll is the pollInterval serve tells the client in
// extTasksNotifyPoll is the pollInterval serve tells the client in
// TestTasksInteropNotify: longer than the case's deadline, so a client that
// finishes the task did not wait for its next poll.
const extTasksNotifyPoll = 10 * time.Minute

// TestTasksInteropNotify: a task's end reaches the official client as a
// status notification, and the client acts on it, on both generations:
// notifications/tasks/status on a 2025-11-25 session (over stdio, and on
// the standalone stream of a Streamable HTTP session), notifications/tasks
// on the 2026-07-28 subscriptions/listen stream the client opens for the
// task (over stdio, and as the listen's own POST over stateless HTTP).
// serve tells the client to poll every ten minutes; ext-tasks 0.2.2 waits
// that long between polls unless a notification wakes it, so a task that
// completes within seconds was finished by the notification (at 2026-07-28
// the notification carries the result: no tasks/get at all).
func TestTasksInteropNotify(t *testing.T) {
	t.Parallel()
	skipShortInterop(t, "the Tasks interop tests")
	client := extTasksClients()[0] // ext-tasks
	for _, protocol := range extTasksProtocols {
		for _, tr := range []matrixTransport{overStdio, overHTTP} {
			t.Run(protocol+"/"+extTasksTransportName(tr), func(t *testing.T) {
				t.Parallel()
				db := filepath.Join(t.TempDir(), "run.db")
				fake := downstream.Start(t, nil)
				plan := extTasksBasePlan(protocol, "complete", "tasks-notify-"+contractHex(t, 8))
				plan.DeadlineMS = (30 * time.Second).Milliseconds()
				plan.Listen = protocol == extTasksModern
				cmd := extTasksServe(db, fake, tr == overHTTP, true, "--task-poll", extTasksNotifyPoll.String())
				if tr == overHTTP {
					plan.URL = startHTTPCommand(t, cmd)
				} else {
					plan.Server = stdioPlan(cmd)
				}
				start := time.Now()
				rep := runExtTasks(t, client, &plan, nil)
				took := time.Since(start)
				t.Logf("case took %v", took.Round(time.Millisecond))
				checkExtTasksReport(t, extTasksCase{name: "complete", keyed: true, charges: 1}, rep)
				if plan.Listen && rep.Listen != "acknowledged" {
					t.Fatalf("subscriptions/listen for the task: %q, want acknowledged", rep.Listen)
				}
				if took > extTasksDelay+15*time.Second {
					t.Fatalf("the task took %v with a poll interval of %v: no status notification woke the client", took, extTasksNotifyPoll)
				}
				wantExactlyOnceAfterDrain(t, db, fake)
			})
		}
	}
}

// wantExactlyOnceAfterDrain drains db and checks one charge, delivered once.
func wantExactlyOnceAfterDrain(t *testing.T, db string, fake *downstream.Server) {
	t.Helper()
	ldb := openLedgerDB(t, db)
	if n := countRows(t, ldb, `SELECT count(*) FROM charges`); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if out := runCLI(t, nil, "drain", "--db", db, "--dest", paymentsDest(fake), "--timeout", "30s"); out.code != 0 {
		t.Fatalf("drain: exit %d: %s%s", out.code, out.stdout, out.stderr)
	}
	wantExactlyOnce(t, ldb, fake, 1)
}
