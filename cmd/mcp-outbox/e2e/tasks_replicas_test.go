package e2e

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestTasksInteropReplicas is the official Tasks client's crash case
// across replicas (issue 25: "a task started on one replica is finished by
// another after its owner is SIGKILLed"). Two `serve --http` replicas, A
// and B, share one PostgreSQL database. The client (ext-tasks, on each
// generation of Tasks) creates the task on A and hands it off; A is SIGKILLed while the task's
// charge runs; the client resumes the task from a new connection to B
// (plan.resumeUrl) and polls it there until terminal. On PostgreSQL B
// cannot see that A's process is gone: it takes the task over when A's
// lease (extTasksLease) has passed, at its next recovery scan, and runs it
// again from the stored arguments. One task id, completed, one charge, and
// after a drain one delivery.
func TestTasksInteropReplicas(t *testing.T) {
	t.Parallel()
	skipShortInterop(t, "the Tasks interop tests")
	client := extTasksClients()[0]
	extTasksDir(t) // skips (or fails under MCP_OUTBOX_REQUIRE_INTEROP=1) before any server starts
	if !serveHasTaskFlag() {
		t.Fatal("serve --help lists no --task flag")
	}
	for _, protocol := range client.protocols {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			testTasksInteropReplicas(t, client, protocol)
		})
	}
}

