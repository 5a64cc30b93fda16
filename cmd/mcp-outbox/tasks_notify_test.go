package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

// extTasksNotifyPoll is the pollInterval serve tells the client in
// TestTasksInteropNotify: longer than the case's deadline, so a client that
// finishes the task did not wait for its next poll.
const extTasksNotifyPoll = 10 * time.Minute

// TestTasksInteropNotify: a 2025-11-25 task's end reaches the official
// client as notifications/tasks/status, and the client acts on it. serve
// tells the client to poll every ten minutes; ext-tasks 0.2.2 waits that
// long between polls unless a status notification wakes it, so a task that
// completes within seconds was finished by the notification (the client
// then reads tasks/result), over stdio and over the standalone stream of a
// Streamable HTTP session.
func TestTasksInteropNotify(t *testing.T) {
	skipShortInterop(t, "the Tasks interop tests")
	client := extTasksClients()[0] // ext-tasks
	for _, tr := range []matrixTransport{overStdio, overHTTP} {
		t.Run(extTasksTransportName(tr), func(t *testing.T) {
			t.Parallel()
			db := filepath.Join(t.TempDir(), "run.db")
			fake := downstream.Start(t, nil)
			plan := extTasksBasePlan(extTasksLegacy, "complete", "tasks-notify-"+contractHex(t, 8))
			plan.DeadlineMS = (30 * time.Second).Milliseconds()
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
			if took > extTasksDelay+15*time.Second {
				t.Fatalf("the task took %v with a poll interval of %v: no status notification woke the client", took, extTasksNotifyPoll)
			}
			wantExactlyOnceAfterDrain(t, db, fake)
		})
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
