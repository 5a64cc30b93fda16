package dispatch_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// dispatchSetup is a ledger with n committed charges (n effects to
// "payments") and a fake payments API.
type dispatchSetup struct {
	*bundle
	fake *downstream.Server
	clk  *clock
}

func newDispatchSetup(t *testing.T, n int, fakeOpts *downstream.Options) *dispatchSetup {
	t.Helper()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now}, nil)
	for i := range n {
		if res := callCharge(t, b.session, fmt.Sprint("charge-", i), 100+i); res.IsError {
			t.Fatal(text(res))
		}
	}
	return &dispatchSetup{bundle: b, fake: downstream.Start(t, fakeOpts), clk: clk}
}

func (s *dispatchSetup) dispatcher(t *testing.T, dest dispatch.Destination, opts *dispatch.Options) *dispatch.Dispatcher {
	t.Helper()
	u, _ := url.Parse(s.fake.URL())
	dest.Name, dest.URL = "payments", u
	var o dispatch.Options
	if opts != nil {
		o = *opts
	}
	o.Destinations = []dispatch.Destination{dest}
	if o.Now == nil {
		o.Now = s.clk.Now
	}
	if o.Rand == nil {
		o.Rand = func() float64 { return 0.5 }
	}
	d, err := dispatch.New(s.db, &o)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func round(t *testing.T, d *dispatch.Dispatcher) {
	t.Helper()
	if err := d.RoundForTest(context.Background()); err != nil {
		t.Fatal(err)
	}
}

type effectState struct {
	state      string
	attempts   int
	next       int64
	lastStatus int
	lastError  string
	key        string
}

func effect(t *testing.T, db *sql.DB, id int) effectState {
	t.Helper()
	var e effectState
	err := db.QueryRow(`SELECT state, attempts, next_attempt_at, last_status, last_error, idempotency_key FROM effects WHERE id = $1`, id).
		Scan(&e.state, &e.attempts, &e.next, &e.lastStatus, &e.lastError, &e.key)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestDispatch_Delivers(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 3, nil)
	d := s.dispatcher(t, dispatch.Destination{AuthHeader: "Authorization", AuthValue: "Bearer sk_test"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Progress comes after the first round, then at most every 100 ms:
	// this drain is over long before a second report is due.
	var reports []opsquery.Counts
	c, err := d.Drain(ctx, func(c opsquery.Counts) { reports = append(reports, c) })
	if err != nil {
		t.Fatal(err)
	}
	if c.Delivered != 3 || c.Open() != 0 {
		t.Fatalf("counts after drain = %+v", c)
	}
	if len(reports) == 0 || reports[0].Total() != 3 {
		t.Errorf("progress reports %+v, want the first after the first round, counting the 3 effects", reports)
	}
	if got := len(s.fake.Applied()); got != 3 {
		t.Fatalf("applied = %d, want 3", got)
	}
	keys := map[string]bool{}
	for i := 1; i <= 3; i++ {
		keys[`"`+effect(t, s.db.Read, i).key+`"`] = true
	}
	for i, r := range s.fake.Requests() {
		if got := r.Header.Get("Idempotency-Key"); !keys[got] {
			t.Errorf("request %d Idempotency-Key = %s, want one effect's key as an sf-string", i, got)
		}
		delete(keys, r.Header.Get("Idempotency-Key"))
		if r.Header.Get("Authorization") != "Bearer sk_test" || r.Method != "POST" || r.Path != "/v1/charges" {
			t.Errorf("request %d: %s %s auth %q", i, r.Method, r.Path, r.Header.Get("Authorization"))
		}
	}
	st := status(t, s.session, map[string]any{"key": "charge-0"})
	if st.Effects[0].State != "delivered" || st.Effects[0].Attempts != 1 || st.Effects[0].LastStatus != 200 || st.Effects[0].DeliveredAt == nil {
		t.Errorf("status after delivery: %+v", st.Effects[0])
	}
}

func TestDispatch_RetriesKeepTheKey(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 1, nil)
	s.fake.FailNext(2, downstream.Status(503))
	d := s.dispatcher(t, dispatch.Destination{}, &dispatch.Options{BackoffBase: time.Second, BackoffMax: time.Minute})

	round(t, d)
	e := effect(t, s.db.Read, 1)
	// Rand is 0.5: 3/4 of the first delay, 1s.
	if want := s.clk.Now().Add(750 * time.Millisecond).UnixMilli(); e.state != "pending" || e.next != want || e.lastStatus != 503 {
		t.Fatalf("after a 503: %+v, want pending at +750ms", e)
	}
	round(t, d) // not due yet: nothing is sent
	if got := len(s.fake.Requests()); got != 1 {
		t.Fatalf("requests before the retry is due = %d, want 1", got)
	}
	s.clk.Add(time.Second)
	round(t, d)
	if e := effect(t, s.db.Read, 1); e.next != s.clk.Now().Add(1500*time.Millisecond).UnixMilli() {
		t.Errorf("second backoff: next in %dms, want 1500", e.next-s.clk.Now().UnixMilli())
	}
	s.clk.Add(2 * time.Second)
	round(t, d)
	if e := effect(t, s.db.Read, 1); e.state != "delivered" || e.attempts != 3 {
		t.Fatalf("after the retries: %+v", e)
	}
	if keys := s.fake.Keys(); len(keys) != 1 || len(s.fake.Requests()) != 3 || len(s.fake.Applied()) != 1 {
		t.Errorf("keys %v, requests %d, applied %d; want one key, 3 requests, 1 applied", keys, len(s.fake.Requests()), len(s.fake.Applied()))
	}
}

func TestDispatch_Classification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		fault     downstream.Fault
		state     string
		retryWait time.Duration // for pending: the wait before the next attempt
	}{
		{"RetryAfter", downstream.RetryAfter(429, "120"), "pending", 2 * time.Minute},
		{"Conflict", downstream.Status(409), "pending", 750 * time.Millisecond},
		{"RequestTimeout", downstream.Status(408), "pending", 750 * time.Millisecond},
		{"TooEarly", downstream.Status(425), "pending", 750 * time.Millisecond},
		{"BadGateway", downstream.Status(502), "pending", 750 * time.Millisecond},
		{"BadRequest", downstream.Status(400), "dead", 0},
		{"NotFound", downstream.Status(404), "dead", 0},
		{"Redirect", downstream.Status(307), "dead", 0},
		{"Reset", downstream.Reset(), "pending", 750 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newDispatchSetup(t, 1, nil)
			s.fake.FailNext(1, tc.fault)
			// Keep-alives off: net/http would resend a request with an
			// Idempotency-Key on its own after a reset of a reused connection.
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.DisableKeepAlives = true
			d := s.dispatcher(t, dispatch.Destination{}, &dispatch.Options{Transport: tr})
			round(t, d)
			e := effect(t, s.db.Read, 1)
			if e.state != tc.state {
				t.Fatalf("state = %s (%s), want %s", e.state, e.lastError, tc.state)
			}
			if tc.state == "pending" && e.next != s.clk.Now().Add(tc.retryWait).UnixMilli() {
				t.Errorf("next attempt in %dms, want %s", e.next-s.clk.Now().UnixMilli(), tc.retryWait)
			}
			if tc.state == "dead" && !strings.Contains(e.lastError, "refused") {
				t.Errorf("dead effect's error: %q", e.lastError)
			}
		})
	}
}

