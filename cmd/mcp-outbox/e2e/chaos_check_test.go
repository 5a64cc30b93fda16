package e2e

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

// check asserts the soak's end state and reports its figures.
func (h *chaosHarness) check() {
	t := h.t

	// Every logical call got its real result, the same on every answer.
	var charged, failing, keyed int
	var lost []int
	byAmount := map[int64]chaosAnswer{}
	for i, c := range h.calls {
		as := h.answers[i]
		if len(as) == 0 {
			if !h.stats.wrongCalls[i] {
				lost = append(lost, i)
			}
			continue
		}
		if c.key != "" {
			keyed++
		}
		if c.fails() {
			failing++
		} else {
			charged++
			byAmount[c.amount] = as[0]
		}
		// The same result on every answer; at most one of them from the
		// attempt that ran the call, every other a replay.
		ran := 0
		for _, a := range as {
			if !a.replayed {
				ran++
			}
			if !a.sameResult(as[0]) || ran > 1 {
				t.Errorf("call %d (key %q, amount %d): answered %s, and %s; want the same result, all but one replayed", i, c.key, c.amount, as[0], a)
				break
			}
		}
	}
	if n := h.stats.unanswered.Load(); n > 0 {
		t.Errorf("%d times a logical call's client gave up on it after %s without its real result", n, chaosClientTiming.perCall)
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d logical calls never got their real result within %s: calls %v", len(lost), h.n, chaosClientTiming.perCall, lost[:min(len(lost), 20)])
	}

	db := openLedgerDB(t, h.store.db)
	h.checkCharges(db, byAmount, charged)
	h.checkCalls(db, charged, failing)
	before := chaosEffectStates(t, db)
	waiting := chaosWaiting(t, db)

	// A final drain, against the downstream as it comes back for good (its
	// journal, no faults), delivers what the killed servers left.
	fake, err := downstream.New(&downstream.Options{Journal: h.journal})
	if err != nil {
		t.Fatalf("start the downstream on its journal: %v", err)
	}
	defer fake.Close()
	// The drain waits for retries to come due, and a retry's backoff
	// doubles to 10 minutes: with more time than that, an effect left
	// pending is stuck, not just unlucky.
	drainTimeout := 11 * time.Minute
	if d, ok := t.Deadline(); ok {
		drainTimeout = min(drainTimeout, time.Until(d)-30*time.Second)
	}
	drainStart := time.Now()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "drain", "--db", h.store.db, "--dest", "payments="+fake.URL(), "--timeout", drainTimeout.String(), "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("mcp-outbox drain: %v\nstdout: %s\nstderr: %s\neffects not delivered: %s",
			err, stdout.String(), stderr.String(), chaosUndelivered(t, db))
	}
	drainTime := time.Since(drainStart)

	deliveries := h.checkEffects(db, fake, charged)
	for _, line := range h.log.grep("panic:", "DATA RACE", "fatal error:") {
		t.Errorf("process log: %s", line)
	}

	m, s := h.monkey, h.stats
	var stdioRestarts, httpConnects int
	for _, c := range h.stdio {
		stdioRestarts += c.restarts
	}
	for _, c := range h.http {
		httpConnects += c.connects
	}
	var pgKills string
	if m.pg != nil {
		pgKills = fmt.Sprintf(", PostgreSQL killed %d (down %s in all; /readyz back within %s of each restart)",
			m.pgKills, m.pgDown.Round(time.Millisecond), m.pgRecoverMax.Round(time.Millisecond))
	}
	t.Logf(`chaos soak figures on %s (CHAOS_SEED=%d):
  logical calls: %d (%d keyed, %d keyless; %d charged, %d refused by the tool); %d sent through two clients at once, %d asked again after their answer through a random client
  clients: %d stdio (each with its serve process), %d Streamable HTTP (1 stateful, %d stateless), %d workers
  attempts: %d; retries: %d (%.2f per call, %d of them through another client); client timeouts: %d (%d of them the %s one)
  transport errors: %d; the layer's transient answers: in_progress %d, not_recorded %d
  calls whose first answer was a replay (an earlier attempt committed, its answer was lost): %d
  kills (SIGKILL) and freezes (SIGSTOP): %d, one per %.1f logical calls: stdio servers killed %d (stdio servers restarted by their clients %d), HTTP server killed %d, downstream killed %d (started %d times)%s, serve processes frozen %d (%d of them longer than the %s lease); HTTP (re)connects %d
  effects: %d; after the soak %v, %s; delivery attempts %d for %d effects; all applied once downstream
  wall time: soak %s, drain %s
  transport errors by kind:%s`,
		h.store.name(), h.seed,
		h.n, keyed, h.n-keyed, charged, failing, s.hedged.Load(), s.reasks.Load(),
		chaosStdioClients, chaosHTTPClients, chaosHTTPClients-1, (chaosStdioClients+chaosHTTPClients)*chaosWorkersPerConn,
		s.attempts.Load(), s.retries.Load(), float64(s.retries.Load())/float64(h.n), s.switched.Load(), s.timeouts.Load(), s.longTimeouts.Load(), chaosClientTiming.longTimeout,
		s.connErrors.Load(), s.inProgress.Load(), s.notRecorded.Load(),
		s.firstReplayed.Load(),
		m.kills, float64(h.n)/float64(max(m.kills, 1)), m.stdioKills, stdioRestarts, m.httpKills, m.downstreamKills, h.downstreamStarts, pgKills,
		m.freezes, m.freezesPastLease, m.lease, httpConnects,
		charged, before, waiting, deliveries, charged,
		h.soakTime.Round(time.Millisecond), drainTime.Round(time.Millisecond),
		s.errKindsReport())
}

