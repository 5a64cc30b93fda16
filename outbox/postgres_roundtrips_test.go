package outbox_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/netfault"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Across a network a call costs its round trips to PostgreSQL, so they
// are counted here, by a proxy between the layer and the server (issue
// 28): a fresh key's call is BEGIN with the claim, the handler's one
// statement, and the outcome with COMMIT (claim_tx_postgres.go,
// pipe_postgres.go); a replay is BEGIN with the claim's read, answered at
// once, and a ROLLBACK behind the answer. Through a driver that wraps
// pgx's, which must see every statement, nothing is pipelined: the claim
// commits on its own, and BEGIN, the fence, the outcome and COMMIT each
// take one.
func TestPostgres_RoundTripsPerCall(t *testing.T) {
	postgresOnly(t)
	for _, c := range []struct {
		name string
		opts *schema.Options
		// replay is what a replay sends in all; replayFirst, the round
		// trips before its answer.
		fresh, replay, replayFirst int64
	}{
		{"Pgx", nil, 3, 2, 1},
		{"WrappedDriver", &schema.Options{Driver: faultdb.NewPostgres(1).DriverName()}, 6, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, err := url.Parse(pgtest.Database(t))
			if err != nil {
				t.Fatal(err)
			}
			const delay = 20 * time.Millisecond
			p, err := netfault.Start(u.Host)
			if err != nil {
				t.Fatal(err)
			}
			p.SetDelay(delay, 0)
			t.Cleanup(func() { p.Close() })
			u.Host = p.Addr()
			r := newReplicaWith(t, u.String(), c.opts, nil)
			// idle: whatever a call sent behind its answer is done, so the
			// next call finds its pooled connection free.
			idle := func() { waitFor(t, func() bool { return r.db.Write.Stats().InUse == 0 }) }
			roundTrips := func(key string) (beforeAnswer, all int64) {
				idle()
				before := p.RoundTrips()
				if res := call(t, r.session, "pay", key, payIn{Amount: 1}); res.IsError {
					t.Fatalf("%s: %s", key, text(res))
				}
				beforeAnswer = p.RoundTrips() - before
				idle()
				return beforeAnswer, p.RoundTrips() - before
			}
			// The calls run one after another, so they share one pooled
			// connection; the first prepares the statements on it.
			roundTrips("warm")
			roundTrips("warm")
			if _, got := roundTrips("fresh"); got != c.fresh {
				t.Errorf("a fresh key's call took %d round trips, want %d", got, c.fresh)
			}
			first, all := roundTrips("fresh")
			if all != c.replay || first != c.replayFirst {
				t.Errorf("a replay took %d round trips, %d of them before its answer; want %d and %d", all, first, c.replay, c.replayFirst)
			}
		})
	}
}