func TestDispatch_Limits(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 1, nil)
	s.fake.FailNext(5, downstream.Status(500))
	d := s.dispatcher(t, dispatch.Destination{MaxAttempts: 2}, nil)
	round(t, d)
	s.clk.Add(time.Hour)
	round(t, d)
	if e := effect(t, s.db.Read, 1); e.state != "dead" || !strings.Contains(e.lastError, "gave up after 2 attempts") {
		t.Fatalf("after the attempt limit: %+v", e)
	}

	s2 := newDispatchSetup(t, 1, nil)
	d2 := s2.dispatcher(t, dispatch.Destination{MaxAge: time.Minute}, nil)
	s2.clk.Add(2 * time.Minute)
	round(t, d2)
	if e := effect(t, s2.db.Read, 1); e.state != "dead" || !strings.Contains(e.lastError, "old") || len(s2.fake.Requests()) != 0 {
		t.Fatalf("past the age limit: %+v, %d requests", e, len(s2.fake.Requests()))
	}
}

// An expired owner cannot record its outcome: the effect's lease passed to
// another dispatcher, whose view wins.
func TestDispatch_LeaseFence(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 1, nil)
	release := make(chan struct{})
	s.fake.FailNext(1, downstream.Hold(release))
	a := s.dispatcher(t, dispatch.Destination{}, nil)
	b := s.dispatcher(t, dispatch.Destination{}, nil)

	aDone := make(chan error, 1)
	go func() { aDone <- a.RoundForTest(context.Background()) }()
	if err := s.fake.WaitRequests(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	// A's lease expires while its request is held.
	if _, err := s.db.Write.Exec(`UPDATE effects SET lease_until = 0`); err != nil {
		t.Fatal(err)
	}
	round(t, b) // reclaims, sends again with the same key: the fake says 409, in progress
	if e := effect(t, s.db.Read, 1); e.state != "pending" || e.lastStatus != 409 {
		t.Fatalf("after B's attempt: %+v", e)
	}
	close(release) // A gets its 200, but no longer holds the lease
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if e := effect(t, s.db.Read, 1); e.state != "pending" {
		t.Fatalf("the old owner recorded its outcome: %+v", e)
	}
	s.clk.Add(time.Minute)
	round(t, b)
	if e := effect(t, s.db.Read, 1); e.state != "delivered" {
		t.Fatalf("after B's retry: %+v", e)
	}
	if got := len(s.fake.Applied()); got != 1 {
		t.Errorf("applied = %d, want 1", got)
	}
}

