package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
)

// Crash tests of group commit (outbox/group.go): a burst of concurrent
// charges shares one commit of the writer connection, and the server is
// SIGKILLed by a batch failpoint, which fires only for a batch holding two
// or more calls. After a restart, retrying every key must leave each charge
// exactly once: the calls of a batch that never committed run again, those
// of a batch that committed replay.

// burstSize is the number of concurrent charges of a burst.
const burstSize = 8

// burstTries bounds the bursts a test fires (each on a fresh database)
// until one is killed by the batch failpoint.
const burstTries = 3

// holdTurn is how long each call sleeps at call.before_commit, holding the
// writer's turn, so that the other calls of the burst queue up and join the
// open batch. The server runs with --batch-wait batchWait, far longer than
// the burst, because a batch takes no more calls once it is that old (the
// clock starts when the batch opens, before the first call's sleep).
const (
	holdTurn  = "20ms"
	batchWait = "1m"
)

// burstOutcome is what the client got for one call of a burst.
type burstOutcome struct {
	key    string
	amount int
	res    *mcp.CallToolResult
	err    error
}

// answered reports whether the call got a successful tool result.
func (o burstOutcome) answered() bool { return o.err == nil && o.res != nil && !o.res.IsError }

// burstKeys names the keys of one burst; amounts are distinct within a
// burst, so a charge row tells which key it belongs to.
func burstKeys(name string, try int) (keys []string, amounts []int) {
	for i := range burstSize {
		keys = append(keys, fmt.Sprintf("%s-try%d-%d", name, try, i))
		amounts = append(amounts, 1000+i)
	}
	return keys, amounts
}

