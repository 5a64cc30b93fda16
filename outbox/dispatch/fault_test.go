package dispatch_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// The dispatcher's database operations under store faults: its lease
// (claim) of due effects, the at_most_once mark before a send, and the
// record of a delivery's outcome, each with its commit.
//
// Rates are 0.3 per pick, but 0.1 for the outcome statement: outcomes are
// written in batches, one statement each, so at 0.3 a batch of eight would
// fail 94% of its commits, a database no retry can get through.
var dispatchFaultOps = []struct {
	name string
	rule faultdb.Rule
	amo  bool // only at_most_once destinations mark effects before sending
}{
	{name: "lease", rule: faultdb.Rule{Stmt: faultdb.Contains("UPDATE effects SET state = 'in_flight'")}},
	{name: "lease_commit", rule: faultdb.Rule{Op: faultdb.Commit, Tx: faultdb.Ran("UPDATE effects SET state = 'in_flight'")}},
	{name: "mark_sent", rule: faultdb.Rule{Stmt: faultdb.Contains("UPDATE effects SET send_started_at")}, amo: true},
	{name: "outcome", rule: faultdb.Rule{Stmt: faultdb.Contains("UPDATE effects SET state = $1, last_status"), Rate: 0.1}},
	{name: "outcome_commit", rule: faultdb.Rule{Op: faultdb.Commit, Tx: faultdb.Ran("UPDATE effects SET state = $1, last_status")}},
}

// dispatchSeed is a case's fixed seed, chosen like faultSeed's: each rule
// fails one of its first four picks (eight for the outcome statement).
func dispatchSeed(op int, kind faultdb.Kind, amo bool) uint64 {
	s := 405337*128 + uint64(8*op+2*(int(kind)-1))
	if amo {
		s++
	}
	return s
}

// Every effect is delivered, applied once under its one key, in one
// attempt: a lease that failed was rolled back (not an attempt), and an
// outcome that failed to commit is written again while the lease holds,
// so nothing waits out a lease to be sent again. An at_most_once
// destination, which applies every request it gets, sees each effect
// exactly once, and none becomes unknown.
func TestFault_Dispatch(t *testing.T) {
	t.Parallel()
	n := faultCalls(t)
	for i, op := range dispatchFaultOps {
		for _, amo := range []bool{false, true} {
			if op.amo && !amo {
				continue
			}
			for _, kind := range faultdb.Kinds {
				name := op.name + "/" + kind.String()
				if amo {
					name += "/at_most_once"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					fb := faultSetup(t, dispatchSeed(i, kind, amo), 1, nil)
					for j := range n {
						if res := callCharge(t, fb.session, fmt.Sprint("d-", j), 100+j); res.IsError {
							t.Fatal(text(res))
						}
					}
					fake := downstream.Start(t, &downstream.Options{NoDedup: amo})
					u, _ := url.Parse(fake.URL())
					d, err := dispatch.New(fb.db, &dispatch.Options{
						Destinations: []dispatch.Destination{{Name: "payments", URL: u, AtMostOnce: amo, Timeout: 5 * time.Second}},
						PollInterval: 10 * time.Millisecond,
						// Short enough that an outcome left unwritten would
						// be reclaimed and sent again (or become unknown)
						// within the test; long enough for a loaded machine.
						Lease: 5 * time.Second,
					})
					if err != nil {
						t.Fatal(err)
					}
					r := op.rule
					r.Name, r.Kind = op.name, kind
					if r.Rate == 0 {
						r.Rate = 0.3
					}
					fb.inj.Set(r)
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan error, 1)
					go func() { done <- d.Run(ctx) }()
					waitUntil(t, 30*time.Second, func() bool {
						return count(t, fb.db.Read, `SELECT count(*) FROM effects WHERE state NOT IN ('pending', 'in_flight')`) == n
					})
					cancel()
					if err := <-done; err != nil {
						t.Fatal(err)
					}
					fb.inj.Set()
					if fb.inj.Faults(op.name) == 0 {
						t.Fatalf("no fault injected (%d picked): the case tested nothing", fb.inj.Seen(op.name))
					}
					checkDeliveredOnce(t, fb, fake, n)
					t.Logf("%d faults of %d picked", fb.inj.Faults(op.name), fb.inj.Seen(op.name))
				})
			}
		}
	}
}

