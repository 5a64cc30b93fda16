// Package storetest is the one contract every way of giving the layer a
// database must keep: schema.Open on an SQLite file or a postgres:// URL,
// schema/sqlite.FromDB, and schema/postgres.FromPool and FromDB. Each of
// those packages runs [Run] with its own constructor, so a store that
// passes here keeps the layer's promise on it: a call's writes, its
// effects and its outcome commit together, exactly once per key, across
// replicas and takeovers, its effects go out in order under one
// Idempotency-Key, and a key is forgotten only after its retention.
//
// The cases assert what a client and a destination see, never how a store
// gets there: SQLite shares a batch among calls and fences a takeover by
// its lease; PostgreSQL holds a fresh key at its unique index inside the
// call's transaction. Both must give the same answers. What is particular
// to one store (round trips, group commit, the listener) is tested in its
// own package.
package storetest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A Store is a way of opening the layer's database.
type Store struct {
	// Open returns a fresh, migrated database for one test, and a
	// function that opens another handle on the same database: a second
	// replica (another process, on SQLite). Both are closed when the test
	// ends.
	Open func(t *testing.T) (db *schema.DB, replica func(t *testing.T) *schema.DB)
}

// Run runs every case of the contract on s.
func Run(t *testing.T, s Store) {
	t.Run("ReplayRunsOnce", func(t *testing.T) { t.Parallel(); replayRunsOnce(t, s) })
	t.Run("FingerprintRunsOnce", func(t *testing.T) { t.Parallel(); fingerprintRunsOnce(t, s) })
	t.Run("FailedCallKeepsNothing", func(t *testing.T) { t.Parallel(); failedCallKeepsNothing(t, s) })
	t.Run("ReplicasRaceOneKey", func(t *testing.T) { t.Parallel(); replicasRaceOneKey(t, s) })
	t.Run("SlowOwnerAndTakeover", func(t *testing.T) { t.Parallel(); slowOwnerAndTakeover(t, s) })
	t.Run("EffectsInOrderUnderOneKey", func(t *testing.T) { t.Parallel(); effectsInOrder(t, s) })
	t.Run("ExpiredKeysArePurged", func(t *testing.T) { t.Parallel(); expiredKeysArePurged(t, s) })
}

// invoices is the application table of the cases' tool. The same text
// creates it on both stores.
const createInvoices = `CREATE TABLE IF NOT EXISTS st_invoices (customer TEXT NOT NULL, cents BIGINT NOT NULL)`

// server is a layer serving the tool "invoice", which writes a row of
// st_invoices and enqueues one effect per line to "mailer", on one
// database handle.
type server struct {
	layer   *outbox.Layer
	session *mcp.ClientSession
	db      *schema.DB
}

type invoiceIn struct {
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
	Lines    int    `json:"lines,omitempty"` // effects to enqueue, in order; zero means one
	Fail     bool   `json:"fail,omitempty"`  // write, enqueue, then return a plain error
}

type invoiceOut struct {
	Customer string `json:"customer"`
}

