package e2e

import (
	"context"
	"database/sql"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// Replicas: several `serve --http` processes on one PostgreSQL database,
// with the retry of a call sent to another replica than the one that ran
// it, as a load balancer without sticky sessions does.

// pollReplicas checks cond every 20 ms until it holds, for at most d.
func pollReplicas(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting (%s) for %s", d, what)
		}
		<-tick.C
	}
}

// The replica that ran the call is SIGKILLed after its commit and before
// answering; the retry goes to another replica and gets the recorded
// result.
func TestReplicas_KilledAfterCommitRetryOnAnother(t *testing.T) {
	t.Parallel()
	url, db := replicaDB(t)
	aURL, aCmd := startHTTP(t, failpointBin, url, []string{"MCP_OUTBOX_FAILPOINTS=call.after_commit=crash"})
	bURL, _ := startHTTP(t, bin, url, nil)
	a := connectHTTP(t, aURL, "", httpClient(t, ""))
	if _, err := a.CallTool(context.Background(), chargeCall("k-killed", 250)); err == nil {
		t.Fatal("the call answered although its replica was killed after the commit")
	}
	_ = aCmd.Wait()
	wantKilled(t, aCmd)
	b := connectHTTP(t, bURL, "", httpClient(t, ""))
	res := mustSucceed(t, b, chargeCall("k-killed", 250))
	wantReplay(t, res, true, "meta")
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
}

// A replica is SIGSTOPped between its claim and its handler, past its
// lease. The claim of a fresh key rides uncommitted in the call's
// transaction (outbox/claim_tx_postgres.go), which PostgreSQL ends once it
// has been idle a lease long (idle_in_transaction_session_timeout): the
// retry on another replica waits at the key until then, and runs the call;
// the stopped replica, resumed, finds its transaction gone and commits
// nothing.
func TestReplicas_StoppedPastLeaseDoesNotCommit(t *testing.T) {
	t.Parallel()
	url, db := replicaDB(t)
	aURL, aCmd := startHTTP(t, failpointBin, url, []string{"MCP_OUTBOX_FAILPOINTS=call.after_claim=sleep(2s)"}, "--lease", "1s")
	bURL, _ := startHTTP(t, bin, url, nil, "--lease", "1s")
	a := connectHTTP(t, aURL, "", httpClient(t, ""))
	first := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := a.CallTool(context.Background(), chargeCall("k-stopped", 300))
		if err != nil {
			t.Errorf("stopped replica's call: %v", err)
		}
		first <- res
	}()
	pollReplicas(t, 10*time.Second, "the claim", func() bool {
		// Uncommitted, so not in calls: its transaction is what shows.
		return countRows(t, db, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'`) >= 1
	})
	if err := aCmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = aCmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	b := connectHTTP(t, bURL, "", httpClient(t, ""))
	res := mustSucceed(t, b, chargeCall("k-stopped", 300))
	if meta := callMetaOf(res); meta["replayed"] == true {
		t.Fatalf("the retry replayed, but nobody had committed: %v", meta)
	}
	if err := aCmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	old := <-first
	if old == nil || !old.IsError {
		t.Fatalf("the resumed replica answered %v; want an error saying nothing was recorded", old)
	}
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
	if n := countRows(t, db, `SELECT attempts FROM calls WHERE key = 'k-stopped'`); n != 1 {
		t.Fatalf("attempts = %d, want 1 (the stopped replica's claim never committed)", n)
	}
}

// Three replicas receive the same key at the same instant: one charge,
// three answers with its result.
func TestReplicas_SameKeyAtOnce(t *testing.T) {
	t.Parallel()
	url, db := replicaDB(t)
	var sessions []*mcp.ClientSession
	for range 3 {
		u, _ := startHTTP(t, bin, url, nil)
		sessions = append(sessions, connectHTTP(t, u, "", httpClient(t, "")))
	}
	const keys = 10
	ids := make([][3]int64, keys)
	var wg sync.WaitGroup
	for k := range keys {
		for i, cs := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := cs.CallTool(context.Background(), chargeCall("k-same-"+string(rune('a'+k)), 100+k))
				if err != nil || res.IsError {
					t.Errorf("key %d replica %d: %v %s", k, i, err, resultText(res))
					return
				}
				ids[k][i] = structuredChargeID(t, res)
			}()
		}
	}
	wg.Wait()
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != keys {
		t.Fatalf("charges = %d, want %d", n, keys)
	}
	for k, got := range ids {
		if got[0] != got[1] || got[1] != got[2] {
			t.Errorf("key %d: charge ids %v differ across replicas", k, got)
		}
	}
}