func checkDeliveredOnce(t *testing.T, fb *faultBundle, fake *downstream.Server, n int) {
	t.Helper()
	rows, err := fb.db.Read.Query(`SELECT idempotency_key, state, attempts, last_error FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	keys := map[string]bool{}
	for rows.Next() {
		var key, state, lastErr string
		var attempts int
		if err := rows.Scan(&key, &state, &attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		keys[key] = true
		if state != "delivered" || attempts != 1 {
			t.Errorf("effect %s: %s after %d attempts (%s), want delivered in one", key, state, attempts, lastErr)
		}
		if got := fake.Count(key); got != 1 {
			t.Errorf("effect %s: %d requests, want 1", key, got)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	for _, e := range fake.Applied() {
		applied[e.Key]++
	}
	if len(keys) != n || len(applied) != n {
		t.Errorf("%d effects, %d keys applied; want %d", len(keys), len(applied), n)
	}
	for k, c := range applied {
		if !keys[k] || c != 1 {
			t.Errorf("key %s applied %d times (an effect's key: %v)", k, c, keys[k])
		}
	}
}

// waitUntil polls cond until it holds, failing the test after limit.
func waitUntil(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", limit)
		}
		<-tick.C
	}
}

// TestFault_ClockDispatcher: a retry's backoff is a due time; with the clock
// back it is later (nothing is sent early), forward it comes sooner, and
// the effect goes with the same key. A clock jumping past the lease of an
// attempt in flight does not make the dispatcher reclaim its own attempt:
// the effect is sent once.
func TestFault_ClockDispatcher(t *testing.T) {
	t.Parallel()
	t.Run("Backoff", func(t *testing.T) {
		t.Parallel()
		s := newDispatchSetup(t, 1, nil)
		s.fake.FailNext(1, downstream.Status(503))
		d := s.dispatcher(t, dispatch.Destination{}, nil)
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "pending" {
			t.Fatalf("after a 503: %+v", e)
		}
		s.clk.Add(-time.Hour)
		round(t, d)
		if got := len(s.fake.Requests()); got != 1 {
			t.Fatalf("clock an hour back: %d requests, want the first only", got)
		}
		s.clk.Add(time.Hour + time.Second)
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "delivered" || e.attempts != 2 {
			t.Fatalf("clock forward again: %+v", e)
		}
		if keys := s.fake.Keys(); len(keys) != 1 || len(s.fake.Applied()) != 1 {
			t.Errorf("keys %v, applied %d; want one key, applied once", keys, len(s.fake.Applied()))
		}
	})
	t.Run("LeasePassesInFlight", func(t *testing.T) {
		t.Parallel()
		s := newDispatchSetup(t, 1, nil)
		hold := make(chan struct{})
		s.fake.FailNext(1, downstream.Hold(hold))
		d := s.dispatcher(t, dispatch.Destination{Timeout: time.Minute}, &dispatch.Options{
			Lease: 2 * time.Minute, PollInterval: time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
		idle := make(chan struct{}, 1)
		d.SetTestHooks(nil, func() {
			select {
			case idle <- struct{}{}:
			default:
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		if err := s.fake.WaitRequests(ctx, 1); err != nil {
			t.Fatal(err)
		}
		s.clk.Add(3 * time.Minute) // past the lease of the attempt in flight
		// Rounds go on (each reclaims: the poll interval is a millisecond);
		// a few of them must find nothing to reclaim and send nothing.
		for range 5 {
			<-idle
			d.Notify()
		}
		if e := effect(t, s.db.Read, 1); e.state != "in_flight" || e.attempts != 1 {
			t.Fatalf("after the jump, during the attempt: %+v", e)
		}
		close(hold)
		waitUntil(t, 30*time.Second, func() bool { return effect(t, s.db.Read, 1).state == "delivered" })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := len(s.fake.Requests()); got != 1 {
			t.Errorf("requests = %d, want 1: the dispatcher re-sent its own attempt in flight", got)
		}
		if keys := s.fake.Keys(); len(keys) != 1 || len(s.fake.Applied()) != 1 {
			t.Errorf("keys %v, applied %d; want one key, applied once", keys, len(s.fake.Applied()))
		}
	})
}

// TestFault_DrainRetries: Drain, run by deploy hooks exactly when the
// database restarts or another process holds its lock, gets through
// transient errors on its claims and its reads instead of returning the
// first one; a statement error that is no store failure still ends it.
func TestFault_DrainRetries(t *testing.T) {
	t.Parallel()
	for _, kind := range []faultdb.Kind{faultdb.Busy, faultdb.IOErr} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			const n = 3
			fb := faultSetup(t, 1, 1, nil)
			for j := range n {
				if res := callCharge(t, fb.session, fmt.Sprint("drain-", j), 100+j); res.IsError {
					t.Fatal(text(res))
				}
			}
			fake := downstream.Start(t, nil)
			u, _ := url.Parse(fake.URL())
			d, err := dispatch.New(fb.db, &dispatch.Options{
				Destinations: []dispatch.Destination{{Name: "payments", URL: u}},
			})
			if err != nil {
				t.Fatal(err)
			}
			// Every claim, and every look for open effects, fails three
			// times before the store answers again.
			fb.inj.Set(
				faultdb.Rule{Name: "claim", Stmt: faultdb.Contains("UPDATE effects SET state = 'in_flight'"), Kind: kind, Rate: 1, Max: 3},
				faultdb.Rule{Name: "open", Stmt: faultdb.Contains("SELECT EXISTS (SELECT 1 FROM effects"), Kind: kind, Rate: 1, Max: 3},
			)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := d.Drain(ctx, nil)
			if err != nil {
				t.Fatalf("Drain: %v", err)
			}
			if c.Delivered != n || c.Open() != 0 {
				t.Errorf("counts %+v, want %d delivered", c, n)
			}
			if fb.inj.Faults("claim") != 3 {
				t.Errorf("claim faults = %d, want 3", fb.inj.Faults("claim"))
			}
			if got := len(fake.Applied()); got != n {
				t.Errorf("applied %d, want %d", got, n)
			}
		})
	}
	t.Run("readonly", func(t *testing.T) {
		t.Parallel()
		fb := faultSetup(t, 1, 1, nil)
		if res := callCharge(t, fb.session, "drain-ro", 100); res.IsError {
			t.Fatal(text(res))
		}
		fake := downstream.Start(t, nil)
		u, _ := url.Parse(fake.URL())
		d, err := dispatch.New(fb.db, &dispatch.Options{Destinations: []dispatch.Destination{{Name: "payments", URL: u}}})
		if err != nil {
			t.Fatal(err)
		}
		fb.inj.Set(faultdb.Rule{Name: "claim", Stmt: faultdb.Contains("UPDATE effects SET state = 'in_flight'"), Kind: faultdb.ReadOnly, Rate: 1})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := d.Drain(ctx, nil); err == nil || ctx.Err() != nil {
			t.Fatalf("Drain on a read-only database: %v (ctx %v), want its error at once", err, ctx.Err())
		}
	})
}