func TestDispatch_AtMostOnce(t *testing.T) {
	t.Parallel()
	probe := &dispatch.Probe{Path: "/v1/idempotency/{key}"}
	t.Run("LostResponseIsUnknownUntilProbed", func(t *testing.T) {
		t.Parallel()
		s := newDispatchSetup(t, 1, &downstream.Options{NoDedup: true})
		s.fake.FailNext(1, downstream.AcceptThenClose().ForPath("/v1/charges"))
		d := s.dispatcher(t, dispatch.Destination{AtMostOnce: true, Probe: probe, Timeout: time.Second}, nil)
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "unknown" || !strings.Contains(e.lastError, "after the request was sent") {
			t.Fatalf("after a lost response: %+v", e)
		}
		round(t, d) // neither re-sent nor probed before the probe delay
		if got := s.fake.Count(effect(t, s.db.Read, 1).key); got != 1 {
			t.Fatalf("requests with the key = %d, want 1", got)
		}
		s.clk.Add(10 * time.Second)
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "delivered" || !strings.Contains(e.lastError, "probe") {
			t.Fatalf("after the probe: %+v", e)
		}
		if got := len(s.fake.Applied()); got != 1 {
			t.Errorf("applied = %d, want 1", got)
		}
	})
	t.Run("ProbeNotFoundSendsAgain", func(t *testing.T) {
		t.Parallel()
		s := newDispatchSetup(t, 1, &downstream.Options{NoDedup: true})
		s.fake.FailNext(1, downstream.Reset().ForPath("/v1/charges")) // read, then reset: not applied
		d := s.dispatcher(t, dispatch.Destination{AtMostOnce: true, Probe: probe, Timeout: time.Second}, nil)
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "unknown" {
			t.Fatalf("after a reset: %+v", e)
		}
		s.clk.Add(10 * time.Second)
		round(t, d) // probe: 404, so pending again
		round(t, d) // sent again
		if e := effect(t, s.db.Read, 1); e.state != "delivered" {
			t.Fatalf("after the probe and resend: %+v", e)
		}
		if got := len(s.fake.Applied()); got != 1 {
			t.Errorf("applied = %d, want 1", got)
		}
	})
	t.Run("WithoutProbeStaysUnknown", func(t *testing.T) {
		t.Parallel()
		s := newDispatchSetup(t, 1, &downstream.Options{NoDedup: true})
		s.fake.FailNext(1, downstream.AcceptThenClose())
		d := s.dispatcher(t, dispatch.Destination{AtMostOnce: true}, nil)
		round(t, d)
		s.clk.Add(time.Hour)
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "unknown" || len(s.fake.Requests()) != 1 {
			t.Fatalf("unknown effect: %+v after %d requests", e, len(s.fake.Requests()))
		}
		// An operator resolves it.
		if err := admin.ResolveEffect(context.Background(), s.db, 1, admin.EffectDelivered); err != nil {
			t.Fatal(err)
		}
		if e := effect(t, s.db.Read, 1); e.state != "delivered" {
			t.Fatalf("after resolve: %+v", e)
		}
	})
	t.Run("RefusedBeforeSendingIsRetried", func(t *testing.T) {
		t.Parallel()
		s := newDispatchSetup(t, 1, &downstream.Options{NoDedup: true})
		s.fake.Close() // connection refused: the request never left
		d := s.dispatcher(t, dispatch.Destination{AtMostOnce: true}, nil)
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "pending" || !strings.Contains(e.lastError, "not sent") {
			t.Fatalf("refused connection: %+v", e)
		}
	})
}

