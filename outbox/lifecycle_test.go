package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// payments is the ledger's destination, delivered to fake.
func payments(fake *downstream.Server) *dispatch.Options {
	u, _ := url.Parse(fake.URL())
	return &dispatch.Options{Destinations: []dispatch.Destination{{Name: ledger.Destination, URL: u}}}
}

// start starts b's layer and stops it when the test ends, checking that
// Stop succeeds.
func start(t *testing.T, b *bundle, opts *outbox.StartOptions) *outbox.Runner {
	t.Helper()
	r, err := b.layer.Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return r
}

// waitFor polls cond until it holds, failing the test after 30 seconds.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// addEnqueueTool adds a tool that enqueues one effect to the destination
// its argument names, and answers the Enqueue's error as its own.
func addEnqueueTool(b *bundle) {
	type in struct{ Destination string }
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "enqueue", Description: "Enqueue an effect."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, any, error) {
			if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: in.Destination, Path: "/v1/things"}); err != nil {
				return nil, nil, err
			}
			return nil, map[string]any{"ok": true}, nil
		}, nil)
}

func TestLayer_OnEnqueueAddsCallbacks(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	first, second := make(chan struct{}, 1), make(chan struct{}, 1)
	b.layer.OnEnqueue(func() { first <- struct{}{} })
	b.layer.OnEnqueue(nil) // ignored, not a crash at the commit
	b.layer.OnEnqueue(func() { second <- struct{}{} })
	if res := callCharge(t, b.session, "both", 1); res.IsError {
		t.Fatal(text(res))
	}
	for name, ch := range map[string]chan struct{}{"first": first, "second": second} {
		select {
		case <-ch:
		default:
			t.Errorf("the %s callback did not fire on the commit that enqueued an effect", name)
		}
	}
}

