package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Tests of the claim queue: a destination claims effects ahead of its free
// slots, a slot goes from one attempt to the next queued effect, and
// outcomes commit in groups that also claim the next effects.

// insertEffects writes n pending effects to destination "payments", due
// at once, each under key "q-<i>".
func insertEffects(t *testing.T, db *schema.DB, n int) {
	t.Helper()
	tx, err := db.Write.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for i := range n {
		if _, err := tx.Exec(`
INSERT INTO effects (seq, destination, method, path, headers, body, idempotency_key, next_attempt_at, created_at, updated_at)
VALUES (1, 'payments', 'POST', '/v1/charges', '{"Content-Type":"application/json"}', $1, $2, 0, $3, $4)`,
			fmt.Sprintf(`{"charge_id":%d,"amount":100}`, i+1), fmt.Sprint("q-", i), time.Now().UnixMilli(), time.Now().UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// Many more effects than slots: each goes out once, with one attempt, and
// none is left claimed.
func TestDispatchQueue_DeliversEachOnce(t *testing.T) {
	t.Parallel()
	const n = 60
	s := newDispatchSetup(t, 0, nil)
	insertEffects(t, s.db, n)
	d := s.dispatcher(t, dispatch.Destination{Concurrency: 2}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := d.Drain(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Delivered != n || c.Open() != 0 {
		t.Fatalf("counts after drain = %+v, want %d delivered", c, n)
	}
	if got := count(t, s.db.Read, `SELECT count(*) FROM effects WHERE attempts != 1 OR lease_owner != ''`); got != 0 {
		t.Errorf("%d effects with attempts other than 1 or a lease left", got)
	}
	if got, keys := len(s.fake.Requests()), len(s.fake.Keys()); got != n || keys != n || len(s.fake.Applied()) != n {
		t.Errorf("the fake got %d requests under %d keys and applied %d, want %d of each", got, keys, len(s.fake.Applied()), n)
	}
}

// A Drain whose time is up before it could deliver anything reports the
// effects still pending, not zero counts: mcp-outbox drain read zeros as
// "drained" and exited 0 with an effect pending (seen in CI, where the
// timeout passed inside the first round on a loaded machine).
func TestDrain_TimeoutReportsWhatIsLeft(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 0, nil)
	insertEffects(t, s.db, 2)
	d := s.dispatcher(t, dispatch.Destination{}, nil)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	c, err := d.Drain(ctx, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain past its deadline: %v, want DeadlineExceeded", err)
	}
	if c.Open() != 2 {
		t.Errorf("counts = %+v, want the 2 effects still pending", c)
	}
}

// A queued claim whose lease would pass during its attempt is given back,
// not sent, and its claim is not counted as an attempt; a later claim
// delivers it.
func TestDispatchQueue_ReleasesStaleClaim(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 2, nil)
	release := make(chan struct{})
	s.fake.FailNext(1, downstream.Hold(release))
	d := s.dispatcher(t, dispatch.Destination{Concurrency: 1, Timeout: 10 * time.Second},
		&dispatch.Options{Lease: time.Minute})

	done := make(chan error, 1)
	go func() { done <- d.RoundForTest(context.Background()) }()
	if err := s.fake.WaitRequests(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	// The first effect is being sent, the second waits in the queue.
	if e := effect(t, s.db.Read, 2); e.state != "in_flight" || e.attempts != 1 {
		t.Fatalf("second effect while the first is sent: %+v, want claimed", e)
	}
	s.clk.Add(55 * time.Second) // 5s of the lease left, less than a timeout
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	round(t, d) // finds the queued claim stale
	if e := effect(t, s.db.Read, 2); e.state != "pending" || e.attempts != 0 {
		t.Fatalf("stale claim: %+v, want pending again with no attempt counted", e)
	}
	if got := s.fake.Count(effect(t, s.db.Read, 2).key); got != 0 {
		t.Fatalf("the stale claim was sent %d times", got)
	}
	round(t, d)
	if e := effect(t, s.db.Read, 2); e.state != "delivered" || e.attempts != 1 {
		t.Fatalf("after a new claim: %+v, want delivered at the first attempt", e)
	}
}

// On shutdown, effects claimed but not yet attempted go back to pending at
// once, with no attempt counted, so the next dispatcher need not wait for
// their leases.
func TestDispatchQueue_ShutdownReleasesQueued(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 3, nil)
	s.fake.FailNext(1, downstream.Hang())
	d := s.dispatcher(t, dispatch.Destination{Concurrency: 1, Timeout: time.Hour},
		&dispatch.Options{ShutdownTimeout: 50 * time.Millisecond, Now: time.Now})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	if err := s.fake.WaitRequests(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if got := count(t, s.db.Read, `SELECT count(*) FROM effects WHERE state = 'in_flight'`); got < 2 {
		t.Fatalf("%d effects claimed while the first hangs, want it and a queued one", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := count(t, s.db.Read, `SELECT count(*) FROM effects WHERE state != 'pending' OR lease_owner != ''`); got != 0 {
		t.Errorf("%d effects not pending after shutdown", got)
	}
	if got := count(t, s.db.Read, `SELECT sum(attempts) FROM effects`); got != 1 {
		t.Errorf("attempts = %d, want 1: only the hanging request was made", got)
	}
}

// On an encrypted database (it holds data keys), a dispatcher without a
// Sealer refuses to start: Drain and Run fail with sealing.ErrKeyRequired
// before they claim an effect, so no attempt is spent and no effect is
// pushed back (a stranger's drain without the key file did both to all
// of them). With no data keys, nothing changes.
func TestDispatch_EncryptedDatabaseNeedsSealer(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 0, nil)
	insertEffects(t, s.db, 3)
	if _, err := s.db.Write.Exec(`INSERT INTO data_keys (id, principal, purpose, key_id, wrapped, created_at)
		VALUES ('dek-1', 'local', 'seal', 'k1', $1, 0)`, []byte("wrapped")); err != nil {
		t.Fatal(err)
	}
	d := s.dispatcher(t, dispatch.Destination{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.Drain(ctx, nil); !errors.Is(err, sealing.ErrKeyRequired) {
		t.Errorf("Drain without a Sealer: %v, want sealing.ErrKeyRequired", err)
	}
	if err := d.Run(ctx); !errors.Is(err, sealing.ErrKeyRequired) {
		t.Errorf("Run without a Sealer: %v, want sealing.ErrKeyRequired", err)
	}
	if n := count(t, s.db.Read, `SELECT count(*) FROM effects WHERE attempts = 0 AND next_attempt_at = 0 AND state = 'pending'`); n != 3 {
		t.Errorf("%d of 3 effects untouched", n)
	}
	if n := len(s.fake.Requests()); n != 0 {
		t.Errorf("the destination got %d requests, want none", n)
	}
	// Erased, the key no longer counts: the database holds no live one.
	if _, err := s.db.Write.Exec(`UPDATE data_keys SET erased_at = 1, wrapped = NULL`); err != nil {
		t.Fatal(err)
	}
	if c, err := d.Drain(ctx, nil); err != nil || c.Delivered != 3 {
		t.Errorf("Drain after the key was erased: %+v, %v; want the 3 delivered", c, err)
	}
}