// Effects of one call go out in their order: the second waits for the first.
func TestDispatch_CallOrder(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	db := openDB(t)
	l, _ := outbox.New(db, &outbox.Options{Now: clk.Now})
	srv := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	outbox.AddTool(l, srv, &mcp.Tool{Name: "two"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
		for _, p := range []string{"/v1/first", "/v1/second"} {
			if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: "payments", Path: p}); err != nil {
				return nil, struct{}{}, err
			}
		}
		return nil, struct{}{}, nil
	}, nil)
	call(t, connect(t, srv), "two", "ordered", map[string]any{})
	s := &dispatchSetup{bundle: &bundle{db: db}, fake: downstream.Start(t, nil), clk: clk}
	s.fake.FailNext(1, downstream.Status(503).ForPath("/v1/first"))
	d := s.dispatcher(t, dispatch.Destination{}, nil)
	round(t, d)
	if reqs := s.fake.Requests(); len(reqs) != 1 || reqs[0].Path != "/v1/first" {
		t.Fatalf("first round sent %d requests, want only /v1/first", len(reqs))
	}
	s.clk.Add(time.Minute)
	round(t, d)
	round(t, d)
	var paths []string
	for _, r := range s.fake.Requests() {
		paths = append(paths, r.Path)
	}
	if strings.Join(paths, " ") != "/v1/first /v1/first /v1/second" {
		t.Errorf("delivery order: %v", paths)
	}
}

// A committed effect starts delivery at once, not at the next poll.
func TestDispatch_NotifyPicksUpPromptly(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 0, nil)
	d := s.dispatcher(t, dispatch.Destination{}, &dispatch.Options{PollInterval: time.Hour, Now: time.Now})
	s.layer.OnEnqueue(d.Notify)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	callCharge(t, s.session, "prompt", 1)
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := s.fake.WaitRequests(wctx, 1); err != nil {
		t.Fatalf("no delivery within 30s with a one-hour poll interval: %v", err)
	}
}

// On shutdown the dispatcher stops claiming, waits for attempts in flight
// up to its timeout, then cancels them and releases the effects.
func TestDispatch_ShutdownReleases(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 1, nil)
	s.fake.FailNext(1, downstream.Hang())
	d := s.dispatcher(t, dispatch.Destination{Timeout: time.Hour}, &dispatch.Options{ShutdownTimeout: 50 * time.Millisecond, Now: time.Now})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	if err := s.fake.WaitRequests(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if e := effect(t, s.db.Read, 1); e.state != "pending" {
		t.Fatalf("after shutdown: %+v, want pending for the next dispatcher", e)
	}
}