// Start is all the wiring: an effect that a call commits reaches its
// destination with its Idempotency-Key, woken by the commit (the poll is
// an hour), and Stop returns with the outcome recorded.
func TestLayer_Start_Delivers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	fake := downstream.Start(t, nil)
	opts := payments(fake)
	opts.PollInterval = time.Hour
	r, err := b.layer.Start(context.Background(), &outbox.StartOptions{Dispatcher: opts})
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the dispatcher running", r.Running)
	if res := callCharge(t, b.session, "start-delivers", 7); res.IsError {
		t.Fatal(text(res))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fake.WaitRequests(ctx, 1); err != nil {
		t.Fatalf("no delivery: %v", err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if r.Running() {
		t.Error("Running after Stop")
	}
	var key, state string
	if err := b.db.Read.QueryRow(`SELECT idempotency_key, state FROM effects`).Scan(&key, &state); err != nil {
		t.Fatal(err)
	}
	if got := fake.Requests()[0].Key; got != key || state != "delivered" {
		t.Errorf("sent Idempotency-Key %q, effect's %q in state %q; want the effect's key, delivered", got, key, state)
	}
}

// Stop returns only once the dispatcher and the reaper have returned. Not
// parallel: it reads every goroutine's stack, and only the sequential
// tests of this package run meanwhile.
func TestLayer_Start_StopEndsGoroutines(t *testing.T) {
	b := setup(t, nil, nil)
	r, err := b.layer.Start(context.Background(), &outbox.StartOptions{Dispatcher: payments(downstream.Start(t, nil))})
	if err != nil {
		t.Fatal(err)
	}
	background := func() (dispatcher, reaper bool) {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		return strings.Contains(stacks, "dispatch.(*Dispatcher).Run("), strings.Contains(stacks, "outbox.runReaper(")
	}
	pollUntil(t, "the dispatcher and the reaper running", func() bool { d, r := background(); return d && r })
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d, r := background(); d || r {
		t.Errorf("after Stop: dispatcher running %v, reaper running %v", d, r)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// Stop with a context that ends cancels the deliveries in flight, says
// so, and still returns only after the dispatcher did.
func TestLayer_Start_StopCancelsDeliveriesInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	fake := downstream.Start(t, nil)
	fake.FailNext(1, downstream.Hang())
	opts := payments(fake)
	opts.Destinations[0].Timeout = time.Hour
	opts.ShutdownTimeout = time.Hour
	r, err := b.layer.Start(context.Background(), &outbox.StartOptions{Dispatcher: opts})
	if err != nil {
		t.Fatal(err)
	}
	if res := callCharge(t, b.session, "hangs", 1); res.IsError {
		t.Fatal(text(res))
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := fake.WaitRequests(wctx, 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "cancelled") {
		t.Errorf("Stop with an ended context: %v; want an error saying deliveries were cancelled", err)
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM effects WHERE state = 'pending'`); n != 1 {
		t.Errorf("%d pending effects after Stop; want the cancelled delivery pending again", n)
	}
}

// The reaper runs on the layer's clock: once the records are past their
// retention by that clock, a restart purges them at once.
func TestLayer_Start_Reaps(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now}, nil)
	fake := downstream.Start(t, nil)
	opts := &outbox.StartOptions{Dispatcher: payments(fake), ReapInterval: time.Hour}
	r, err := b.layer.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if res := callCharge(t, b.session, "reaped", 1); res.IsError {
		t.Fatal(text(res))
	}
	pollUntil(t, "delivery", func() bool {
		return count(t, b.db.Read, `SELECT count(*) FROM effects WHERE state = 'delivered'`) == 1
	})
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Add(defaults.DeliveredRetention + time.Minute)
	start(t, b, opts)
	pollUntil(t, "the reaper's first pass", func() bool {
		return count(t, b.db.Read, `SELECT count(*) FROM effects`)+count(t, b.db.Read, `SELECT count(*) FROM calls`) == 0
	})
}

func TestLayer_Start_Errors(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	fake := downstream.Start(t, nil)
	ctx := context.Background()

	// Before any Start the layer cannot know who delivers: a charge's
	// effect to payments is accepted, and left pending.
	if res := callCharge(t, b.session, "before-start", 1); res.IsError {
		t.Fatal(text(res))
	}
	for _, tc := range []struct {
		name string
		opts *outbox.StartOptions
		want string
	}{
		{"PendingForUnknown", nil, `effects are pending for destinations the dispatcher does not know: "payments" (1); the dispatcher knows none`},
		{"BothDispatcherAndNone", &outbox.StartOptions{Dispatcher: payments(fake), NoDispatcher: true}, "both Dispatcher and NoDispatcher"},
		{"NegativeInterval", &outbox.StartOptions{ReapInterval: -2}, "negative reap interval"},
		{"NegativeRetention", &outbox.StartOptions{Retention: outbox.Retention{Calls: -time.Hour}}, "negative duration"},
		{"BadDestination", &outbox.StartOptions{Dispatcher: &dispatch.Options{Destinations: []dispatch.Destination{{Name: "x"}}}},
			`start dispatcher: destination "x"`},
	} {
		r, err := b.layer.Start(ctx, tc.opts)
		if err == nil {
			r.Stop(ctx)
			t.Errorf("%s: started", tc.name)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want it to say %q", tc.name, err, tc.want)
		} else if tc.name == "PendingForUnknown" && !errors.Is(err, outbox.ErrUnknownDestination) {
			t.Errorf("%s: %v does not wrap ErrUnknownDestination", tc.name, err)
		}
	}
	// A failed Start leaves the layer as it was: unstarted, accepting any
	// destination.
	if res := callCharge(t, b.session, "after-failed-start", 2); res.IsError {
		t.Errorf("a charge after a failed Start: %s", text(res))
	}

	r := start(t, b, &outbox.StartOptions{Dispatcher: payments(fake)})
	if _, err := b.layer.Start(ctx, &outbox.StartOptions{Dispatcher: payments(fake)}); err == nil || !strings.Contains(err.Error(), "already started") {
		t.Errorf("second Start: %v; want already started", err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	start(t, b, &outbox.StartOptions{Dispatcher: payments(fake)}) // again after Stop
}

// Once Start runs a dispatcher, an Enqueue to another destination is the
// handler's error, naming the destination and the known ones, and nothing
// is enqueued; with NoDispatcher, or before Start, any name goes.
func TestLayer_Enqueue_ChecksDestination(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	addEnqueueTool(b)
	fake := downstream.Start(t, nil)
	enqueue := func(key, dest string) *mcp.CallToolResult {
		t.Helper()
		return call(t, b.session, "enqueue", key, map[string]any{"Destination": dest})
	}
	effects := func(dest string) int {
		return count(t, b.db.Read, `SELECT count(*) FROM effects WHERE destination = $1`, dest)
	}
	if res := enqueue("before", "anywhere"); res.IsError || effects("anywhere") != 1 {
		t.Errorf("before Start: %s, %d effects; want any destination accepted", text(res), effects("anywhere"))
	}

	u, _ := url.Parse(fake.URL())
	opts := payments(fake)
	opts.Destinations = append(opts.Destinations, dispatch.Destination{Name: "anywhere", URL: u})
	r, err := b.layer.Start(context.Background(), &outbox.StartOptions{Dispatcher: opts})
	if err != nil {
		t.Fatal(err)
	}
	// The handler returns Enqueue's error as it is: a fault, so the
	// client is told nothing was kept (the text, which names the
	// destination, is for the log: see TestLayer_Enqueue_ErrUnknownDestination),
	// and a retry after the fix runs the call.
	res := enqueue("typo", "paymnets")
	if !res.IsError || !strings.Contains(text(res), "nothing of this call was kept") || effects("paymnets") != 0 {
		t.Errorf("enqueue to a typo: %q, %d effects; want a fault, nothing enqueued", text(res), effects("paymnets"))
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = 'typo'`); n != 0 {
		t.Errorf("the call that enqueued to a typo left %d calls rows; want it unrecorded", n)
	}
	if res := enqueue("known", "payments"); res.IsError {
		t.Errorf("enqueue to a known destination: %s", text(res))
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	r = start(t, b, &outbox.StartOptions{NoDispatcher: true})
	if res := enqueue("elsewhere", "drained-elsewhere"); res.IsError || effects("drained-elsewhere") != 1 {
		t.Errorf("with NoDispatcher: %s, %d effects; want any destination accepted", text(res), effects("drained-elsewhere"))
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Another process delivers, and this one is told its destinations:
	// a typo fails here, where it is made.
	r = start(t, b, &outbox.StartOptions{NoDispatcher: true, KnownDestinations: []string{"payments", "anywhere", "payments"}})
	if got := fmt.Sprint(r.Destinations()); got != "[anywhere payments]" {
		t.Errorf("Runner.Destinations with KnownDestinations: %s, want [anywhere payments]", got)
	}
	res = enqueue("typo-elsewhere", "paymnets")
	if !res.IsError || !strings.Contains(text(res), "nothing of this call was kept") || effects("paymnets") != 0 {
		t.Errorf("enqueue to a typo with KnownDestinations: %q, %d effects; want a fault, nothing enqueued", text(res), effects("paymnets"))
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = 'typo-elsewhere'`); n != 0 {
		t.Errorf("the call that enqueued to a typo left %d calls rows; want it unrecorded", n)
	}
	if res := enqueue("known-elsewhere", "payments"); res.IsError {
		t.Errorf("enqueue to a known destination with KnownDestinations: %s", text(res))
	}
	for _, bad := range []*outbox.StartOptions{
		{KnownDestinations: []string{"payments"}},
		{NoDispatcher: true, KnownDestinations: []string{""}},
	} {
		if err := r.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r2, err := b.layer.Start(context.Background(), bad); err == nil {
			r2.Stop(context.Background())
			t.Errorf("Start(%+v) started", bad)
		}
	}
}

// The Enqueue error wraps ErrUnknownDestination for handlers that tell it
// apart.
func TestLayer_Enqueue_ErrUnknownDestination(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	got := make(chan error, 1)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "typo", Description: "Enqueue to a typo."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "mailr", Path: "/"})
			got <- err
			return nil, nil, err
		}, nil)
	start(t, b, &outbox.StartOptions{Dispatcher: payments(downstream.Start(t, nil))})
	call(t, b.session, "typo", "typo-1", map[string]any{})
	err := <-got
	if !errors.Is(err, outbox.ErrUnknownDestination) {
		t.Errorf("Enqueue: %v; want ErrUnknownDestination", err)
	}
	want := `unknown destination "mailr": this process's dispatcher delivers to "payments"; nothing was enqueued`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Enqueue: %v; want it to say %q", err, want)
	}
}

// ExampleLayer_Start's program gives the same output on the test store,
// PostgreSQL included: its SQL is portable.
func TestLayer_Start_ExampleOnTestStore(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if err := placeOrders(context.Background(), testTarget(t), &out); err != nil {
		t.Fatal(err)
	}
	want := `result map[order_id:1], replayed: false
result map[order_id:1], replayed: true
mail API got POST /v1/send {"order":1}, with the effect's Idempotency-Key: true
effect delivered, orders: 1
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// ExampleAddTool's program, which the README quotes, gives the same output
// on the test store, PostgreSQL included: its SQL is portable.
func TestExampleAddToolOnTestStore(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if err := billTwice(context.Background(), testTarget(t), &out); err != nil {
		t.Fatal(err)
	}
	want := `result map[invoice_id:1], replayed: false, noted: false
result map[invoice_id:1], replayed: true, noted: true
rejected: true, replayed: true
invalid: true, says: true
the mail API got {"invoice":1} once
invoices: 1
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// A layer whose Start was forgotten commits effects that nothing in its
// process delivers. That is right when another process runs the
// dispatcher, so it is no error; but the first such commit says so, once.
// A layer started, even with NoDispatcher (the choice made on purpose),
// says nothing.
func TestLayer_EnqueueWithoutStartIsLogged(t *testing.T) {
	t.Parallel()
	const msg = "effects were enqueued, and this process does not deliver them: the layer was not started " +
		"(Layer.Start runs the dispatcher); they stay pending until a dispatcher on this database runs " +
		"(Layer.Start, or mcp-outbox serve, proxy or drain with --dest)"
	var logs logBuffer
	b := setup(t, &outbox.Options{Logger: logs.logger()}, nil)
	callCharge(t, b.session, "unstarted-1", 100)
	callCharge(t, b.session, "unstarted-2", 200)
	if recs := logs.records(t, msg); len(recs) != 1 || recs[0]["level"] != "WARN" {
		t.Errorf("without Start: %d warnings %v, want one\nlog:\n%s", len(recs), recs, logs.String())
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM effects WHERE state = 'pending'`); n != 2 {
		t.Errorf("%d effects pending, want both calls' (the warning changes nothing)", n)
	}

	// A Start that failed leaves the layer unstarted: it still says so.
	var failed logBuffer
	b3 := setup(t, &outbox.Options{Logger: failed.logger()}, nil)
	noURL := &outbox.StartOptions{Dispatcher: &dispatch.Options{Destinations: []dispatch.Destination{{Name: "x"}}}}
	if _, err := b3.layer.Start(context.Background(), noURL); err == nil {
		t.Fatal("a bad Start started")
	}
	if outbox.Started(b3.layer) || b3.layer.Runner() != nil {
		t.Errorf("after a failed Start: Started %v, Runner %v; want neither", outbox.Started(b3.layer), b3.layer.Runner())
	}
	callCharge(t, b3.session, "failed-start-1", 100)
	if recs := failed.records(t, msg); len(recs) != 1 {
		t.Errorf("after a failed Start: %d warnings, want one\nlog:\n%s", len(recs), failed.String())
	}

	var quiet logBuffer
	b2 := setup(t, &outbox.Options{Logger: quiet.logger()}, nil)
	start(t, b2, &outbox.StartOptions{NoDispatcher: true, ReapInterval: outbox.ReaperOff})
	callCharge(t, b2.session, "elsewhere-1", 100)
	if recs := quiet.records(t, msg); len(recs) != 0 {
		t.Errorf("with NoDispatcher: %v, want no warning", recs)
	}
}

// A handler that wrote a row and then returns Enqueue's refusal of an
// unknown destination commits nothing of its call: not the row, not the
// effect, not the call's record; the client is told nothing was kept, and
// a retry once the name is fixed runs the call.
func TestLayer_Enqueue_UnknownDestinationKeepsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	u, _ := url.Parse(downstream.Start(t, nil).URL())
	start(t, b, &outbox.StartOptions{Dispatcher: &dispatch.Options{Destinations: []dispatch.Destination{{Name: "billing", URL: u}}}})
	res := callCharge(t, b.session, "charge-to-payments", 100) // the ledger enqueues to "payments"
	if !res.IsError || !strings.Contains(text(res), "nothing of this call was kept") {
		t.Errorf("charge with payments unknown: %q; want a fault saying nothing was kept", text(res))
	}
	for table, q := range map[string]string{
		"charges": `SELECT count(*) FROM charges`,
		"effects": `SELECT count(*) FROM effects`,
		"calls":   `SELECT count(*) FROM calls`,
	} {
		if n := count(t, b.db.Read, q); n != 0 {
			t.Errorf("%s: %d rows after the refused enqueue, want none", table, n)
		}
	}
}
