package outbox_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The wall clock jumping. Leases and expiries are wall-clock times in the
// database, but what keeps a call from running twice is the owner fence,
// checked under SQLite's write lock in the transaction that commits: a clock
// can make a claim look expired or alive for longer, which changes who
// waits, never how many run.

// TestFault_ClockBackAndForwardAroundALease: process B's clock jumps back
// two hours while A holds a claim (B waits: the lease looks longer), then
// forward past the lease (B takes the call over, and A, waking, fails the
// fence): one execution either way.
func TestFault_ClockBackAndForwardAroundALease(t *testing.T) {
	t.Parallel()
	db := openLeasedDB(t)
	clkA, clkB := &clock{t: time.Now()}, &clock{t: time.Now()}
	a := setupOn(t, db, &outbox.Options{Now: clkA.Now, Lease: time.Minute}, nil)
	b := setupOn(t, db, &outbox.Options{Now: clkB.Now, Lease: time.Minute, InFlightWait: 50 * time.Millisecond}, nil)
	ga, gb := addGate(a.layer, a.server), addGate(b.layer, b.server)
	close(gb.release)

	resA := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, _ := callErr(context.Background(), a.session, "gate", "jump", map[string]any{"n": 1})
		resA <- r
	}()
	<-ga.started

	clkB.Add(-2 * time.Hour)
	if r := call(t, b.session, "gate", "jump", map[string]any{"n": 1}); errorCode(r) != "in_progress" {
		t.Fatalf("B, clock two hours back, during A's lease: %v %s", r.Meta, text(r))
	}
	clkB.Add(2*time.Hour + time.Minute + time.Second)
	if r := call(t, b.session, "gate", "jump", map[string]any{"n": 1}); r.IsError || callMeta(r)["replayed"] != false {
		t.Fatalf("B, clock past A's lease: %v %s", r.Meta, text(r))
	}
	clkA.Add(-2 * time.Hour) // A's clock going back changes nothing for A's fence
	close(ga.release)
	if r := <-resA; r == nil || errorCode(r) != "in_progress" {
		t.Fatalf("A after the takeover: %v", r)
	}
	if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	if r := call(t, a.session, "gate", "jump", map[string]any{"n": 1}); r.IsError || callMeta(r)["replayed"] != true {
		t.Errorf("retry in A: %v %s", r.Meta, text(r))
	}
}

// TestFault_ClockForwardWhileCommitting: A's handler is inside its
// transaction, holding SQLite's write lock, when B's clock jumps past A's
// lease. B's claim cannot take the call over before A commits (it needs the
// lock), and after, finds the outcome: B replays it.
func TestFault_ClockForwardWhileCommitting(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.db")
	held, release := make(chan struct{}), make(chan struct{})
	retrying := make(chan struct{})
	var heldOnce, retryOnce sync.Once
	hold := func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{ N int }) (*mcp.CallToolResult, struct{ N int }, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, in.N); err != nil {
			return nil, in, err
		}
		heldOnce.Do(func() { close(held) })
		<-release
		return nil, in, nil
	}
	clkB := &clock{t: time.Now()}
	var sessions []*mcp.ClientSession
	for i, o := range []*outbox.Options{
		{Lease: time.Minute},
		{Lease: time.Minute, Now: clkB.Now, InFlightWait: 20 * time.Second,
			Logger: slog.New(&signalHandler{msg: "claim retried", fire: func() { retryOnce.Do(func() { close(retrying) }) }})},
	} {
		db, err := schema.Open(context.Background(), path, &schema.Options{BusyTimeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if i == 0 {
			mustLedger(t, db)
		}
		l, err := outbox.New(db, o)
		if err != nil {
			t.Fatal(err)
		}
		s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
		outbox.AddTool(l, s, &mcp.Tool{Name: "hold"}, hold, nil)
		sessions = append(sessions, connect(t, s))
	}
	resA := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, _ := callErr(context.Background(), sessions[0], "hold", "committing", map[string]any{"N": 1})
		resA <- r
	}()
	<-held
	clkB.Add(time.Hour)
	resB := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, _ := callErr(context.Background(), sessions[1], "hold", "committing", map[string]any{"N": 1})
		resB <- r
	}()
	<-retrying // B's claim found the write lock held, and waits
	close(release)
	if r := <-resA; r == nil || r.IsError {
		t.Fatalf("A: %v", r)
	}
	if r := <-resB; r == nil || r.IsError || callMeta(r)["replayed"] != true {
		t.Fatalf("B: %v", r)
	}
}