func testTasksInteropReplicas(t *testing.T, client extTasksClient, protocol string) {
	pgURL := pgtest.Database(t) // skips, or fails under MCP_OUTBOX_REQUIRE_POSTGRES=1
	fake := downstream.Start(t, nil)
	tmp := t.TempDir()

	aCmd := extTasksServe(pgURL, fake, true, true)
	aURL := startHTTPCommand(t, aCmd)
	bURL := startHTTPCommand(t, extTasksServe(pgURL, fake, true, true))
	key := "tasks-replicas-" + contractHex(t, 8)
	plan := extTasksBasePlan(protocol, "crash", key)
	plan.URL, plan.ResumeURL = aURL, bURL
	plan.CreatedFile, plan.ResumeFile = filepath.Join(tmp, "created.json"), filepath.Join(tmp, "resume")
	// The whole case: A's lease to pass, B's scan (every lease), the charge
	// run again, and node's start; well under a minute.
	plan.DeadlineMS = (30 * time.Second).Milliseconds()
	ldb := openLedgerDB(t, pgURL)

	start := time.Now()
	var killedAt time.Time
	rep := runExtTasks(t, client, &plan, func(t *testing.T, exited <-chan struct{}) string {
		var created struct {
			TaskID string `json:"taskId"`
		}
		if !extTasksPoll(exited, 20*time.Second, func() bool {
			b, err := os.ReadFile(plan.CreatedFile)
			return err == nil && json.Unmarshal(b, &created) == nil
		}) {
			return "the program ended (or 20 s passed) before it had a task: nothing was killed"
		}
		// The row is in flight once A's attempt has claimed it; A must die
		// with the task running, not before it was durable nor after the
		// charge committed.
		if !extTasksPoll(exited, 10*time.Second, func() bool {
			var n int
			return ldb.QueryRow(`SELECT count(*) FROM calls WHERE state = 'in_flight' AND task_id = $1`, created.TaskID).Scan(&n) == nil && n == 1
		}) {
			t.Fatalf("task %s: not in flight on A (charges: %d)", created.TaskID, countRows(t, ldb, `SELECT count(*) FROM charges`))
		}
		if err := aCmd.Process.Kill(); err != nil {
			t.Fatalf("SIGKILL A: %v", err)
		}
		_ = aCmd.Wait()
		wantKilled(t, aCmd)
		killedAt = time.Now()
		if n := countRows(t, ldb, `SELECT count(*) FROM charges`); n != 0 {
			t.Fatalf("the charge committed before A was killed (%d rows): the case proves nothing", n)
		}
		if err := os.WriteFile(plan.ResumeFile, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return "task " + created.TaskID + " in flight on A: SIGKILLed A, told the program to resume on B (" + bURL + ")"
	})
	t.Logf("case took %v (%v after A was killed)", time.Since(start).Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
	checkExtTasksReport(t, extTasksCase{name: "crash", keyed: true, charges: 1}, rep)
	if rep.ProtocolVersion != protocol {
		t.Errorf("negotiated %q, want %s", rep.ProtocolVersion, protocol)
	}
	taskID := rep.Calls[0].TaskID
	if n := countRows(t, ldb, `SELECT count(*) FROM calls WHERE task_id IS NOT NULL`); n != 1 {
		t.Errorf("%d tasks, want 1", n)
	}
	// attempts counts the claim on A and B's takeover: B ran the task
	// again; it did not find it done.
	if n := countRows(t, ldb, `SELECT attempts FROM calls WHERE task_id = $1 AND state = 'completed'`, taskID); n != 2 {
		t.Errorf("task %s: attempts = %d, want 2 (A's claim and B's takeover)", taskID, n)
	}
	id := onlyChargeID(t, ldb)
	if got := rep.Calls[0].ChargeID; got != id {
		t.Errorf("the task's result names charge #%d, want #%d", got, id)
	}

	// B's dispatcher may have delivered the effect already; the drain
	// delivers whatever is left, as after a deploy.
	if out := runCLI(t, nil, "drain", "--db", pgURL, "--dest", paymentsDest(fake), "--timeout", "20s"); out.code != 0 {
		t.Fatalf("drain: exit %d: %s%s", out.code, out.stdout, out.stderr)
	}
	wantExactlyOncePostgres(t, ldb, fake, id)

	// mcp-outbox status names the task, from the database alone.
	out, err := exec.Command(bin, "status", "--db", pgURL, key).CombinedOutput()
	if err != nil || !strings.Contains(string(out), taskID) {
		t.Errorf("mcp-outbox status %s: %v; does not name task %s:\n%s", key, err, taskID, out)
	}
}

// wantExactlyOncePostgres is wantExactlyOnce for one charge on PostgreSQL,
// whose json_extract that helper's SQL uses SQLite's: one completed call,
// one effect, delivered, whose body names the charge, and one key applied
// downstream once.
func wantExactlyOncePostgres(t *testing.T, db *sql.DB, fake *downstream.Server, chargeID int64) {
	t.Helper()
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'completed'`); n != 1 {
		t.Errorf("completed calls = %d, want 1", n)
	}
	effects := readEffects(t, db)
	if len(effects) != 1 {
		t.Fatalf("effects = %d, want 1: %+v", len(effects), effects)
	}
	e := effects[0]
	if e.state != "delivered" {
		t.Errorf("effect %d is %s (%s), want delivered", e.id, e.state, e.lastError)
	}
	var body []byte
	if err := db.QueryRow(`SELECT body FROM effects WHERE id = $1`, e.id).Scan(&body); err != nil {
		t.Fatal(err)
	}
	var b struct {
		ChargeID int64 `json:"charge_id"`
	}
	if err := json.Unmarshal(body, &b); err != nil || b.ChargeID != chargeID {
		t.Errorf("effect body %s (%v) does not name charge #%d", body, err, chargeID)
	}
	if keys := fake.Keys(); len(keys) != 1 || keys[0] != e.key {
		t.Errorf("the downstream saw keys %v, want just %q", keys, e.key)
	}
	executed := 0
	for _, r := range fake.Requests() {
		if r.Method != http.MethodPost || r.Path != "/v1/charges" || r.Key != e.key {
			t.Errorf("request %d: %s %s key %q, want POST /v1/charges with %q", r.Seq, r.Method, r.Path, r.Key, e.key)
		}
		if r.Outcome == downstream.Executed {
			executed++
		}
	}
	if applied := fake.Applied(); len(applied) != 1 || executed != 1 {
		t.Errorf("applied %d side effects, executed %d times; want once: %+v", len(applied), executed, applied)
	}
}
