package outbox_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// These tests are about what only several replicas on one PostgreSQL
// database can do to each other. Each replica is a layer on its own
// schema.DB (its own pool of connections), as in separate processes; the
// process-level tests (SIGKILL, SIGSTOP) are in cmd/mcp-outbox.

// replica is one layer of a test on the shared database, with a "pay" tool
// that writes a charge and may be held before its first statement.
type replica struct {
	db      *schema.DB
	layer   *outbox.Layer
	session *mcp.ClientSession
	runs    atomic.Int32 // times its pay handler began
	hold    chan struct{}
	reached chan struct{} // receives when a held handler is waiting
}

type payIn struct {
	Amount int64 `json:"amount"`
	Hold   bool  `json:"hold,omitempty"`
}

func newReplica(t *testing.T, url string, opts *outbox.Options) *replica {
	t.Helper()
	return newReplicaWith(t, url, nil, opts)
}

// newReplicaWith is newReplica on a database opened with dbOpts.
func newReplicaWith(t *testing.T, url string, dbOpts *schema.Options, opts *outbox.Options) *replica {
	t.Helper()
	db, err := schema.Open(context.Background(), url, dbOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	mustLedger(t, db)
	l, err := outbox.New(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{db: db, layer: l, hold: make(chan struct{}), reached: make(chan struct{}, 8)}
	s := l.NewServer(&mcp.Implementation{Name: "replica", Version: "v0"}, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "pay"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in payIn) (*mcp.CallToolResult, struct{}, error) {
		r.runs.Add(1)
		if in.Hold {
			r.reached <- struct{}{}
			<-r.hold
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, in.Amount)
		return nil, struct{}{}, err
	}, nil)
	r.session = connect(t, s)
	return r
}

// committedClaims opens a replica's database through a driver that wraps
// pgx's (a fault injector with no faults), which cannot pipeline: its
// claims commit on their own, as visible rows with a lease, the path of
// durable claims and takeovers. (On pgx's own driver a fresh key's claim
// rides uncommitted in the call's transaction: claim_tx_postgres_test.go.)
func committedClaims() *schema.Options {
	return &schema.Options{Driver: faultdb.NewPostgres(1).DriverName()}
}

func payCharges(t *testing.T, db *schema.DB) int {
	return count(t, db.Read, `SELECT count(*) FROM charges`)
}

// The same key sent to three replicas at the same instant runs once; the
// other two answer with its result.
func TestPostgres_SameKeyAtOnceOnThreeReplicas(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	var rs []*replica
	for range 3 {
		rs = append(rs, newReplica(t, url, nil))
	}
	const keys = 20
	var wg sync.WaitGroup
	results := make([][3]*mcp.CallToolResult, keys)
	for k := range keys {
		for i, r := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := callErr(context.Background(), r.session, "pay", "k-"+string(rune('a'+k)), payIn{Amount: 100})
				if err != nil {
					t.Errorf("key %d replica %d: %v", k, i, err)
					return
				}
				results[k][i] = res
			}()
		}
	}
	wg.Wait()
	if n := payCharges(t, rs[0].db); n != keys {
		t.Fatalf("charges = %d, want %d (one per key)", n, keys)
	}
	for k := range keys {
		executed := 0
		for i, res := range results[k] {
			if res == nil {
				continue
			}
			if res.IsError {
				t.Errorf("key %d replica %d: %s %s", k, i, errorCode(res), text(res))
				continue
			}
			if callMeta(res)["replayed"] != true {
				executed++
			}
		}
		if executed != 1 {
			t.Errorf("key %d: %d answers say executed, want 1", k, executed)
		}
	}
}

// A replica whose handler runs past the lease keeps its call: it renews
// the lease, so a duplicate on another replica waits (and gives up as in
// progress) instead of taking the call over and running it again. (A
// claim that is a committed row, as through a wrapping driver; see
// committedClaims.)
func TestPostgres_LeaseRenewedWhileHandlerRuns(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	const lease = 300 * time.Millisecond
	a := newReplicaWith(t, url, committedClaims(), &outbox.Options{Lease: lease})
	b := newReplica(t, url, &outbox.Options{Lease: lease, InFlightWait: 4 * lease})

	first := make(chan *mcp.CallToolResult, 1)
	go func() { first <- call(t, a.session, "pay", "long", payIn{Amount: 5, Hold: true}) }()
	<-a.reached
	var leased int64
	if err := a.db.Read.QueryRow(`SELECT lease_until FROM calls WHERE key = 'long'`).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	// Renewals (every third of the lease) push the lease two whole leases
	// past where the claim set it: the handler has been running for longer
	// than a lease and still holds its call.
	waitFor(t, func() bool {
		var now int64
		_ = a.db.Read.QueryRow(`SELECT lease_until FROM calls WHERE key = 'long'`).Scan(&now)
		return now >= leased+2*lease.Milliseconds()
	})
	dup := call(t, b.session, "pay", "long", payIn{Amount: 5, Hold: true})
	if errorCode(dup) != "in_progress" {
		t.Fatalf("duplicate while the lease is renewed: %s %s", errorCode(dup), text(dup))
	}
	close(a.hold)
	if res := <-first; res.IsError {
		t.Fatalf("original: %s", text(res))
	}
	if n := payCharges(t, a.db); n != 1 || b.runs.Load() != 0 {
		t.Fatalf("charges = %d, runs on b = %d; want 1 and 0", n, b.runs.Load())
	}
}