// TestFault_ClockKeysAndRetention: fingerprints and keys are remembered by
// expiry times; a clock going back keeps them longer (a retry replays), and
// a purge then deletes nothing early. Forward past the window, a keyless
// call runs anew: by design, that is what the window means.
func TestFault_ClockKeysAndRetention(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now, FingerprintWindow: 5 * time.Minute}, nil)
	first, keyed := callCharge(t, b.session, "", 300), callCharge(t, b.session, "kept", 301)
	clk.Add(-3 * time.Hour)
	for _, c := range []struct {
		key    string
		amount int
		res    *mcp.CallToolResult
	}{{"", 300, first}, {"kept", 301, keyed}} {
		if r := callCharge(t, b.session, c.key, c.amount); r.IsError || callMeta(r)["replayed"] != true || chargeID(t, r) != chargeID(t, c.res) {
			t.Errorf("key %q, clock three hours back: %v %s", c.key, r.Meta, text(r))
		}
	}
	if c, err := admin.Purge(context.Background(), b.db, &admin.PurgeOptions{Now: clk.Now()}); err != nil || c != (admin.PurgeCounts{}) {
		t.Errorf("purge with the clock back: %+v %v", c, err)
	}
	clk.Add(3*time.Hour + 5*time.Minute + time.Second)
	if r := callCharge(t, b.session, "", 300); r.IsError || callMeta(r)["replayed"] != false {
		t.Errorf("keyless call past its window: %v %s", r.Meta, text(r))
	}
	if r := callCharge(t, b.session, "kept", 301); r.IsError || callMeta(r)["replayed"] != true {
		t.Errorf("keyed call within its retention: %v %s", r.Meta, text(r))
	}
}

// TestFault_SkewedReplicaClocksPostgres: replicas whose clocks are two
// minutes off the database server's, with a lease shorter than that. Leases
// are written and judged in the server's clock, so a replica ahead does not
// take over a live claim early, and one behind does not wait two minutes
// past an abandoned claim's lease before taking it over.
func TestFault_SkewedReplicaClocksPostgres(t *testing.T) {
	postgresOnly(t)
	t.Parallel()
	skewed := func(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

	t.Run("AheadDoesNotReclaimEarly", func(t *testing.T) {
		t.Parallel()
		db := openLeasedDB(t)
		a := setupOn(t, db, &outbox.Options{Lease: time.Minute}, nil)
		b := setupOn(t, db, &outbox.Options{Lease: time.Minute, InFlightWait: 50 * time.Millisecond, Now: skewed(2 * time.Minute)}, nil)
		ga, gb := addGate(a.layer, a.server), addGate(b.layer, b.server)
		close(gb.release)
		t.Cleanup(func() { openGate(ga) }) // before the sessions close, should the test fail
		resA := make(chan *mcp.CallToolResult, 1)
		go func() {
			r, _ := callErr(context.Background(), a.session, "gate", "ahead", map[string]any{"n": 1})
			resA <- r
		}()
		<-ga.started // claimed, before its first statement
		if r := call(t, b.session, "gate", "ahead", map[string]any{"n": 1}); errorCode(r) != "in_progress" {
			t.Fatalf("B, two minutes ahead, during A's one-minute lease: %v %s; want in_progress", r.Meta, text(r))
		}
		openGate(ga)
		if r := <-resA; r == nil || r.IsError {
			t.Fatalf("A: %v", r)
		}
		if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 1 || gb.runs.Load() != 0 {
			t.Errorf("charges = %d, B's runs = %d; want 1 and 0", got, gb.runs.Load())
		}
	})

	t.Run("BehindDoesNotHoldLate", func(t *testing.T) {
		t.Parallel()
		db := openLeasedDB(t)
		a := setupOn(t, db, &outbox.Options{Lease: time.Minute}, nil)
		b := setupOn(t, db, &outbox.Options{Lease: time.Minute, InFlightWait: 50 * time.Millisecond, Now: skewed(-2 * time.Minute)}, nil)
		ga, gb := addGate(a.layer, a.server), addGate(b.layer, b.server)
		close(gb.release)
		t.Cleanup(func() { openGate(ga) }) // before the sessions close, should the test fail
		resA := make(chan *mcp.CallToolResult, 1)
		go func() {
			r, _ := callErr(context.Background(), a.session, "gate", "behind", map[string]any{"n": 1})
			resA <- r
		}()
		<-ga.started
		// The claim's owner is gone (as a replica that died would be): its
		// lease, in the server's clock, passes in a second and a half.
		if _, err := db.Write.Exec(`UPDATE calls SET owner = 'elsewhere/1/1/00000000#1',
    lease_until = CAST(extract(epoch FROM clock_timestamp()) * 1000 AS BIGINT) + 1500 WHERE key = 'behind'`); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			r := call(t, b.session, "gate", "behind", map[string]any{"n": 1})
			if errorCode(r) != "in_progress" {
				if r.IsError {
					t.Fatalf("B after the lease passed: %v %s", r.Meta, text(r))
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("B, two minutes behind, still waits 20 s after the lease passed")
			}
			time.Sleep(100 * time.Millisecond) // a client retrying, with a deadline
		}
		openGate(ga)
		if r := <-resA; r == nil || !r.IsError {
			t.Errorf("A, whose claim was taken over: %v, want an error", r)
		}
		if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != 1 || gb.runs.Load() != 1 {
			t.Errorf("charges = %d, B's runs = %d; want 1 and 1", got, gb.runs.Load())
		}
	})
}

// openGate lets g's handlers through, if it is not open yet.
func openGate(g *gate) {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}