// newServer builds a layer on db. before, when not nil, runs in the
// handler before its first statement, so a case can hold an attempt
// there. mailer, when not nil, is the dispatcher's destination; without
// it no dispatcher runs here.
func newServer(t *testing.T, db *schema.DB, opts *outbox.Options, before func(context.Context), mailer *url.URL, start ...func(*outbox.StartOptions)) *server {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Write.ExecContext(ctx, createInvoices); err != nil {
		t.Fatal(err)
	}
	l, err := outbox.New(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "storetest", Version: "v0"}, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "invoice"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in invoiceIn) (*mcp.CallToolResult, invoiceOut, error) {
			if before != nil {
				before(ctx)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO st_invoices (customer, cents) VALUES ($1, $2)`, in.Customer, in.Cents); err != nil {
				return nil, invoiceOut{}, err
			}
			for i := range max(in.Lines, 1) {
				body := fmt.Sprintf(`{"customer":%q,"line":%d}`, in.Customer, i+1)
				if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: "mailer", Path: "/send", Body: []byte(body)}); err != nil {
					return nil, invoiceOut{}, err
				}
			}
			if in.Fail {
				return nil, invoiceOut{}, fmt.Errorf("the handler failed after its writes")
			}
			return nil, invoiceOut{Customer: in.Customer}, nil
		}, nil)
	so := &outbox.StartOptions{NoDispatcher: true, ReapInterval: outbox.ReaperOff, TaskScanInterval: -1}
	if mailer != nil {
		so = &outbox.StartOptions{ReapInterval: outbox.ReaperOff, TaskScanInterval: -1, Dispatcher: &dispatch.Options{
			PollInterval: 50 * time.Millisecond,
			Destinations: []dispatch.Destination{{Name: "mailer", URL: mailer}},
		}}
	}
	for _, f := range start {
		f(so)
	}
	r, err := l.Start(ctx, so)
	if err != nil {
		t.Fatal(err)
	}
	srv := &server{layer: l, db: db, session: outboxtest.Connect(t, s)}
	// Registered after Connect's cleanup, so it runs first: the layer
	// stops before the session closes.
	t.Cleanup(func() {
		if err := r.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return srv
}

func (s *server) call(t *testing.T, key string, in invoiceIn) (*mcp.CallToolResult, error) {
	t.Helper()
	return outboxtest.CallErr(context.Background(), s.session, "invoice", key, in)
}

// outcome is what an answer says of the call's result: the tool's
// structured content without the note a replay or a join adds.
func outcome(res *mcp.CallToolResult) string {
	m, _ := res.StructuredContent.(map[string]any)
	c, _ := m["customer"].(string)
	return c
}

func invoices(t *testing.T, db *schema.DB) int {
	t.Helper()
	return outboxtest.Count(t, db.Read, `SELECT count(*) FROM st_invoices`)
}

func effects(t *testing.T, db *schema.DB) int {
	t.Helper()
	return outboxtest.Count(t, db.Read, `SELECT count(*) FROM effects`)
}

// A retry under the same key gets the recorded answer; the handler, its
// row and its effect happen once.
func replayRunsOnce(t *testing.T, st Store) {
	db, _ := st.Open(t)
	s := newServer(t, db, nil, nil, nil)
	first, err := s.call(t, "order-1", invoiceIn{Customer: "acme", Cents: 100})
	if err != nil || first.IsError {
		t.Fatalf("first call: %v %s", err, outboxtest.Text(first))
	}
	again, err := s.call(t, "order-1", invoiceIn{Customer: "acme", Cents: 100})
	if err != nil || again.IsError {
		t.Fatalf("retry: %v %s", err, outboxtest.Text(again))
	}
	if replayed, _ := outboxtest.CallMeta(again)["replayed"].(bool); !replayed {
		t.Errorf("retry not replayed: %v", outboxtest.CallMeta(again))
	}
	if outcome(first) != "acme" || outcome(again) != outcome(first) {
		t.Errorf("retry answered %q, first %q", outboxtest.Text(again), outboxtest.Text(first))
	}
	if n, e := invoices(t, db), effects(t, db); n != 1 || e != 1 {
		t.Errorf("invoices %d, effects %d; want 1 and 1", n, e)
	}
}

// A call without a key is known by its tool and arguments inside the
// fingerprint window: the same call again replays.
func fingerprintRunsOnce(t *testing.T, st Store) {
	db, _ := st.Open(t)
	s := newServer(t, db, nil, nil, nil)
	for i := range 2 {
		res, err := s.call(t, "", invoiceIn{Customer: "keyless", Cents: 5})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %s", i, err, outboxtest.Text(res))
		}
	}
	if n := invoices(t, db); n != 1 {
		t.Errorf("invoices %d, want 1", n)
	}
}

// A handler that fails after writing and enqueueing keeps neither: the
// writes, the effects and the outcome commit together or not at all, and
// a retry runs the call.
func failedCallKeepsNothing(t *testing.T, st Store) {
	db, _ := st.Open(t)
	s := newServer(t, db, nil, nil, nil)
	res, err := s.call(t, "order-f", invoiceIn{Customer: "acme", Cents: 1, Lines: 2, Fail: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError {
		t.Fatalf("a failed handler answered success: %s", outboxtest.Text(res))
	}
	if n, e := invoices(t, db), effects(t, db); n != 0 || e != 0 {
		t.Fatalf("after a failed call: invoices %d, effects %d; want none", n, e)
	}
	res, err = s.call(t, "order-f", invoiceIn{Customer: "acme", Cents: 1, Lines: 2})
	if err != nil || res.IsError {
		t.Fatalf("retry: %v %s", err, outboxtest.Text(res))
	}
	if n, e := invoices(t, db), effects(t, db); n != 1 || e != 2 {
		t.Errorf("after the retry: invoices %d, effects %d; want 1 and 2", n, e)
	}
}

// Two replicas (layers on two handles of one database) get the same key
// at once, several times each: the handler runs once, and every answer
// that is not an in-progress refusal is the one outcome.
func replicasRaceOneKey(t *testing.T, st Store) {
	db, replica := st.Open(t)
	a := newServer(t, db, nil, nil, nil)
	b := newServer(t, replica(t), nil, nil, nil)
	const each = 4
	var wg sync.WaitGroup
	answers := make(chan string, 2*each)
	for i := range 2 * each {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			res, err := s.call(t, "race-1", invoiceIn{Customer: "race", Cents: 7})
			switch {
			case err != nil:
				t.Errorf("call: %v", err)
			case !res.IsError:
				answers <- outcome(res)
			}
		})
	}
	wg.Wait()
	close(answers)
	n := 0
	for ans := range answers {
		if ans != "race" {
			t.Errorf("an answer for the key is not its call's outcome: %q", ans)
		}
		n++
	}
	if n == 0 {
		t.Error("no call of the race succeeded")
	}
	if got := invoices(t, db); got != 1 {
		t.Errorf("invoices %d, want 1: the handler ran more than once for one key", got)
	}
}

// An attempt whose owner stalls past its lease before its first statement
// meets a retry on another replica. However the store settles it (a
// takeover the fence then refuses, or the key held at its index), the
// call's writes and effects exist once, and a later retry gets that one
// outcome.
func slowOwnerAndTakeover(t *testing.T, st Store) {
	db, replica := st.Open(t)
	const lease = 300 * time.Millisecond
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stall := func(ctx context.Context) {
		once.Do(func() {
			close(held)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	}
	opts := &outbox.Options{Lease: lease, InFlightWait: 2 * lease}
	a := newServer(t, db, opts, stall, nil)
	b := newServer(t, replica(t), &outbox.Options{Lease: lease, InFlightWait: 2 * lease}, nil, nil)

	first := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := a.call(t, "slow-1", invoiceIn{Customer: "slow", Cents: 9})
		if err != nil {
			t.Errorf("stalled call: %v", err)
		}
		first <- res
	}()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the first attempt never reached its handler")
	}
	// Past the lease: a replica may now take the call over.
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		if _, err := b.call(t, "slow-1", invoiceIn{Customer: "slow", Cents: 9}); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	<-first
	var final *mcp.CallToolResult
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		res, err := b.call(t, "slow-1", invoiceIn{Customer: "slow", Cents: 9})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError {
			final = res
			break
		}
		time.Sleep(lease / 4) // the owner's lease or transaction ends; a retry then settles
	}
	if final == nil {
		t.Fatal("no retry got the call's outcome within 30 s")
	}
	if n, e := invoices(t, db), effects(t, db); n != 1 || e != 1 {
		t.Errorf("invoices %d, effects %d; want 1 and 1", n, e)
	}
}

// A call's effects are delivered in the order it enqueued them; one that
// fails is retried under the same Idempotency-Key, and the next waits for
// it.
func effectsInOrder(t *testing.T, st Store) {
	db, _ := st.Open(t)
	type delivery struct{ key, body string }
	got := make(chan delivery, 16)
	var mu sync.Mutex
	failedOnce := false
	mailer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 256)
		n, _ := r.Body.Read(buf)
		body := string(buf[:n])
		mu.Lock()
		fail := !failedOnce && body == `{"customer":"ordered","line":2}`
		if fail {
			failedOnce = true
		}
		mu.Unlock()
		got <- delivery{key: r.Header.Get("Idempotency-Key"), body: body}
		if fail {
			http.Error(w, "try again", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(mailer.Close)
	u, err := url.Parse(mailer.URL)
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, db, nil, nil, u)
	if res, err := s.call(t, "order-e", invoiceIn{Customer: "ordered", Cents: 3, Lines: 3}); err != nil || res.IsError {
		t.Fatalf("call: %v %s", err, outboxtest.Text(res))
	}
	var seen []delivery
	for len(seen) < 4 {
		select {
		case d := <-got:
			seen = append(seen, d)
		case <-time.After(60 * time.Second):
			t.Fatalf("deliveries after 60 s: %v", seen)
		}
	}
	want := []string{`{"customer":"ordered","line":1}`, `{"customer":"ordered","line":2}`, `{"customer":"ordered","line":2}`, `{"customer":"ordered","line":3}`}
	for i, d := range seen {
		if d.body != want[i] {
			t.Fatalf("delivery %d: %s; want the order %v (got %v)", i, d.body, want, seen)
		}
	}
	if seen[1].key == "" || seen[1].key != seen[2].key {
		t.Errorf("the retried effect's Idempotency-Key changed: %q then %q", seen[1].key, seen[2].key)
	}
	if seen[0].key == seen[1].key || seen[1].key == seen[3].key {
		t.Errorf("two effects share an Idempotency-Key: %v", seen)
	}
}

// A key is remembered for its retention, then forgotten: the reaper
// purges the finished call and its delivered effect, and the same key
// runs the call again.
func expiredKeysArePurged(t *testing.T, st Store) {
	db, _ := st.Open(t)
	mailer := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(mailer.Close)
	u, err := url.Parse(mailer.URL)
	if err != nil {
		t.Fatal(err)
	}
	const keep = 200 * time.Millisecond
	s := newServer(t, db, &outbox.Options{KeyRetention: keep}, nil, u, func(so *outbox.StartOptions) {
		so.Retention = outbox.Retention{Calls: keep, Delivered: keep}
		so.ReapInterval = keep / 2
	})
	if res, err := s.call(t, "order-p", invoiceIn{Customer: "purged", Cents: 2}); err != nil || res.IsError {
		t.Fatalf("call: %v %s", err, outboxtest.Text(res))
	}
	for end := time.Now().Add(30 * time.Second); ; {
		calls := outboxtest.Count(t, db.Read, `SELECT count(*) FROM calls`)
		if calls == 0 && effects(t, db) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("after 30 s: %d calls and %d effects left (%s)", calls, effects(t, db), outboxtest.CallStates(t, db.Read))
		}
		time.Sleep(keep / 4) // the reaper's next pass
	}
	if res, err := s.call(t, "order-p", invoiceIn{Customer: "purged", Cents: 2}); err != nil || res.IsError {
		t.Fatalf("the same key after its expiry: %v %s", err, outboxtest.Text(res))
	}
	if n := invoices(t, db); n != 2 {
		t.Errorf("invoices %d, want 2: a forgotten key runs its call again", n)
	}
}