// checkCharges: exactly one charges row per charged call, the one its
// answers named, and none for anything else.
func (h *chaosHarness) checkCharges(db *sql.DB, byAmount map[int64]chaosAnswer, charged int) {
	t := h.t
	rows, err := db.Query(`SELECT id, amount FROM charges ORDER BY id`)
	if err != nil {
		t.Fatalf("read charges: %v", err)
	}
	defer rows.Close()
	seen := map[int64][]int64{}
	n := 0
	for rows.Next() {
		var id, amount int64
		if err := rows.Scan(&id, &amount); err != nil {
			t.Fatalf("read charges: %v", err)
		}
		n++
		seen[amount] = append(seen[amount], id)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read charges: %v", err)
	}
	for amount, ids := range seen {
		a, ok := byAmount[amount]
		switch {
		case !ok:
			t.Errorf("charges %v of amount %d belong to no answered logical call", ids, amount)
		case len(ids) != 1:
			t.Errorf("amount %d charged %d times (ids %v): the logical call was answered with %s", amount, len(ids), ids, a)
		case ids[0] != a.chargeID:
			t.Errorf("amount %d: charge row %d, but the call was answered with %s", amount, ids[0], a)
		}
	}
	for amount, a := range byAmount {
		if len(seen[amount]) == 0 {
			t.Errorf("amount %d has no charge row; the call was answered with %s", amount, a)
		}
	}
	if n != charged {
		t.Errorf("%d charges rows, want %d (one per charged logical call)", n, charged)
	}
}

// checkCalls: one calls row per logical call, in the state of its answer,
// with the call id its answers named; none in_flight or unknown.
func (h *chaosHarness) checkCalls(db *sql.DB, charged, failing int) {
	t := h.t
	states := map[string]int{}
	rows, err := db.Query(`SELECT key, key_source, uid, state FROM calls`)
	if err != nil {
		t.Fatalf("read calls: %v", err)
	}
	defer rows.Close()
	byKey := map[string]string{}   // explicit key -> uid
	keyless := map[string]string{} // uid -> state
	for rows.Next() {
		var key, source, uid, state string
		if err := rows.Scan(&key, &source, &uid, &state); err != nil {
			t.Fatalf("read calls: %v", err)
		}
		states[state]++
		if source == "fingerprint" {
			keyless[uid] = state
		} else {
			byKey[key] = uid
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read calls: %v", err)
	}
	if states["in_flight"] != 0 || states["unknown"] != 0 {
		t.Errorf("calls left in_flight: %d, unknown: %d; want none", states["in_flight"], states["unknown"])
	}
	if states["completed"] != charged || states["failed"] != failing {
		t.Errorf("calls by state %v, want %d completed and %d failed", states, charged, failing)
	}
	for i, c := range h.calls {
		if len(h.answers[i]) == 0 {
			continue
		}
		a := h.answers[i][0]
		if c.key != "" {
			if uid := byKey[c.key]; uid != a.callID {
				t.Errorf("call %d: key %q has calls row %q, but was answered as call %q", i, c.key, uid, a.callID)
			}
			continue
		}
		if _, ok := keyless[a.callID]; !ok {
			t.Errorf("call %d (keyless, amount %d): answered as call %q, which has no fingerprint row", i, c.amount, a.callID)
		}
		delete(keyless, a.callID)
	}
	if len(keyless) > 0 {
		t.Errorf("%d fingerprint calls rows belong to no logical call: %v", len(keyless), keyless)
	}
}

// chaosEffectStates counts effects by state.
func chaosEffectStates(t interface{ Fatalf(string, ...any) }, db *sql.DB) map[string]int {
	rows, err := db.Query(`SELECT state, count(*) FROM effects GROUP BY state`)
	if err != nil {
		t.Fatalf("count effects: %v", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			t.Fatalf("count effects: %v", err)
		}
		out[state] = n
	}
	return out
}

// chaosWaiting sums up the effects not yet delivered: how many attempts
// they failed and when the last of them is due again, which is what the
// drain waits for.
func chaosWaiting(t interface{ Fatalf(string, ...any) }, db *sql.DB) string {
	var n, maxAttempts, lastDue int64
	err := db.QueryRow(`SELECT count(*), coalesce(max(attempts), 0), coalesce(max(next_attempt_at), 0)
		FROM effects WHERE state != 'delivered'`).Scan(&n, &maxAttempts, &lastDue)
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	if n == 0 {
		return "nothing waiting"
	}
	due := time.Until(time.UnixMilli(lastDue)).Round(time.Second)
	return fmt.Sprintf("the most failed attempts of one %d, the last due again in %s", maxAttempts, max(due, 0))
}

// chaosUndelivered lists the effects not delivered, for a failure message.
func chaosUndelivered(t interface{ Fatalf(string, ...any) }, db *sql.DB) string {
	rows, err := db.Query(`SELECT id, idempotency_key, state, attempts, next_attempt_at, last_error FROM effects
		WHERE state != 'delivered' ORDER BY id LIMIT 20`)
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, attempts, next int64
		var key, state, lastErr string
		if err := rows.Scan(&id, &key, &state, &attempts, &next, &lastErr); err != nil {
			t.Fatalf("read effects: %v", err)
		}
		fmt.Fprintf(&b, "\n  effect %d (%s): %s, %d attempts, due in %s, last error %q",
			id, key, state, attempts, time.Until(time.UnixMilli(next)).Round(time.Millisecond), lastErr)
	}
	return b.String()
}

