package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
)

// Crash and shutdown tests of effect delivery in a real `serve` process:
// the dispatcher is killed with SIGKILL at each of its failpoints, or
// stopped with SIGTERM during a slow send, and a restarted serve on the same
// database must finish the job with every effect applied once downstream.

// Failpoints on the delivery path (package outbox).
const (
	fpDispatchAfterClaim    = "dispatch.after_claim"    // effect leased, nothing sent
	fpDispatchAfterSend     = "dispatch.after_send"     // request written, response not read
	fpDispatchAfterResponse = "dispatch.after_response" // response read, outcome not recorded
)

// dispatchEffect is a row of table effects, as these tests check it.
type dispatchEffect struct {
	id          int64
	key         string
	state       string
	attempts    int
	leaseOwner  string
	sendStarted sql.NullInt64
	lastError   string
}

func readEffects(t *testing.T, db *sql.DB) []dispatchEffect {
	t.Helper()
	rows, err := db.Query(`SELECT id, idempotency_key, state, attempts, lease_owner, send_started_at, last_error FROM effects ORDER BY id`)
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	defer rows.Close()
	var out []dispatchEffect
	for rows.Next() {
		var e dispatchEffect
		if err := rows.Scan(&e.id, &e.key, &e.state, &e.attempts, &e.leaseOwner, &e.sendStarted, &e.lastError); err != nil {
			t.Fatalf("read effects: %v", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read effects: %v", err)
	}
	return out
}

// waitEffects polls the database until every effect is in one of states
// and there are n of them, and returns them; it fails after timeout.
func waitEffects(t *testing.T, db *sql.DB, n int, timeout time.Duration, states ...string) []dispatchEffect {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		effects := readEffects(t, db)
		done := len(effects) == n
		for _, e := range effects {
			done = done && containsString(states, e.state)
		}
		if done {
			return effects
		}
		if time.Now().After(deadline) {
			t.Fatalf("effects not all %v within %s: %+v", states, timeout, effects)
		}
		<-tick.C
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// chargeUntilCrash makes a charge under each key, in order, until a call
// fails: the dispatcher kills the process on its first effect, which may
// be before, during or after any of these calls. It returns how many calls
// were answered.
func chargeUntilCrash(t *testing.T, cs *mcp.ClientSession, keys []string) int {
	t.Helper()
	for i, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := cs.CallTool(ctx, chargeCall(k, 100+i))
		cancel()
		if err != nil {
			return i
		}
		if res.IsError {
			t.Fatalf("charge %s: tool error %s", k, resultText(res))
		}
	}
	return len(keys)
}

// waitExit waits until the server's end of the session closes (the
// process died or exited), closes the client side, which reaps the
// process, and says how long the wait took.
func waitExit(t *testing.T, cs *mcp.ClientSession, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() { cs.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("the server process did not end within %s", timeout)
	}
	took := time.Since(start)
	cs.Close()
	return took
}

// wantExitedZero checks that a server process exited by itself with status 0.
func wantExitedZero(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	ps := cmd.ProcessState
	if ps == nil {
		t.Fatal("server process was not waited for")
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); !ok || ws.Signaled() || ws.ExitStatus() != 0 {
		t.Fatalf("server process ended with %v, want exit status 0", ps)
	}
}

// wantExactlyOnce checks the end state after delivery: n charges, n
// completed calls, n effects all in state final; downstream, one distinct
// Idempotency-Key per effect, sent as an sf-string on POST /v1/charges, and
// exactly one applied side effect per effect.
func wantExactlyOnce(t *testing.T, db *sql.DB, fake *downstream.Server, n int) []dispatchEffect {
	t.Helper()
	if got := countRows(t, db, `SELECT count(*) FROM charges`); got != n {
		t.Errorf("charges = %d, want %d", got, n)
	}
	if got := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'completed'`); got != n {
		t.Errorf("completed calls = %d, want %d", got, n)
	}
	effects := readEffects(t, db)
	if len(effects) != n {
		t.Fatalf("effects = %d, want one per charge (%d): %+v", len(effects), n, effects)
	}
	if got := countRows(t, db, `SELECT count(*) FROM effects e JOIN charges c ON json_extract(CAST(e.body AS TEXT), '$.charge_id') = c.id`); got != n {
		t.Errorf("%d effects name a charge in their body, want %d", got, n)
	}
	keys := map[string]bool{}
	for _, e := range effects {
		if e.state != "delivered" {
			t.Errorf("effect %d is %s (%s), want delivered", e.id, e.state, e.lastError)
		}
		keys[e.key] = true
	}
	if len(keys) != n {
		t.Errorf("%d distinct effect keys for %d effects", len(keys), n)
	}
	seen := fake.Keys()
	if len(seen) != n {
		t.Errorf("the fake saw %d distinct keys %v, want %d", len(seen), seen, n)
	}
	for _, k := range seen {
		if !keys[k] {
			t.Errorf("the fake saw key %q, which no effect has", k)
		}
	}
	executed := map[string]int{}
	for _, r := range fake.Requests() {
		if r.Method != http.MethodPost || r.Path != "/v1/charges" {
			t.Errorf("request %d: %s %s, want POST /v1/charges", r.Seq, r.Method, r.Path)
		}
		if got, want := r.Header.Get("Idempotency-Key"), strconv.Quote(r.Key); !keys[r.Key] || got != want {
			t.Errorf("request %d: Idempotency-Key %s, want one effect's key as an sf-string", r.Seq, got)
		}
		if r.Outcome != downstream.Executed && r.Outcome != downstream.Replayed {
			t.Errorf("request %d (key %s): outcome %s, status %d", r.Seq, r.Key, r.Outcome, r.Status)
		}
		if r.Outcome == downstream.Executed {
			executed[r.Key]++
		}
	}
	applied := fake.Applied()
	if len(applied) != n {
		t.Errorf("applied %d side effects, want %d (one per effect): %+v", len(applied), n, applied)
	}
	for _, a := range applied {
		if !keys[a.Key] || executed[a.Key] != 1 {
			t.Errorf("applied effect %s under key %q, executed %d times", a.ID, a.Key, executed[a.Key])
		}
	}
	return effects
}

// TestDispatchCrashAtFailpoints kills serve with SIGKILL at each failpoint
// of the delivery path, with three charges committed or in progress, then
// restarts a plain serve on the same database and destination and retries
// the charges: every committed effect must be delivered and applied once
// downstream, with one Idempotency-Key per effect across both processes.
//
// The crashed dispatcher's lease (at least 30s) is not waited out: its
// process is gone, which the restarted dispatcher sees, so it reclaims the
// effect at once.
func TestDispatchCrashAtFailpoints(t *testing.T) {
	t.Parallel()
	const n = 3
	for _, fp := range []string{fpDispatchAfterClaim, fpDispatchAfterSend, fpDispatchAfterResponse} {
		t.Run(fp, func(t *testing.T) {
			t.Parallel()
			fake := downstream.Start(t, nil)
			dest := paymentsDest(fake, "timeout=1s")
			dbPath := filepath.Join(t.TempDir(), "ledger.db")
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("%s-%d", fp, i)
			}

			cs, cmd := serveStdio(t, failpointBin, dbPath, []string{failpoint.EnvVar + "=" + fp + "=crash"}, "--dest", dest)
			answered := chargeUntilCrash(t, cs, keys)
			waitExit(t, cs, 30*time.Second)
			wantKilled(t, cmd)
			t.Logf("%d of %d charges answered before the crash", answered, n)

			db := openLedgerDB(t, dbPath)
			var crashed []dispatchEffect
			for _, e := range readEffects(t, db) {
				if e.state == "in_flight" {
					crashed = append(crashed, e)
				}
			}
			if len(crashed) == 0 {
				t.Fatalf("the crash left no effect in flight: %+v", readEffects(t, db))
			}
			sentBeforeCrash := len(fake.Requests())
			if fp == fpDispatchAfterClaim && sentBeforeCrash != 0 {
				t.Errorf("the fake got %d requests from a dispatcher that crashed before sending", sentBeforeCrash)
			}
			if fp == fpDispatchAfterResponse && sentBeforeCrash == 0 {
				t.Errorf("the fake got no request from a dispatcher that crashed after reading a response")
			}

			cs2, _ := serveStdio(t, bin, dbPath, nil, "--dest", dest)
			for i, k := range keys {
				mustSucceed(t, cs2, chargeCall(k, 100+i)) // replays the committed ones
			}
			waitEffects(t, db, n, 20*time.Second, "delivered")
			wantExactlyOnce(t, db, fake, n)

			// The effects the crash left in flight were reclaimed and
			// attempted again under the same key: once if nothing had left
			// the crashed process, else replayed by the destination.
			resent := false
			after := readEffects(t, db)
			for _, c := range crashed {
				for _, e := range after {
					if e.id == c.id && e.attempts < 2 {
						t.Errorf("effect %d: %d attempts, want the crashed one and at least one more", e.id, e.attempts)
					}
				}
				switch reqs := requestsFor(fake, c.key); {
				case fp == fpDispatchAfterClaim && len(reqs) != 1:
					t.Errorf("effect %d: %d requests, want 1 (nothing left the crashed process)", c.id, len(reqs))
				case len(reqs) >= 2:
					resent = true
					if reqs[0].Outcome != downstream.Executed || reqs[len(reqs)-1].Outcome != downstream.Replayed {
						t.Errorf("effect %d: requests %v then %v, want executed by the crashed process, replayed after the restart",
							c.id, reqs[0].Outcome, reqs[len(reqs)-1].Outcome)
					}
				}
			}
			switch fp {
			case fpDispatchAfterResponse:
				if !resent {
					t.Errorf("no effect in flight at the crash was sent by both processes")
				}
			case fpDispatchAfterSend:
				t.Run("the request left before the crash", func(t *testing.T) {
					t.Logf("requests before the crash: %d; an effect sent by both processes: %v", sentBeforeCrash, resent)
					if sentBeforeCrash == 0 || !resent {
						t.Errorf("%s=crash: the fake got %d requests before the crash, and no effect was sent by both processes",
							fp, sentBeforeCrash)
					}
				})
			}
		})
	}
}

// TestDispatchCrashAtMostOnce crashes the dispatcher delivering to a
// destination that does not dedup (at_most_once; the fake executes every
// request). An effect whose request may have left is never sent again after
// the restart: it becomes unknown, or the probe resolves it (delivered if the
// destination has it, sent again if not). One whose request had not left is
// delivered normally.
func TestDispatchCrashAtMostOnce(t *testing.T) {
	t.Parallel()
	const probe = "probe=GET /v1/idempotency/{key}"
	for _, tc := range []struct {
		fp    string
		probe bool
	}{
		{fpDispatchAfterClaim, false},
		{fpDispatchAfterSend, false},
		{fpDispatchAfterSend, true},
		{fpDispatchAfterResponse, false},
		{fpDispatchAfterResponse, true},
	} {
		name, settings := tc.fp+"/no_probe", []string{"timeout=1s", "at_most_once"}
		if tc.probe {
			// The probe delay is then max(2×timeout, 5s) = 5s.
			name, settings = tc.fp+"/probe", []string{"timeout=100ms", "at_most_once", probe}
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fake := downstream.Start(t, &downstream.Options{NoDedup: true})
			dest := paymentsDest(fake, settings...)
			dbPath := filepath.Join(t.TempDir(), "ledger.db")
			key := "amo-" + name

			cs, cmd := serveStdio(t, failpointBin, dbPath, []string{failpoint.EnvVar + "=" + tc.fp + "=crash"}, "--dest", dest)
			chargeUntilCrash(t, cs, []string{key})
			waitExit(t, cs, 30*time.Second)
			wantKilled(t, cmd)
			db := openLedgerDB(t, dbPath)
			effects := readEffects(t, db)
			if len(effects) != 1 || effects[0].state != "in_flight" {
				t.Fatalf("after the crash: effects %+v, want one in flight", effects)
			}
			crashed := effects[0]
			sentBeforeCrash := len(requestsFor(fake, crashed.key))
			switch {
			case tc.fp == fpDispatchAfterClaim && (crashed.sendStarted.Valid || sentBeforeCrash != 0):
				t.Fatalf("effect %+v, %d requests: want nothing sent before the crash", crashed, sentBeforeCrash)
			case tc.fp != fpDispatchAfterClaim && !crashed.sendStarted.Valid:
				t.Fatalf("effect %+v: send_started_at not set before the request was written", crashed)
			case tc.fp == fpDispatchAfterResponse && sentBeforeCrash != 1:
				t.Fatalf("%d requests before a crash after the response, want 1", sentBeforeCrash)
			}

			cs2, _ := serveStdio(t, bin, dbPath, nil, "--dest", dest)
			mustSucceed(t, cs2, chargeCall(key, 100)) // a replay
			var probes []downstream.Request
			switch {
			case tc.fp == fpDispatchAfterClaim:
				waitEffects(t, db, 1, 20*time.Second, "delivered")
				if reqs := requestsFor(fake, crashed.key); len(reqs) != 1 || len(fake.Applied()) != 1 {
					t.Errorf("the fake got %d requests with the key and applied %d, want 1 and 1", len(reqs), len(fake.Applied()))
				}

			case !tc.probe:
				got := waitEffects(t, db, 1, 20*time.Second, "unknown")[0]
				if !strings.Contains(got.lastError, "not re-sent") || got.leaseOwner != "" {
					t.Errorf("unknown effect: %+v", got)
				}
				// A second charge is delivered by later rounds of the same
				// dispatcher; the unknown effect must not have gone out again.
				mustSucceed(t, cs2, chargeCall(key+"-2", 200))
				effects := waitEffects(t, db, 2, 20*time.Second, "unknown", "delivered")
				if effects[0].state != "unknown" || effects[1].state != "delivered" {
					t.Fatalf("effects %+v: want the first unknown, the second delivered", effects)
				}
				if reqs := requestsFor(fake, crashed.key); len(reqs) != sentBeforeCrash {
					t.Errorf("the fake got %d requests with the unknown effect's key, %d of them before the crash: re-sent",
						len(reqs), sentBeforeCrash)
				}
				if reqs := requestsFor(fake, effects[1].key); len(reqs) != 1 {
					t.Errorf("the second effect went out %d times, want 1", len(reqs))
				}
				if got, want := len(fake.Applied()), sentBeforeCrash+1; got != want {
					t.Errorf("applied %d, want %d", got, want)
				}

			default:
				got := waitEffects(t, db, 1, 20*time.Second, "delivered")[0]
				reqs := requestsFor(fake, crashed.key)
				if len(reqs) != 1 || len(fake.Applied()) != 1 {
					t.Fatalf("the fake got %d POSTs with the key and applied %d, want 1 and 1", len(reqs), len(fake.Applied()))
				}
				for _, r := range fake.Requests() {
					if r.Outcome == downstream.Probed {
						probes = append(probes, r)
					}
				}
				if len(probes) == 0 || probes[0].Path != "/v1/idempotency/"+crashed.key {
					t.Fatalf("probes %+v, want GET /v1/idempotency/%s", probes, crashed.key)
				}
				// Delivered by the crashed process and found by the probe, or
				// never sent, reported missing by the probe, and sent again.
				if sentBeforeCrash == 1 && !strings.Contains(got.lastError, "resolved by probe") {
					t.Errorf("effect %+v: want it resolved by the probe", got)
				}
				if sentBeforeCrash == 0 && (probes[0].Status != http.StatusNotFound || !probes[0].Time.Before(reqs[0].Time)) {
					t.Errorf("probe %+v, request %+v: want a 404 probe, then the only send", probes[0], reqs[0])
				}
				t.Run("the probe waits the probe delay after the send", func(t *testing.T) {
					gap := probes[0].Time.Sub(time.UnixMilli(crashed.sendStarted.Int64))
					t.Logf("first probe %s after send_started_at", gap.Round(time.Millisecond))
					if gap < 5*time.Second {
						t.Errorf("first probe %s after the send, want at least the probe delay (5s)", gap)
					}
				})
			}

			if tc.fp == fpDispatchAfterSend {
				t.Run("the request left before the crash", func(t *testing.T) {
					t.Logf("requests before the crash: %d", sentBeforeCrash)
					if sentBeforeCrash != 1 {
						t.Errorf("%s=crash: the fake got %d requests before the crash, want 1", tc.fp, sentBeforeCrash)
					}
				})
			}
		})
	}
}

// TestDispatchSIGTERMDuringSend stops serve with SIGTERM while a delivery
// is in flight. serve stops claiming, lets the send finish for up to its
// 10s shutdown window, then cancels it and releases the effect; it exits 0
// either way, and never leaves the effect in flight. A restarted serve
// delivers what is left, and the destination applies the charge once.
func TestDispatchSIGTERMDuringSend(t *testing.T) {
	t.Parallel()
	const window = 10 * time.Second // serve's shutdown window for deliveries
	for _, tc := range []struct {
		name    string
		fault   downstream.Fault
		timeout string
		state   string // of the effect after the shutdown
	}{
		{"send finishes in the window", downstream.Slow(1500 * time.Millisecond), "5s", "delivered"},
		{"send outlasts the window", downstream.Hang(), "60s", "pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fake := downstream.Start(t, nil)
			fake.FailNext(1, tc.fault)
			dest := paymentsDest(fake, "timeout="+tc.timeout)
			dbPath := filepath.Join(t.TempDir(), "ledger.db")
			cs, cmd := serveStdio(t, bin, dbPath, nil, "--dest", dest)
			mustSucceed(t, cs, chargeCall("sigterm", 100))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := fake.WaitRequests(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			took := waitExit(t, cs, window+10*time.Second)
			wantExitedZero(t, cmd)
			t.Logf("exited %s after SIGTERM", took.Round(time.Millisecond))
			if took > window+5*time.Second {
				t.Errorf("exited %s after SIGTERM, want within the %s shutdown window", took, window)
			}
			if tc.state == "pending" && took < window-time.Second {
				t.Errorf("exited %s after SIGTERM, before the %s shutdown window for the send in flight", took, window)
			}

			db := openLedgerDB(t, dbPath)
			effects := readEffects(t, db)
			if len(effects) != 1 || effects[0].state != tc.state || effects[0].leaseOwner != "" {
				t.Fatalf("after the shutdown: %+v, want one effect %s with no lease", effects, tc.state)
			}
			if err := fake.WaitIdle(ctx); err != nil { // the held key is out of flight
				t.Fatal(err)
			}

			cs2, _ := serveStdio(t, bin, dbPath, nil, "--dest", dest)
			mustSucceed(t, cs2, chargeCall("sigterm", 100)) // a replay
			waitEffects(t, db, 1, 20*time.Second, "delivered")
			wantExactlyOnce(t, db, fake, 1)
			wantReqs := 1
			if tc.state == "pending" {
				wantReqs = 2 // cancelled at the end of the window, sent again after the restart
			}
			if got := len(fake.Requests()); got != wantReqs {
				t.Errorf("the fake got %d requests, want %d", got, wantReqs)
			}
		})
	}
}
