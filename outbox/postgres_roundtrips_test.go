package outbox_test

import (
	"net/url"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/internal/netfault"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Across a network a call costs its round trips to PostgreSQL, so they
// are counted here, by a proxy between the layer and the server (issue
// 28): a fresh key's call is the claim, BEGIN with the fence, the
// handler's one statement, and the outcome with COMMIT (pipe_postgres.go);
// a replay is the claim's one statement. Through a driver that wraps
// pgx's, which must see every statement, nothing is pipelined: BEGIN, the
// fence, the outcome and COMMIT each take one.
func TestPostgres_RoundTripsPerCall(t *testing.T) {
	postgresOnly(t)
	for _, c := range []struct {
		name          string
		opts          *schema.Options
		fresh, replay int64
	}{
		{"Pgx", nil, 4, 1},
		{"WrappedDriver", &schema.Options{Driver: faultdb.NewPostgres(1).DriverName()}, 6, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, err := url.Parse(pgtest.Database(t))
			if err != nil {
				t.Fatal(err)
			}
			p, err := netfault.Start(u.Host)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			u.Host = p.Addr()
			r := newReplicaWith(t, u.String(), c.opts, nil)
			roundTrips := func(key string) int64 {
				before := p.RoundTrips()
				if res := call(t, r.session, "pay", key, payIn{Amount: 1}); res.IsError {
					t.Fatalf("%s: %s", key, text(res))
				}
				return p.RoundTrips() - before
			}
			// The calls run one after another, so they share one pooled
			// connection; the first prepares the statements on it.
			roundTrips("warm")
			roundTrips("warm")
			if got := roundTrips("fresh"); got != c.fresh {
				t.Errorf("a fresh key's call took %d round trips, want %d", got, c.fresh)
			}
			if got := roundTrips("fresh"); got != c.replay {
				t.Errorf("a replay took %d round trips, want %d", got, c.replay)
			}
		})
	}
}