// PostgreSQL restarts under a replica: while it is down calls fail with a
// clear error and /readyz says 503; once it is back the replica recovers
// by itself, and nothing is lost or done twice.
func TestReplicas_PostgresRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts PostgreSQL and servers")
	}
	srv, err := pgtest.Start()
	if err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	defer srv.Stop()
	db, err := sql.Open("pgx", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	u, _ := startHTTP(t, bin, srv.URL, nil, "--in-flight-wait", "2s")
	base := strings.TrimSuffix(u, "/mcp")
	cs := connectHTTP(t, u, "", httpClient(t, ""))
	mustSucceed(t, cs, chargeCall("k-before", 100))

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), chargeCall("k-down", 100))
	if err != nil || !res.IsError || !strings.Contains(resultText(res), "nothing was executed") {
		t.Fatalf("with PostgreSQL down: %v %s", err, resultText(res))
	}
	if code := getStatus(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with PostgreSQL down: %d, want 503", code)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	pollReplicas(t, 30*time.Second, "/readyz after the restart", func() bool { return getStatus(t, base+"/readyz") == http.StatusOK })
	mustSucceed(t, cs, chargeCall("k-down", 100))
	wantReplay(t, mustSucceed(t, cs, chargeCall("k-before", 100)), true, "meta")
	if n := countRows(t, db, `SELECT count(*) FROM charges`); n != 2 {
		t.Fatalf("charges = %d, want 2", n)
	}
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// 10,000 effects (2,500 calls of four each) are delivered by the
// dispatchers of three replicas while one of them is SIGKILLed and
// started again: each effect applied downstream once, each call's effects
// in their order, none left in flight. The killed replica's leased effects
// come back when their lease passes (30 s at least): on PostgreSQL a
// replica cannot tell that another's process is gone.
func TestReplicas_TenThousandEffectsWithAKill(t *testing.T) {
	t.Parallel()
	url, db := replicaDB(t)
	fake := downstream.Start(t, nil)
	dest := paymentsDest(fake, "timeout=2s")
	start := func() *exec.Cmd {
		_, cmd := startHTTP(t, bin, url, nil, "--dest", dest)
		return cmd
	}
	first := start() // creates the tables
	const calls, perCall = 2500, 4
	now := time.Now().UnixMilli()
	if _, err := db.Exec(`
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, created_at, completed_at, expires_at)
SELECT 'call_seed' || g, 'local', 'seed-' || g, 'meta', 'charge', 'h', 'completed', $1::bigint, $1::bigint, $1::bigint + 86400000
FROM generate_series(1, $2::int) g`, now, calls); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`
INSERT INTO effects (call_id, seq, destination, method, path, headers, body, idempotency_key, next_attempt_at, created_at, updated_at)
SELECT c.id, s, 'payments', 'POST', '/v1/charges', '{"Content-Type":"application/json"}',
       convert_to('{"charge_id":' || c.id || ',"amount":100,"currency":"usd"}', 'UTF8'), c.uid || '-' || s, $1::bigint, $1::bigint, $1::bigint
FROM calls c, generate_series(1, $2::int) s WHERE c.key LIKE 'seed-%'`, now, perCall); err != nil {
		t.Fatal(err)
	}
	// The seeded rows were inserted behind the dispatchers' backs, with no
	// call committing: wake them as a commit would.
	if _, err := db.Exec(`NOTIFY mcp_outbox_effects`); err != nil {
		t.Fatal(err)
	}
	victim := start()
	start()
	_ = first
	total := calls * perCall
	delivered := func() int {
		return countRows(t, db, `SELECT count(*) FROM effects WHERE state = 'delivered'`)
	}
	pollReplicas(t, 2*time.Minute, "a fifth of the effects delivered", func() bool { return delivered() >= total/5 })
	if err := victim.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	start()
	pollReplicas(t, 3*time.Minute, "every effect delivered", func() bool { return delivered() == total })

	if n := countRows(t, db, `SELECT count(*) FROM effects WHERE state <> 'delivered'`); n != 0 {
		t.Fatalf("%d effects not delivered", n)
	}
	applied := fake.Applied()
	seen := map[string]bool{}
	last := map[string]int{} // call uid -> last seq applied
	for _, e := range applied {
		if seen[e.Key] {
			t.Fatalf("effect %s applied twice downstream", e.Key)
		}
		seen[e.Key] = true
		i := strings.LastIndexByte(e.Key, '-')
		uid := e.Key[:i]
		seq, _ := strconv.Atoi(e.Key[i+1:])
		if seq != last[uid]+1 {
			t.Fatalf("call %s: effect %d applied after effect %d (order broken)", uid, seq, last[uid])
		}
		last[uid] = seq
	}
	if len(applied) != total {
		t.Fatalf("%d effects applied downstream, want %d", len(applied), total)
	}
	t.Logf("%d requests downstream for %d effects (retries carry the same key)", len(fake.Requests()), total)
}

// The operator commands work on a PostgreSQL URL as on a file: status finds
// a call a replica recorded, outbox summary and list show its effect, and
// purge runs.
func TestReplicas_OperatorCommandsOnPostgres(t *testing.T) {
	t.Parallel()
	url, _ := replicaDB(t)
	u, _ := startHTTP(t, bin, url, nil)
	cs := connectHTTP(t, u, "", httpClient(t, ""))
	mustSucceed(t, cs, chargeCall("k-ops", 4200))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--db", url, "k-ops"}, `"state": "completed"`},
		{[]string{"outbox", "summary", "--db", url}, "pending"},
		{[]string{"outbox", "list", "--db", url}, "/v1/charges"},
		{[]string{"purge", "--db", url, "--dry-run"}, ""},
	} {
		out, err := exec.Command(bin, c.args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("mcp-outbox %s: %v\n%s", strings.Join(c.args[:1], " "), err, out)
		}
		if strings.Contains(string(out), "SQLSTATE") {
			t.Errorf("mcp-outbox %s printed a database error:\n%s", c.args[0], out)
		}
	}
}
