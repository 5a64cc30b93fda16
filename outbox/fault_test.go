package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Store fault injection: every statement, BEGIN and COMMIT of the layer
// passes faultdb, which fails the chosen ones with SQLite's own errors at a
// set rate from a fixed seed. Clients retry until they get a real answer;
// the test then checks that no logical call ran twice or was lost, and that
// every error a client saw said plainly that nothing ran and that a retry
// runs or replays the call.

// faultOps are the layer's database operations a fault can target, each
// picked by the text of its statements (see claim.go, tx_begin.go,
// tx_effect.go, call.go), and what clients see of the faults, which the
// design makes deterministic:
//
//   - perFault: each fault fails one attempt, whose client gets one error;
//     the duplicate waiting on that attempt then claims and runs the call.
//   - perBatch: a failed commit, or a statement that ends the shared
//     transaction, fails every call whose claim or outcome was in it: at
//     least one error per fault.
//   - retried: SQLITE_BUSY on a claim is another process holding the
//     writer; the claim tries again within the in-flight wait, and clients
//     see nothing.
//
// Rates are 0.3, or higher where the operation is rare (a claim commits on
// its own only when no other call waits for the writer: see serial).
var faultOps = []struct {
	name  string
	rule  faultdb.Rule
	scale int // times the usual number of calls, where 0 means 1
	// errors is what clients see; busyClaim says SQLITE_BUSY is retried
	// inside the claim instead.
	errors    errorsPerFault
	busyClaim bool
	// takeovers: a fault can also fail the release of an attempt's claim
	// (its statement, its BEGIN, or the commit of the batch it rode in),
	// so that the next attempt takes the row over (calls.attempts > 1).
	takeovers bool
	// sqliteOnly: the operation does not exist on PostgreSQL.
	sqliteOnly bool
	// serial: one call at a time (faultBundle.serial).
	serial bool
}{
	// On PostgreSQL a call's claim is one statement that inserts and
	// reads (claim_postgres.go), and its commit is that statement's.
	{name: "claim_read", rule: faultdb.Rule{Stmt: faultdb.Contains("FROM calls WHERE principal = $1 AND key = $2",
		"FROM calls WHERE principal = $2::text AND key = $3::text")}, busyClaim: true},
	{name: "claim_insert", rule: faultdb.Rule{Stmt: faultdb.Contains("INSERT INTO calls (")}, busyClaim: true},
	// Serial: a claim's batch stays open while other calls wait for the
	// writer (group.go, leave), so with calls at once on a fast machine a
	// claim rarely commits without an outcome, and the rule picked nothing
	// in some runs; one call at a time, each claim commits on its own.
	{name: "claim_commit", rule: faultdb.Rule{Op: faultdb.Commit, Tx: claimsOnly, Rate: 0.6}, scale: 3, errors: perBatch, sqliteOnly: true, serial: true},
	// A BEGIN opens a batch for a claim (busy: retried), a handler, or the
	// release of a failed attempt's claim (no error of its own; the claim
	// stays for the next attempt to take over).
	{name: "begin", rule: faultdb.Rule{Op: faultdb.Begin}, errors: atMostPerFault, takeovers: true},
	{name: "fence", rule: faultdb.Rule{Stmt: faultdb.Contains("SELECT owner, state, lease_until FROM calls WHERE id = $1")}},
	{name: "handler", rule: faultdb.Rule{Stmt: faultdb.Contains("INSERT INTO charges")}},
	{name: "handler_txlost", rule: faultdb.Rule{Stmt: faultdb.Contains("INSERT INTO charges"), Rollback: true}, errors: perBatch, takeovers: true},
	{name: "enqueue", rule: faultdb.Rule{Stmt: faultdb.Contains("INSERT INTO effects")}},
	{name: "outcome", rule: faultdb.Rule{Stmt: faultdb.Contains("UPDATE calls SET state = $1, result = $2")}},
	{name: "outcome_commit", rule: faultdb.Rule{Op: faultdb.Commit, Tx: faultdb.Ran("UPDATE calls SET state = $1, result = $2")}, scale: 2, errors: perBatch, takeovers: true},
}