// checkEffects: after the drain, one effect per charge, made by the call
// that made the charge, delivered under a key of its own, and applied
// exactly once downstream (the journal, across every incarnation). It
// returns the delivery attempts made.
func (h *chaosHarness) checkEffects(db *sql.DB, fake *downstream.Server, charged int) int {
	t := h.t
	if got := chaosEffectStates(t, db); got["delivered"] != charged || len(got) != 1 {
		t.Errorf("effects by state after the drain: %v, want %d delivered", got, charged)
	}
	if got := countRows(t, db, `SELECT count(DISTINCT idempotency_key) FROM effects`); got != charged {
		t.Errorf("%d distinct effect keys, want %d", got, charged)
	}
	if got := chaosEffectsNamingTheirCharge(t, db); got != charged {
		t.Errorf("%d effects name the charge of the call that made them, want %d", got, charged)
	}

	bodies := map[string][]byte{}
	rows, err := db.Query(`SELECT idempotency_key, body FROM effects`)
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var body []byte
		if err := rows.Scan(&key, &body); err != nil {
			t.Fatalf("read effects: %v", err)
		}
		bodies[key] = body
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read effects: %v", err)
	}
	applied := map[string]int{}
	for _, e := range fake.Applied() {
		applied[e.Key]++
		body, ok := bodies[e.Key]
		switch {
		case e.Key == "":
			t.Errorf("downstream applied %s without an Idempotency-Key", e.ID)
		case !ok:
			t.Errorf("downstream applied %s under key %q, which no effect has", e.ID, e.Key)
		case !chaosJSONEqual(body, e.Body):
			t.Errorf("downstream applied %s under key %q with body %s, the effect's is %s", e.ID, e.Key, e.Body, body)
		}
	}
	for key := range bodies {
		if applied[key] != 1 {
			t.Errorf("effect %q applied %d times downstream, want 1", key, applied[key])
		}
	}
	for _, r := range fake.Requests() {
		if r.Outcome != downstream.Executed && r.Outcome != downstream.Replayed {
			t.Errorf("drain request %d (key %q): %s, status %d", r.Seq, r.Key, r.Outcome, r.Status)
		}
	}
	return countRows(t, db, `SELECT coalesce(sum(attempts), 0) FROM effects`)
}

// chaosEffectsNamingTheirCharge counts the charges named both by an
// effect's body and by the result of the call that enqueued it. The JSON
// is read here, not in SQL: SQLite and PostgreSQL spell it differently.
func chaosEffectsNamingTheirCharge(t *testing.T, db *sql.DB) int {
	t.Helper()
	charges := map[int64]bool{}
	rows, err := db.Query(`SELECT id FROM charges`)
	if err != nil {
		t.Fatalf("read charges: %v", err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatalf("read charges: %v", err)
		}
		charges[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read charges: %v", err)
	}
	rows, err = db.Query(`SELECT e.body, c.result FROM effects e JOIN calls c ON c.id = e.call_id`)
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	defer rows.Close()
	named := map[int64]bool{}
	for rows.Next() {
		var body, result []byte
		if err := rows.Scan(&body, &result); err != nil {
			t.Fatalf("read effects: %v", err)
		}
		var effect struct {
			ChargeID int64 `json:"charge_id"`
		}
		var call struct {
			StructuredContent struct {
				ChargeID int64 `json:"charge_id"`
			} `json:"structuredContent"`
		}
		if json.Unmarshal(body, &effect) != nil || json.Unmarshal(result, &call) != nil {
			continue // names nothing
		}
		if id := effect.ChargeID; charges[id] && call.StructuredContent.ChargeID == id {
			named[id] = true
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read effects: %v", err)
	}
	return len(named)
}

func chaosJSONEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}
