package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestPrefixOracle kills the server (SIGKILL) again and again in the middle
// of a sequence of calls, at every failpoint of the call path and at random
// instants, and after every kill checks the file the way SQLite's crash
// tests check theirs: PRAGMA integrity_check is ok, and the database is the
// state after some whole number k of calls. The charges, the recorded
// outcomes and the effects are each exactly the calls 1..k (compared as
// sets, by the amount each call charges), and they agree on every charge
// id: no half call ever shows. At most one claim is left in_flight, the
// dead attempt's. The client then does what clients do, retries the call it
// was making, and goes on; at the end every call happened exactly once.
//
// MCP_OUTBOX_PREFIX_SEED replays a run (the seed is logged).
func TestPrefixOracle(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("MCP_OUTBOX_PREFIX_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("MCP_OUTBOX_PREFIX_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (MCP_OUTBOX_PREFIX_SEED replays it)", seed)
	for _, store := range []string{"sqlite", "postgres"} {
		for _, keyed := range []bool{true, false} {
			name := "keyed"
			if !keyed {
				name = "keyless"
			}
			t.Run(store+"/"+name, func(t *testing.T) {
				t.Parallel()
				runPrefixOracle(t, store, keyed, rand.New(rand.NewPCG(seed, map[bool]uint64{true: 1, false: 2}[keyed])))
			})
		}
	}
}

// prefixCalls is the length of the sequence; prefixAmount(i) is what call
// i charges, which tells the calls apart in every table.
const prefixCalls = 40

func prefixAmount(i int) int { return 1000 + i }

// A prefixKill is how one server run ends.
type prefixKill struct {
	failpoint string        // SIGKILL at its N-th hit (failpoint build)
	nth       int           // which hit
	after     time.Duration // otherwise: SIGKILL from outside after this long
}

func (k prefixKill) String() string {
	if k.failpoint != "" {
		return fmt.Sprintf("%s=crash@%d", k.failpoint, k.nth)
	}
	return fmt.Sprintf("SIGKILL after %v", k.after)
}

// On PostgreSQL the store checks its own integrity (WAL recovery at every
// restart); the oracle checks the prefix. A dead attempt's claim is taken
// over when its lease passes, 1 s here.
func runPrefixOracle(t *testing.T, store string, keyed bool, rng *rand.Rand) {
	dbPath := filepath.Join(t.TempDir(), "prefix.db")
	var leaseEnv []string
	postgres := store == "postgres"
	if postgres {
		if testing.Short() {
			t.Skip("starts PostgreSQL")
		}
		dbPath = pgtest.Database(t)
		leaseEnv = []string{"MCP_OUTBOX_LEASE=1s"}
	}
	var kills []prefixKill
	for _, fp := range []string{failpoint.CallAfterClaim, failpoint.CallBeforeCommit, failpoint.CallAfterCommit} {
		kills = append(kills, prefixKill{failpoint: fp, nth: 1 + rng.IntN(4)})
	}
	for range 8 {
		kills = append(kills, prefixKill{after: time.Duration(rng.IntN(40_000)) * time.Microsecond})
	}
	rng.Shuffle(len(kills), func(i, j int) { kills[i], kills[j] = kills[j], kills[i] })

	call := func(i int) string { // the call's key, "" when keyless
		if keyed {
			return fmt.Sprintf("prefix-%d", i)
		}
		return ""
	}
	next := 1 // the first call not yet answered
	var db *sql.DB
	for _, kill := range kills {
		binary, env := bin, leaseEnv
		if kill.failpoint != "" {
			binary, env = failpointBin, append(leaseEnv, failpoint.EnvVar+"="+kill.String())
		}
		cs, cmd := serveStdioTo(t, testWriter{t}, binary, dbPath, env)
		stop := func() bool { return false }
		if kill.failpoint == "" {
			stop = time.AfterFunc(kill.after, func() { _ = cmd.Process.Kill() }).Stop
		}
		before := next
		for next <= prefixCalls {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := cs.CallTool(ctx, chargeCall(call(next), prefixAmount(next)))
			cancel()
			if err != nil {
				break // the server died under the call
			}
			if res.IsError {
				t.Fatalf("call %d: tool error: %s", next, resultText(res))
			}
			if m, _ := res.StructuredContent.(map[string]any); m["amount"] != float64(prefixAmount(next)) {
				t.Fatalf("call %d answered %v, want its own charge of %d", next, res.StructuredContent, prefixAmount(next))
			}
			next++
		}
		stop()
		_ = cmd.Process.Kill() // a run whose kill came too late ends here
		cs.Close()
		if db == nil {
			db = openLedgerDB(t, dbPath)
		}
		if postgres {
			awaitServerSessionsGone(t, db)
		}
		k := checkPrefix(t, db, postgres)
		t.Logf("%v: %d calls answered in this run, the file holds the first %d", kill, next-before, k)
		// The call in progress when the server died committed or did not;
		// any other k is a lost or an invented call.
		if k != next-1 && k != next {
			t.Fatalf("after %v the file holds the first %d calls; %d were answered", kill, k, next-1)
		}
		if t.Failed() {
			return
		}
	}
	// A last server without kills finishes the sequence.
	cs, _ := serveStdio(t, bin, dbPath, leaseEnv)
	for ; next <= prefixCalls; next++ {
		res := mustSucceed(t, cs, chargeCall(call(next), prefixAmount(next)))
		if m, _ := res.StructuredContent.(map[string]any); m["amount"] != float64(prefixAmount(next)) {
			t.Fatalf("call %d answered %v", next, res.StructuredContent)
		}
	}
	cs.Close()
	if k := checkPrefix(t, db, postgres); k != prefixCalls {
		t.Errorf("the file holds %d calls at the end, want all %d", k, prefixCalls)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'in_flight'`); n != 0 {
		t.Errorf("%d calls left in_flight at the end", n)
	}
}

// checkPrefix checks that the file is whole and holds exactly the calls
// 1..k, for some k, which it returns.
func checkPrefix(t *testing.T, db *sql.DB, postgres bool) int {
	t.Helper()
	if !postgres {
		var integrity string
		if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity); err != nil || integrity != "ok" {
			t.Fatalf("PRAGMA integrity_check: %q %v", integrity, err)
		}
	}
	// The three tables are read in one snapshot, so a commit cannot land
	// between the reads (SQLite's read transaction gives one too).
	snap, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if !postgres {
		snap, err = db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
	}
	if err != nil {
		t.Fatalf("begin the check's snapshot: %v", err)
	}
	defer snap.Rollback()
	// amounts reads one table's view of the calls: the amount charged and
	// the charge id, per call.
	amounts := func(what, query string) map[int]int64 {
		t.Helper()
		rows, err := snap.Query(query)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer rows.Close()
		m := map[int]int64{}
		for rows.Next() {
			var amount int
			var id int64
			if err := rows.Scan(&amount, &id); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if _, dup := m[amount]; dup {
				t.Errorf("%s: the charge of %d shows twice", what, amount)
			}
			m[amount] = id
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return m
	}
	charges := amounts("charges", `SELECT amount, id FROM charges`)
	outcomesSQL := `SELECT json_extract(result, '$.structuredContent.amount'), json_extract(result, '$.structuredContent.charge_id')
		FROM calls WHERE state = 'completed'`
	effectsSQL := `SELECT json_extract(CAST(body AS TEXT), '$.amount'), json_extract(CAST(body AS TEXT), '$.charge_id') FROM effects`
	if postgres {
		outcomesSQL = `SELECT (result::json #>> '{structuredContent,amount}')::bigint, (result::json #>> '{structuredContent,charge_id}')::bigint
		FROM calls WHERE state = 'completed'`
		effectsSQL = `SELECT (convert_from(body, 'UTF8')::json ->> 'amount')::bigint, (convert_from(body, 'UTF8')::json ->> 'charge_id')::bigint FROM effects`
	}
	outcomes := amounts("recorded outcomes", outcomesSQL)
	effects := amounts("effects", effectsSQL)

	k := len(charges)
	for i := 1; i <= k; i++ {
		id, ok := charges[prefixAmount(i)]
		if !ok {
			t.Errorf("charges hold %d rows but not call %d's: not a prefix (%v)", k, i, sortedKeys(charges))
			continue
		}
		if outcomes[prefixAmount(i)] != id || effects[prefixAmount(i)] != id {
			t.Errorf("call %d: charge #%d, recorded outcome #%d, effect #%d: a half call", i, id, outcomes[prefixAmount(i)], effects[prefixAmount(i)])
		}
	}
	if len(outcomes) != k || len(effects) != k {
		t.Errorf("%d charges, %d recorded outcomes, %d effects: a half call (charges %v, outcomes %v, effects %v)",
			k, len(outcomes), len(effects), sortedKeys(charges), sortedKeys(outcomes), sortedKeys(effects))
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state NOT IN ('completed', 'in_flight')`); n != 0 {
		t.Errorf("%d calls in a state other than completed or in_flight", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'in_flight'`); n > 1 {
		t.Errorf("%d calls in_flight; only the dead attempt's may be", n)
	}
	return k
}

func sortedKeys(m map[int]int64) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