type errorsPerFault int

const (
	perFault       errorsPerFault = iota // exactly one client error per fault
	perBatch                             // at least one per fault
	atMostPerFault                       // at most one per fault
)

// claimsOnly picks the commits of batches that hold claims and no outcome:
// a claim does not wait for its commit, so its failure shows only later.
// On SQLite a claim tries the insert first (claimFresh), which inserts
// nothing for a key that has a row; the read that then follows marks such
// a batch, which may hold no claim at all (a replay's), and is not picked.
func claimsOnly(stmts []string) bool {
	return faultdb.Ran("INSERT INTO calls (")(stmts) && !faultdb.Ran("UPDATE calls SET state = $1, result = $2")(stmts) &&
		!faultdb.Ran("FROM calls WHERE principal = $1 AND key = $2")(stmts)
}

// faultCalls is how many logical calls each case makes, half with a key
// and half without; MCP_OUTBOX_FAULT_CALLS raises it for a longer soak.
func faultCalls(t *testing.T) int {
	if v := os.Getenv("MCP_OUTBOX_FAULT_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("MCP_OUTBOX_FAULT_CALLS=%q: want a number of calls, at least 2", v)
		}
		return n
	}
	return 10
}

// faultBundle is a layer whose database runs through a fault injector, with
// several client sessions.
type faultBundle struct {
	*bundle
	inj      *faultdb.Injector
	sessions []*mcp.ClientSession
	// serial: run makes one call at a time, so that the writer's queue is
	// empty when a claim's unit leaves and the claim commits on its own.
	serial bool
}

// faultSetup is a faultBundle on SQLite, whichever store the tests run on.
func faultSetup(t *testing.T, seed uint64, clients int, opts *outbox.Options) *faultBundle {
	t.Helper()
	return faultSetupOn(t, faultdb.New(seed), filepath.Join(t.TempDir(), "fault.db"), clients, opts)
}

// storeFaultSetup is a faultBundle on the store the tests run on: a
// PostgreSQL database through a pgx driver with faults when
// MCP_OUTBOX_TEST_STORE=postgres.
func storeFaultSetup(t *testing.T, seed uint64, clients int, opts *outbox.Options) *faultBundle {
	t.Helper()
	if onPostgres() {
		return faultSetupOn(t, faultdb.NewPostgres(seed), testTarget(t), clients, opts)
	}
	return faultSetup(t, seed, clients, opts)
}