func TestDispatch_OperatorActions(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 2, nil)
	s.fake.FailNext(2, downstream.Status(400))
	d := s.dispatcher(t, dispatch.Destination{}, nil)
	round(t, d)
	ctx := context.Background()
	rows, err := opsquery.ListEffects(ctx, s.db, opsquery.EffectFilter{State: "dead"})
	if err != nil || len(rows) != 2 {
		t.Fatalf("dead effects: %v %v", rows, err)
	}
	if err := admin.CancelEffect(ctx, s.db, rows[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := admin.CancelEffect(ctx, s.db, rows[0].ID); err == nil {
		t.Error("cancelling a cancelled effect: want an error")
	}
	if err := admin.RetryEffect(ctx, s.db, 999); err == nil {
		t.Error("retrying a missing effect: want an error")
	}
	n, err := admin.RetryDead(ctx, s.db)
	if err != nil || n != 1 {
		t.Fatalf("retry dead: %d, %v", n, err)
	}
	s.clk.Add(time.Minute) // operator actions schedule by the wall clock
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := d.Drain(dctx, nil)
	if err != nil || c.Delivered != 1 || c.Cancelled != 1 {
		t.Fatalf("after retry: %+v %v", c, err)
	}
}

// A restart after a crash does not wait out the crashed dispatcher's lease:
// its process is gone, so its effects are reclaimed at once.
func TestDispatch_ReclaimsDeadOwnerAtOnce(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 1, nil)
	far := s.clk.Now().Add(time.Hour).UnixMilli()
	if _, err := s.db.Write.Exec(`UPDATE effects SET state = 'in_flight', lease_owner = $1, lease_until = $2, attempts = 1`,
		deadOwner(t), far); err != nil {
		t.Fatal(err)
	}
	d := s.dispatcher(t, dispatch.Destination{}, nil)
	if onPostgres() {
		// Replicas' owners are on other machines, or in containers
		// whose host names and pids /proc cannot vouch for: on
		// PostgreSQL only the lease decides, even for an owner that
		// looks dead from here.
		round(t, d)
		if e := effect(t, s.db.Read, 1); e.state != "in_flight" || len(s.fake.Requests()) != 0 {
			t.Fatalf("on PostgreSQL, an owner's lease was reclaimed before it passed: %+v", e)
		}
		// A new dispatcher: one reclaims at most once per poll interval.
		// Made before the clock moves: on PostgreSQL a dispatcher takes
		// the server's time when it starts, and then follows its clock.
		d = s.dispatcher(t, dispatch.Destination{}, nil)
		s.clk.Add(2 * time.Hour)
	}
	round(t, d) // reclaims
	round(t, d) // delivers
	if e := effect(t, s.db.Read, 1); e.state != "delivered" {
		t.Fatalf("effect of a dead dispatcher: %+v", e)
	}
	// A live owner's lease is respected.
	s2 := newDispatchSetup(t, 1, nil)
	if _, err := s2.db.Write.Exec(`UPDATE effects SET state = 'in_flight', lease_owner = 'elsewhere/1/1/ab#dispatch', lease_until = $1`, far); err != nil {
		t.Fatal(err)
	}
	round(t, s2.dispatcher(t, dispatch.Destination{}, nil))
	if e := effect(t, s2.db.Read, 1); e.state != "in_flight" || len(s2.fake.Requests()) != 0 {
		t.Fatalf("effect under another host's live lease: %+v", e)
	}
}

// heldTransport holds every response until release is closed.
type heldTransport struct{ release <-chan struct{} }

func (h heldTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	<-h.release
	return resp, err
}

// releaser returns a channel for heldTransport or downstream.Hold and
// the function that closes it, which also runs when the test ends, so
// that a failed test leaves no request held.
func releaser(t *testing.T) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return ch, release
}

// waitCtx bounds a wait of a test to 30 seconds.
func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// An unknown effect is probed by one dispatcher at a time: the probe takes
// it, so another dispatcher (another replica, another process on the
// file) whose round comes while the probe is out does not probe it too,
// and the answer is written to the effect as it was taken.
func TestDispatch_ProbeTakesTheEffect(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 0, &downstream.Options{NoDedup: true})
	insertEffects(t, s.db, 1)
	if _, err := s.db.Write.Exec(`UPDATE effects SET state = 'unknown', attempts = 1, send_started_at = 1`); err != nil {
		t.Fatal(err)
	}
	probe := &dispatch.Probe{Path: "/v1/idempotency/{key}"}
	release, closeRelease := releaser(t)
	a := s.dispatcher(t, dispatch.Destination{AtMostOnce: true, Probe: probe}, &dispatch.Options{Transport: heldTransport{release}})
	b := s.dispatcher(t, dispatch.Destination{AtMostOnce: true, Probe: probe}, nil)
	probes := func() int {
		n := 0
		for _, r := range s.fake.Requests() {
			if strings.HasPrefix(r.Path, "/v1/idempotency/") {
				n++
			}
		}
		return n
	}
	aDone := make(chan error, 1)
	go func() { aDone <- a.RoundForTest(context.Background()) }()
	if err := s.fake.WaitRequests(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	round(t, b) // A's probe is out
	if n := probes(); n != 1 {
		t.Fatalf("%d probes while the first was out, want 1", n)
	}
	closeRelease() // A learns the destination never got it, and sends it
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if e := effect(t, s.db.Read, 1); e.state != "delivered" || probes() != 1 || len(s.fake.Applied()) != 1 {
		t.Fatalf("after the probe: %+v, %d probes, %d applied; want delivered after one probe", e, probes(), len(s.fake.Applied()))
	}
}
