package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Two layers on one database stand for two processes: neither can see the
// other's attempts, so only the lease protects a claim.
func TestTakeover_FenceStopsOldOwner(t *testing.T) {
	t.Parallel()
	db := openLeasedDB(t)
	clkA, clkB := &clock{t: time.Now()}, &clock{t: time.Now()}
	a := setupOn(t, db, &outbox.Options{Now: clkA.Now, Lease: time.Minute}, nil)
	b := setupOn(t, db, &outbox.Options{Now: clkB.Now, Lease: time.Minute}, nil)
	ga, gb := addGate(a.layer, a.server), addGate(b.layer, b.server)
	close(gb.release)

	resA := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, _ := callErr(context.Background(), a.session, "gate", "contested", map[string]any{"n": 1})
		resA <- r
	}()
	<-ga.started // A holds the claim and has not begun its transaction

	// While A's lease runs, B's duplicate waits, then reports in progress.
	bOpts := setupOn(t, db, &outbox.Options{Now: clkB.Now, InFlightWait: 30 * time.Millisecond}, nil)
	addGate(bOpts.layer, bOpts.server)
	if r := call(t, bOpts.session, "gate", "contested", map[string]any{"n": 1}); errorCode(r) != "in_progress" {
		t.Fatalf("duplicate during the lease: %v %s", r.Meta, text(r))
	}

	clkB.Add(time.Minute + time.Second) // A's lease has passed for B
	r := call(t, b.session, "gate", "contested", map[string]any{"n": 1})
	if r.IsError || callMeta(r)["replayed"] != false {
		t.Fatalf("takeover: %v %s", r.Meta, text(r))
	}
	if got := count(t, db.Read, `SELECT attempts FROM calls WHERE key = 'contested'`); got != 2 {
		t.Errorf("attempts = %d, want 2", got)
	}

	close(ga.release) // A wakes up and must not commit
	old := <-resA
	if old == nil || !old.IsError {
		t.Fatalf("old owner's result = %v, want an error", old)
	}
	// Its client hears what a retry gets: B's outcome, not a new run.
	if strings.Contains(text(old), "runs it again") || !strings.Contains(text(old), "a retry gets it, replayed") {
		t.Errorf("old owner's answer: %s; want that a retry gets the other attempt's outcome", text(old))
	}
	if err := <-ga.lastErrs; !errors.Is(err, outbox.ErrOwnershipLost) {
		t.Errorf("old owner's first statement: %v, want ErrOwnershipLost", err)
	}
	if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	// A retry anywhere replays B's outcome.
	if r := call(t, a.session, "gate", "contested", map[string]any{"n": 1}); callMeta(r)["replayed"] != true {
		t.Errorf("retry after takeover: %v", r.Meta)
	}
}

// A claim left by a process that died is taken over at once, without
// waiting for its lease: the retry after a restart runs immediately.
func TestTakeover_DeadOwner(t *testing.T) {
	sqliteOnly(t, "an owner's death seen in /proc; on PostgreSQL its lease decides (TestPostgres_TakeoverAfterLease)")
	t.Parallel()
	b := setup(t, nil, nil)
	canonical, _ := callkey.Canonical([]byte(`{"amount":100}`))
	now := time.Now().UnixMilli()
	_, err := b.db.Write.Exec(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at)
		VALUES ('call_dead', 'local', 'left-behind', 'meta', 'charge', $1, 'in_flight', $2, $3, $4, $5)`,
		callkey.ArgsHash(canonical), deadOwner(t), now+time.Hour.Milliseconds(), now, now+time.Hour.Milliseconds())
	if err != nil {
		t.Fatal(err)
	}
	res := callCharge(t, b.session, "left-behind", 100)
	if res.IsError || callMeta(res)["replayed"] != false || callMeta(res)["callId"] != "call_dead" {
		t.Fatalf("retry of a dead owner's call: %v %s", res.Meta, text(res))
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// deadOwner names an owner on this host whose process has exited.
func deadOwner(t *testing.T) string {
	t.Helper()
	host, err := hostname()
	if err != nil {
		t.Skip("no hostname")
	}
	// pid 2^22+1 is above Linux's pid_max default, so no process has it;
	// a recorded start time that cannot match marks it as gone.
	return host + "/4194305/1/deadbeef#1"
}

func TestCall_DatabaseLocked(t *testing.T) {
	sqliteOnly(t, "SQLite's write lock held by another connection")
	t.Parallel()
	path := t.TempDir() + "/locked.db"
	db, err := schema.Open(context.Background(), path, &schema.Options{BusyTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b := setupOn(t, mustLedger(t, db), &outbox.Options{InFlightWait: 300 * time.Millisecond}, nil)

	// Another connection holds the write lock past busy_timeout, and past
	// the in-flight wait the claim keeps trying for.
	other, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.Write.Begin()
	if err != nil {
		t.Fatal(err)
	}
	res := callCharge(t, b.session, "locked", 100)
	if !res.IsError || errorCode(res) != "in_progress" || !strings.Contains(text(res), "another process holds the database") {
		t.Fatalf("call against a locked database: %v %s", res.Meta, text(res))
	}
	tx.Rollback()
	res = callCharge(t, b.session, "locked", 100)
	if res.IsError || callMeta(res)["replayed"] != false {
		t.Fatalf("retry after the lock: %s", text(res))
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}