// fireBurst sends one charge per key at once and waits for every answer:
// a result, or the error of a connection the server's death closed.
func fireBurst(t *testing.T, cs *mcp.ClientSession, keys []string, amounts []int) []burstOutcome {
	t.Helper()
	out := make([]burstOutcome, len(keys))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keys {
		out[i] = burstOutcome{key: keys[i], amount: amounts[i]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := chargeCall(keys[i], amounts[i])
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out[i].res, out[i].err = cs.CallTool(ctx, p)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// diskCall is what the database holds for one key of a burst.
type diskCall struct {
	state    string // "" when the key has no row
	uid      string
	chargeID int64 // 0 when no charge of the key's amount exists
}

// readBurst reads, for each key of a burst, its row of table calls and its
// charge (found by its amount, distinct within the burst), failing when an
// amount has more than one charge.
func readBurst(t *testing.T, db *sql.DB, outs []burstOutcome) map[string]diskCall {
	t.Helper()
	got := map[string]diskCall{}
	for _, o := range outs {
		var d diskCall
		err := db.QueryRow(`SELECT state, uid FROM calls WHERE key = ?`, o.key).Scan(&d.state, &d.uid)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("read call of key %s: %v", o.key, err)
		}
		if n := countRows(t, db, `SELECT count(*) FROM charges WHERE amount = ?`, o.amount); n > 1 {
			t.Fatalf("key %s has %d charges (amount %d), want at most 1", o.key, n, o.amount)
		}
		err = db.QueryRow(`SELECT id FROM charges WHERE amount = ?`, o.amount).Scan(&d.chargeID)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("read charge of key %s: %v", o.key, err)
		}
		got[o.key] = d
	}
	return got
}

// crashedBurst is a burst whose server the batch failpoint killed.
type crashedBurst struct {
	dbPath string
	outs   []burstOutcome
	db     *sql.DB
	disk   map[string]diskCall // after the crash
}

// crashBurst fires bursts of concurrent charges at a failpoints server with
// fp=crash until one kills it, each try on a fresh database with fresh keys.
// A burst that every call survives formed no batch of two calls; after
// burstTries of those the test fails. It checks that the process died by
// SIGKILL at fp and that what it left on disk is whole: every call answered
// with success is completed with the charge it answered, a key has a charge
// exactly when its call is completed, and every effect belongs to a
// completed call.
func crashBurst(t *testing.T, name, fp string) crashedBurst {
	t.Helper()
	env := []string{fmt.Sprintf("%s=%s=sleep(%s);%s=crash", failpoint.EnvVar, failpoint.CallBeforeCommit, holdTurn, fp)}
	for try := 1; try <= burstTries; try++ {
		dbPath := filepath.Join(t.TempDir(), "ledger.db")
		var log syncBuffer // the server's stderr, to tell which failpoint killed it
		cs, cmd := serveStdioTo(t, io.MultiWriter(testWriter{t}, &log), failpointBin, dbPath, env, "--batch-wait", batchWait)
		keys, amounts := burstKeys(name, try)
		outs := fireBurst(t, cs, keys, amounts)

		died := false
		for _, o := range outs {
			switch {
			case o.err != nil:
				died = true
				// The SDK reports the server's end of the pipe as EOF.
				if !errors.Is(o.err, io.EOF) && !errors.Is(o.err, mcp.ErrConnectionClosed) {
					t.Errorf("key %s: error %v, want the connection closed", o.key, o.err)
				}
			case o.res.IsError:
				t.Fatalf("key %s: tool error %s", o.key, resultText(o.res))
			default:
				wantReplay(t, o.res, false, "meta")
			}
		}
		cs.Close()
		if !died {
			// Every call answered: each batch held one call, so the
			// failpoint never fired, and the server ended on stdin's EOF.
			t.Logf("try %d: all %d calls answered, no batch of two formed; retrying with fresh keys", try, burstSize)
			continue
		}
		wantKilled(t, cmd)
		if want := "failpoint " + fp + ": SIGKILL"; !strings.Contains(log.String(), want) {
			t.Fatalf("server stderr does not say %q: the process died elsewhere", want)
		}

		db := openLedgerDB(t, dbPath)
		disk := readBurst(t, db, outs)
		for _, o := range outs {
			d := disk[o.key]
			if !o.answered() {
				continue
			}
			if d.state != "completed" {
				t.Errorf("key %s was answered with success before the crash, but its call is %q on disk", o.key, d.state)
			}
			if got := structuredChargeID(t, o.res); got != d.chargeID {
				t.Errorf("key %s was answered charge_id %d, the ledger holds %d", o.key, got, d.chargeID)
			}
			if m := callMetaOf(o.res); m["callId"] != d.uid {
				t.Errorf("key %s was answered callId %v, the call on disk is %s", o.key, m["callId"], d.uid)
			}
		}
		// Nothing half-committed: a charge exists exactly for the completed
		// calls, with its effect.
		for _, o := range outs {
			d := disk[o.key]
			if (d.state == "completed") != (d.chargeID != 0) {
				t.Errorf("key %s: call %q with charge %d on disk: a charge must exist exactly when its call completed",
					o.key, d.state, d.chargeID)
			}
		}
		completed := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'completed'`)
		if n := countRows(t, db, `SELECT count(*) FROM charges`); n != completed {
			t.Errorf("%d charges on disk for %d completed calls", n, completed)
		}
		if n := countRows(t, db, `SELECT count(*) FROM effects e JOIN calls c ON e.call_id = c.id WHERE c.state = 'completed'`); n != completed {
			t.Errorf("%d effects of completed calls, want %d", n, completed)
		}
		if n := countRows(t, db, `SELECT count(*) FROM effects`); n != completed {
			t.Errorf("%d effects on disk for %d completed calls", n, completed)
		}
		if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state NOT IN ('completed', 'in_flight')`); n != 0 {
			t.Errorf("%d calls neither completed nor in_flight after the crash", n)
		}
		return crashedBurst{dbPath: dbPath, outs: outs, db: db, disk: disk}
	}
	t.Fatalf("%d bursts of %d concurrent calls, none formed a batch of two calls (failpoint %s never fired)", burstTries, burstSize, fp)
	return crashedBurst{}
}