func faultSetupOn(t *testing.T, in *faultdb.Injector, target string, clients int, opts *outbox.Options) *faultBundle {
	t.Helper()
	db, err := schema.Open(context.Background(), target,
		&schema.Options{Driver: in.DriverName(), Durability: schema.DurabilityNormal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := setupOn(t, mustLedger(t, db), opts, nil)
	fb := &faultBundle{bundle: b, inj: in, sessions: []*mcp.ClientSession{b.session}}
	for len(fb.sessions) < clients {
		fb.sessions = append(fb.sessions, connect(t, b.server))
	}
	return fb
}

// logicalCall is one call a client makes, retried until it is answered.
type logicalCall struct {
	key    string // "" for a call known by its fingerprint
	amount int
}

// faultAnswers is what the clients saw.
type faultAnswers struct {
	mu      sync.Mutex
	charge  map[logicalCall][]int64 // the charge id of every successful answer
	errors  []string                // every error answer: code and text
	retries int
}

// clientErrorPhrases: an error a client sees must say that nothing ran and
// what a retry does.
func actionable(code, msg string) error {
	switch code {
	case "not_recorded", "in_progress":
	default:
		return fmt.Errorf("code %q, want not_recorded or in_progress", code)
	}
	low := strings.ToLower(msg)
	if !strings.Contains(low, "nothing") || !strings.Contains(low, "retry") && !strings.Contains(msg, outbox.StatusToolName) {
		return fmt.Errorf("does not say that nothing ran and what a retry does")
	}
	// Raw Go: formatting slips, nil values, package prefixes, pointers;
	// and the layer's own mechanics, which say nothing to a client.
	for _, soup := range []string{"%!", "<nil>", "sql: ", "driver: ", "0x", "goroutine", "panic", "context canceled", "savepoint"} {
		if strings.Contains(msg, soup) {
			return fmt.Errorf("holds %q", soup)
		}
	}
	if len(msg) > 500 {
		return fmt.Errorf("%d bytes long", len(msg))
	}
	return nil
}

// run makes every call twice at once from two clients (a retry racing the
// original), each retrying on an error until it gets the real answer; up
// to eight at once, or one if serial.
func (fb *faultBundle) run(t *testing.T, calls []logicalCall) *faultAnswers {
	t.Helper()
	ans := &faultAnswers{charge: map[logicalCall][]int64{}}
	sem := make(chan struct{}, 8)
	if fb.serial {
		sem = make(chan struct{}, 1)
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		for j := range 2 {
			cs := fb.sessions[(i+j)%len(fb.sessions)]
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				fb.callUntilAnswered(t, cs, c, ans)
			}()
		}
	}
	wg.Wait()
	return ans
}

func (fb *faultBundle) callUntilAnswered(t *testing.T, cs *mcp.ClientSession, c logicalCall, ans *faultAnswers) {
	const tries = 100
	for range tries {
		res, err := callErr(context.Background(), cs, "charge", c.key, map[string]any{"amount": c.amount})
		if err != nil {
			t.Errorf("call %+v: protocol error %v", c, err)
			return
		}
		if !res.IsError {
			id := chargeID(t, res)
			ans.mu.Lock()
			ans.charge[c] = append(ans.charge[c], id)
			ans.mu.Unlock()
			return
		}
		msg := strings.TrimSpace(text(res))
		ans.mu.Lock()
		ans.errors = append(ans.errors, errorCode(res)+": "+msg)
		ans.retries++
		ans.mu.Unlock()
		if err := actionable(errorCode(res), msg); err != nil {
			t.Errorf("call %+v: error not clear to a client (%v): %s", c, err, msg)
		}
	}
	t.Errorf("call %+v: no answer after %d tries: the call is lost", c, tries)
}

func workload(n int) []logicalCall {
	var calls []logicalCall
	for i := range n {
		c := logicalCall{amount: 1000 + i}
		if i%2 == 0 {
			c.key = fmt.Sprintf("fault-%d", i)
		}
		calls = append(calls, c)
	}
	return calls
}

// checkOnce checks the database against the faultAnswers: one charge per
// logical call, the one every client was told about.
func (fb *faultBundle) checkOnce(t *testing.T, calls []logicalCall, ans *faultAnswers) {
	t.Helper()
	seen := map[int64]logicalCall{}
	for _, c := range calls {
		ids := ans.charge[c]
		if len(ids) != 2 {
			t.Errorf("call %+v: %d successful faultAnswers, want one per client", c, len(ids))
			continue
		}
		if ids[0] != ids[1] {
			t.Errorf("call %+v: the clients were told of charges %v: it ran twice", c, ids)
		}
		if other, dup := seen[ids[0]]; dup {
			t.Errorf("calls %+v and %+v were both answered with charge %d", c, other, ids[0])
		}
		seen[ids[0]] = c
		var amount int
		if err := fb.db.Read.QueryRow(`SELECT amount FROM charges WHERE id = $1`, ids[0]).Scan(&amount); err != nil || amount != c.amount {
			t.Errorf("call %+v answered with charge %d, which holds amount %d (%v)", c, ids[0], amount, err)
		}
	}
	if got := charges(t, fb.bundle); got != len(calls) {
		t.Errorf("%d charges for %d logical calls", got, len(calls))
	}
	if got := count(t, fb.db.Read, `SELECT count(*) FROM calls WHERE state = 'completed'`); got != len(calls) {
		t.Errorf("%d completed calls for %d logical calls", got, len(calls))
	}
	if got := count(t, fb.db.Read, `SELECT count(*) FROM calls WHERE state != 'completed'`); got != 0 {
		t.Errorf("%d calls left in another state", got)
	}
	// Each call's one effect, and none of a call that did not commit.
	if got := count(t, fb.db.Read, `SELECT count(DISTINCT call_id) FROM effects`); got != len(calls) {
		t.Errorf("effects of %d calls, want %d", got, len(calls))
	}
	if got := count(t, fb.db.Read, `SELECT count(*) FROM effects`); got != len(calls) {
		t.Errorf("%d effects, want %d", got, len(calls))
	}
}

// faultSeed is the fixed seed of a case. The base was chosen so that every
// case's rule fails one of its first four picks, which every case reaches:
// a case fails if its rule injected nothing, so a change to the cases or
// to faultdb's random source shows up as such a failure, and then needs
// another base.
func faultSeed(op int, kind faultdb.Kind) uint64 {
	return 23806*64 + uint64(4*op) + uint64(kind)
}

// pgFaultSeed is faultSeed for PostgreSQL's kinds, whose base was chosen
// the same way.
func pgFaultSeed(op int, kind faultdb.Kind) uint64 {
	return 731477*64 + uint64(8*op) + uint64(kind)
}

// busyKind: a claim that fails with kind is tried again (claim.go isBusy).
func busyKind(kind faultdb.Kind) bool {
	return kind == faultdb.Busy || kind == faultdb.PgSerialization || kind == faultdb.PgLockNotAvailable
}

// On PostgreSQL (MCP_OUTBOX_TEST_STORE=postgres) the same cases run with
// PostgreSQL's errors (faultdb.PgKinds), which differ from SQLite's in
// what they do to the transaction, and so in what clients see:
//
//   - every unit has a transaction of its own (group_postgres.go enterOwn), so a
//     fault fails one call, never a batch of others;
//   - a failed statement aborts the transaction, which the layer's
//     savepoint undoes (faultdb's Rollback adds nothing, so handler_txlost
//     is handler again and is not run twice);
//   - 40001 and 55P03 on a claim's statements are busy (claim.go isBusy):
//     the claim is retried within the in-flight wait, and clients see
//     nothing, as for SQLITE_BUSY.
func TestFault_Matrix(t *testing.T) {
	t.Parallel()
	n := faultCalls(t)
	kinds, seed := faultdb.Kinds, faultSeed
	if onPostgres() {
		kinds, seed = faultdb.PgKinds, pgFaultSeed
	}
	for i, op := range faultOps {
		if onPostgres() && (op.rule.Rollback || op.sqliteOnly) {
			continue
		}
		for _, kind := range kinds {
			t.Run(op.name+"/"+kind.String(), func(t *testing.T) {
				t.Parallel()
				fb := storeFaultSetup(t, seed(i, kind), 4, &outbox.Options{InFlightWait: 10 * time.Second})
				fb.serial = op.serial
				r := op.rule
				r.Name, r.Kind = op.name, kind
				if r.Rate == 0 {
					r.Rate = 0.3
				}
				fb.inj.Set(r)
				calls := workload(n * max(op.scale, 1))
				ans := fb.run(t, calls)
				fb.inj.Set()
				fb.checkOnce(t, calls, ans)
				faults := fb.inj.Faults(op.name)
				if faults == 0 {
					t.Fatalf("no fault injected (%d picked): the case tested nothing", fb.inj.Seen(op.name))
				}
				t.Logf("%d faults of %d picked; %d errors answered: %q", faults, fb.inj.Seen(op.name), len(ans.errors), ans.errors)
				errs := len(ans.errors)
				switch {
				case op.busyClaim && busyKind(kind):
					if errs != 0 {
						t.Errorf("%d errors answered for %d busy errors on claims, want none: the claim retries", errs, faults)
					}
				case op.errors == perFault && errs != faults,
					op.errors == perBatch && errs < faults,
					op.errors == atMostPerFault && errs > faults:
					t.Errorf("%d errors answered for %d faults", errs, faults)
				}
				// Every attempt that failed released its claim, so each call
				// ran in the attempt that claimed it afresh.
				if !op.takeovers {
					if got := count(t, fb.db.Read, `SELECT count(*) FROM calls WHERE attempts != 1`); got != 0 {
						t.Errorf("%d calls were taken over: an attempt left its claim behind", got)
					}
				}
			})
		}
	}
}
