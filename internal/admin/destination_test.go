package admin_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// The way out of a Start that refuses to run: the effects a layer
// enqueued for a name the dispatcher does not know (here the ledger's
// "payments", where the dispatcher is configured with "billing") are
// moved to the right name in one action, and the next Start runs and
// delivers them, keys unchanged. Bad input changes nothing.
func TestRetargetPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	db, l := b.db, b.layer
	for i, key := range []string{"r1", "r2", "r3"} {
		callCharge(t, b.session, key, 100+i)
	}
	settle(t, db, "r3", "dead", time.Now()) // not pending: stays where it is
	fake := downstream.Start(t, nil)
	u, _ := url.Parse(fake.URL())
	billing := &outbox.StartOptions{Dispatcher: &dispatch.Options{Destinations: []dispatch.Destination{{Name: "billing", URL: u}}}}
	_, err := l.Start(ctx, billing)
	if !errors.Is(err, outbox.ErrUnknownDestination) || !strings.Contains(err.Error(), "mcp-outbox outbox retarget --from payments --to NAME") {
		t.Fatalf("start with payments pending: %v; want it to name the retarget command", err)
	}

	for _, tc := range []struct{ from, to, want string }{
		{"", "billing", "give both destinations"},
		{"payments", "", "give both destinations"},
		{"payments", "payments", `from and to are both "payments"`},
		{"paymnets", "billing", "no pending effects"},
	} {
		if n, err := admin.RetargetPending(ctx, db, tc.from, tc.to); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("retarget %q to %q: %d, %v; want an error saying %q", tc.from, tc.to, n, err, tc.want)
		}
	}
	if n := count(t, db.Read, `SELECT count(*) FROM effects WHERE destination = 'payments'`); n != 3 {
		t.Fatalf("after refused retargets: %d effects for payments, want all 3", n)
	}
	keys := keysOf(t, db, `SELECT idempotency_key FROM effects WHERE state = 'pending' ORDER BY id`)

	n, err := admin.RetargetPending(ctx, db, "payments", "billing")
	if err != nil || n != 2 {
		t.Fatalf("retarget: %d, %v; want the 2 pending effects", n, err)
	}
	if got := keysOf(t, db, `SELECT idempotency_key FROM effects WHERE destination = 'billing' ORDER BY id`); got != keys {
		t.Errorf("retargeted keys %s, want %s unchanged", got, keys)
	}
	if got := keysOf(t, db, `SELECT state FROM effects WHERE destination = 'payments'`); got != "[dead]" {
		t.Errorf("left at payments: %s, want the dead one alone", got)
	}
	r, err := l.Start(ctx, billing)
	if err != nil {
		t.Fatalf("start after the retarget: %v", err)
	}
	t.Cleanup(func() { r.Stop(context.Background()) })
	if err := fake.WaitRequests(ctx, 2); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); count(t, db.Read, `SELECT count(*) FROM effects WHERE state = 'delivered'`) != 2; {
		if time.Now().After(deadline) {
			t.Fatal("the retargeted effects were not delivered within 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling the database with a deadline
	}
}

// CancelPending cancels one destination's pending effects, and nothing
// else; a name with none is ErrNoPending.
func TestCancelPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	for _, key := range []string{"c1", "c2", "c3"} {
		callCharge(t, b.session, key, 100)
	}
	settle(t, b.db, "c3", "dead", time.Now())
	if _, err := admin.CancelPending(ctx, b.db, "paymnets"); !errors.Is(err, admin.ErrNoPending) || !strings.Contains(err.Error(), `"paymnets"`) {
		t.Errorf("cancel a name with nothing pending: %v; want ErrNoPending naming it", err)
	}
	if _, err := admin.CancelPending(ctx, b.db, ""); err == nil {
		t.Error("cancel without a destination: no error")
	}
	n, err := admin.CancelPending(ctx, b.db, "payments")
	if err != nil || n != 2 {
		t.Fatalf("cancel: %d, %v; want the 2 pending effects", n, err)
	}
	if got := effectState(t, b.db, "c1") + " " + effectState(t, b.db, "c2") + " " + effectState(t, b.db, "c3"); got != "cancelled cancelled dead" {
		t.Errorf("after cancel: %s, want cancelled cancelled dead", got)
	}
}