// retryAll restarts the server without failpoints on the crashed database
// and retries every key of the burst at once. A key completed on disk
// before the restart must replay its charge; any other key must run. It
// returns the keys that ran, and checks that each key ends with exactly one
// charge and a completed call.
func retryAll(t *testing.T, c crashedBurst) (ran []string) {
	t.Helper()
	cs, _ := serveStdio(t, bin, c.dbPath, nil)
	keys := make([]string, len(c.outs))
	amounts := make([]int, len(c.outs))
	for i, o := range c.outs {
		keys[i], amounts[i] = o.key, o.amount
	}
	retries := fireBurst(t, cs, keys, amounts)
	after := readBurst(t, c.db, c.outs)
	for i, r := range retries {
		if r.err != nil {
			t.Fatalf("retry of key %s: %v", r.key, r.err)
		}
		if r.res.IsError {
			t.Fatalf("retry of key %s: tool error %s", r.key, resultText(r.res))
		}
		before, now := c.disk[r.key], after[r.key]
		committed := before.state == "completed"
		m := wantReplay(t, r.res, committed, "meta")
		if m["replayed"] == false {
			ran = append(ran, r.key)
		}
		if now.state != "completed" || now.chargeID == 0 {
			t.Errorf("key %s after its retry: call %q, charge %d; want completed with a charge", r.key, now.state, now.chargeID)
		}
		if got := structuredChargeID(t, r.res); got != now.chargeID {
			t.Errorf("retry of key %s answered charge_id %d, the ledger holds %d", r.key, got, now.chargeID)
		}
		if m["callId"] != now.uid {
			t.Errorf("retry of key %s answered callId %v, the call on disk is %s", r.key, m["callId"], now.uid)
		}
		if committed {
			if now.chargeID != before.chargeID || now.uid != before.uid {
				t.Errorf("key %s committed before the crash with charge %d (call %s), now charge %d (call %s)",
					r.key, before.chargeID, before.uid, now.chargeID, now.uid)
			}
			if o := c.outs[i]; o.answered() && structuredChargeID(t, o.res) != now.chargeID {
				t.Errorf("key %s: answered charge %d before the crash, replayed %d", r.key, structuredChargeID(t, o.res), now.chargeID)
			}
		}
	}
	if n := countRows(t, c.db, `SELECT count(*) FROM charges`); n != burstSize {
		t.Errorf("charges has %d rows after the retries, want %d", n, burstSize)
	}
	if n := countRows(t, c.db, `SELECT count(*) FROM effects`); n != burstSize {
		t.Errorf("effects has %d rows after the retries, want %d", n, burstSize)
	}
	if n := countRows(t, c.db, `SELECT count(*) FROM calls WHERE state = 'completed'`); n != burstSize {
		t.Errorf("%d completed calls after the retries, want %d", n, burstSize)
	}
	return ran
}

// TestCrashMidBatch kills the server when a batch of two or more calls is
// in its transaction but not committed: none of the batch's calls may be on
// disk, and on retry each of them runs, once.
func TestCrashMidBatch(t *testing.T) {
	t.Parallel()
	c := crashBurst(t, "mid-batch", failpoint.BatchBeforeCommit)
	var answered, committed []string
	for _, o := range c.outs {
		if o.answered() {
			answered = append(answered, o.key)
		}
		if c.disk[o.key].state == "completed" {
			committed = append(committed, o.key)
		}
	}
	t.Logf("before the crash: %d of %d calls answered %v, %d committed %v, %d claims left in_flight", len(answered), burstSize,
		answered, len(committed), committed, countRows(t, c.db, `SELECT count(*) FROM calls WHERE state = 'in_flight'`))

	ran := retryAll(t, c)
	t.Logf("on retry: %d calls ran %v", len(ran), ran)
	// The batch held two or more calls and none of them committed: they all
	// ran on retry.
	if len(ran) < 2 {
		t.Errorf("only %d calls ran on retry (%v), want the 2 or more of the crashed batch", len(ran), ran)
	}
}

// TestCrashAfterBatchCommit kills the server after a batch of two or more
// calls committed but before any of them answered: those calls are on disk,
// and a retry replays them rather than charging again.
func TestCrashAfterBatchCommit(t *testing.T) {
	t.Parallel()
	c := crashBurst(t, "after-batch", failpoint.BatchAfterCommit)
	var unanswered []string
	for _, o := range c.outs {
		if !o.answered() && c.disk[o.key].state == "completed" {
			unanswered = append(unanswered, o.key)
		}
	}
	t.Logf("before the crash: %d calls committed without an answer %v", len(unanswered), unanswered)
	if len(unanswered) < 2 {
		t.Fatalf("%d calls committed without an answer (%v), want the 2 or more of the committed batch", len(unanswered), unanswered)
	}

	ran := retryAll(t, c)
	t.Logf("on retry: %d calls ran %v", len(ran), ran)
	for _, k := range ran {
		for _, u := range unanswered {
			if k == u {
				t.Errorf("key %s committed before the crash but ran again on retry", k)
			}
		}
	}
}
