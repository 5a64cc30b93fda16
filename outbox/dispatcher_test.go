package outbox_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// The dispatcher's own tests live in package outbox/dispatch. The layer's
// tests here only need a dispatcher to see what a layer enqueued arrive.

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

// deliver runs a dispatcher to the fake payments API on the setup's clock
// until nothing it could deliver is pending.
func (s *dispatchSetup) deliver(t *testing.T) {
	t.Helper()
	u, _ := url.Parse(s.fake.URL())
	d, err := dispatch.New(s.db, &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "payments", URL: u}},
		Now:          s.clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.Drain(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