// A replica that stops renewing (paused: here its clock stands still, so
// every lease it writes is already past) loses the call to another
// replica, which runs it; when the paused one resumes, its fence fails and
// it commits nothing.
func TestPostgres_PausedOwnerLosesTheCallAndCannotCommit(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	past := time.Now().Add(-time.Hour)
	a := newReplicaWith(t, url, committedClaims(), &outbox.Options{Lease: 300 * time.Millisecond, Now: func() time.Time { return past }})
	b := newReplica(t, url, &outbox.Options{Lease: 300 * time.Millisecond})

	first := make(chan *mcp.CallToolResult, 1)
	go func() { first <- call(t, a.session, "pay", "paused", payIn{Amount: 7, Hold: true}) }()
	<-a.reached
	retry := make(chan *mcp.CallToolResult, 1)
	go func() { retry <- call(t, b.session, "pay", "paused", payIn{Amount: 7, Hold: true}) }()
	<-b.reached // b took the call over and runs it
	b.hold <- struct{}{}
	if res := <-retry; res.IsError {
		t.Fatalf("retry on another replica: %s %s", errorCode(res), text(res))
	}
	close(a.hold) // the paused replica resumes
	old := <-first
	if !old.IsError || errorCode(old) != "in_progress" {
		t.Fatalf("resumed owner: %s %s; want in_progress (taken over)", errorCode(old), text(old))
	}
	if n := payCharges(t, a.db); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
	var attempts int
	var state string
	if err := a.db.Read.QueryRow(`SELECT attempts, state FROM calls WHERE key = 'paused'`).Scan(&attempts, &state); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || state != "completed" {
		t.Fatalf("call: attempts %d state %s; want 2 completed", attempts, state)
	}
}

// An owner whose lease passed before its handler's first statement does
// not commit, even when nobody took the call over: it records nothing and
// a retry runs the call.
func TestPostgres_ExpiredLeaseNeverCommits(t *testing.T) {
	postgresOnly(t)
	url := pgtest.Database(t)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	now := func() time.Time { return time.UnixMilli(clock.Load()) }
	a := newReplicaWith(t, url, committedClaims(), &outbox.Options{Lease: time.Minute, Now: now})

	first := make(chan *mcp.CallToolResult, 1)
	go func() { first <- call(t, a.session, "pay", "late", payIn{Amount: 9, Hold: true}) }()
	<-a.reached
	clock.Add((2 * time.Minute).Milliseconds())
	close(a.hold)
	res := <-first
	if !res.IsError || !strings.Contains(text(res), "lease expired") {
		t.Fatalf("owner past its lease: %s %s", errorCode(res), text(res))
	}
	if n := payCharges(t, a.db); n != 0 {
		t.Fatalf("charges = %d after an expired owner's attempt, want 0", n)
	}
	if again := call(t, a.session, "pay", "late", payIn{Amount: 9}); again.IsError {
		t.Fatalf("retry: %s", text(again))
	}
	if n := payCharges(t, a.db); n != 1 {
		t.Fatalf("charges = %d after the retry, want 1", n)
	}
}

// With PostgreSQL down, a call fails with an error that says nothing ran,
// and once it is back the same layer records calls again by itself.
func TestPostgres_StoreDownFailsLoudlyAndRecovers(t *testing.T) {
	postgresOnly(t)
	if testing.Short() {
		t.Skip("starts a PostgreSQL server of its own")
	}
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	db, err := schema.Open(context.Background(), srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := ledger.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, db, &outbox.Options{InFlightWait: 2 * time.Second}, nil)
	if res := callCharge(t, b.session, "before", 100); res.IsError {
		t.Fatalf("before: %s", text(res))
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	down := callCharge(t, b.session, "during", 100)
	if !down.IsError || errorCode(down) != "not_recorded" || !strings.Contains(text(down), "nothing was executed") ||
		!strings.Contains(text(down), "call id call_") {
		t.Fatalf("with the store down: %s %s", errorCode(down), text(down))
	}
	for _, driver := range []string{"dial", "connect", "127.0.0.1", "SQLSTATE"} {
		if strings.Contains(text(down), driver) {
			t.Errorf("with the store down, the answer carries the driver's text %q: %s", driver, text(down))
		}
	}
	if err := db.CheckReady(context.Background()); err == nil {
		t.Fatal("CheckReady says ready with the store down")
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return db.CheckReady(context.Background()) == nil })
	if res := callCharge(t, b.session, "during", 100); res.IsError || callMeta(res)["replayed"] == true {
		t.Fatalf("after the restart: %s %v", text(res), res.Meta)
	}
	if again := callCharge(t, b.session, "before", 100); callMeta(again)["replayed"] != true {
		t.Fatalf("a call from before the restart is not replayed: %v", again.Meta)
	}
	if n := charges(t, b); n != 2 {
		t.Fatalf("charges = %d, want 2", n)
	}
}
