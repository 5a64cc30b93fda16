package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// A purge that store faults interrupt says so and deletes only what
// expired; purging again (as the reaper does at its next pass) finishes
// the work, and what still needs a dispatcher or an operator stays.
func TestFault_Reaper(t *testing.T) {
	t.Parallel()
	purges := faultdb.Contains("DELETE FROM effects WHERE id IN", "DELETE FROM calls WHERE id IN",
		"UPDATE calls SET state = 'unknown', owner = '', lease_until = 0 WHERE id IN")
	for _, kind := range faultdb.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			clk := &clock{t: start}
			// Seeds 1, 2, 5 and 6 fail one of the first two purge
			// statements, which every case runs.
			fb := faultSetup(t, []uint64{1, 2, 5, 6}[kind-1], 1, &outbox.Options{Now: clk.Now})
			for i, key := range []string{"delivered-old", "delivered-young", "cancelled-old", "pending", "dead", "unknown"} {
				callCharge(t, fb.session, key, 100+i)
			}
			settle(t, fb.db, "delivered-old", "delivered", start)
			settle(t, fb.db, "delivered-young", "delivered", start.Add(2*24*time.Hour))
			settle(t, fb.db, "cancelled-old", "cancelled", start)
			settle(t, fb.db, "dead", "dead", start)
			settle(t, fb.db, "unknown", "unknown", start)
			clk.Add(8 * 24 * time.Hour)
			callCharge(t, fb.session, "fresh", 999)
			settle(t, fb.db, "fresh", "delivered", clk.Now())

			fb.inj.Set(faultdb.Rule{Name: "purge", Stmt: purges, Kind: kind, Rate: 0.5})
			var total admin.PurgeCounts
			failed := 0
			for pass := 0; ; pass++ {
				if pass == 50 {
					t.Fatalf("purge did not finish in 50 passes")
				}
				c, err := admin.Purge(context.Background(), fb.db, &admin.PurgeOptions{Now: clk.Now()})
				total.Calls += c.Calls
				total.DeliveredEffects += c.DeliveredEffects
				total.CancelledEffects += c.CancelledEffects
				if err == nil {
					break
				}
				failed++
				if !strings.HasPrefix(err.Error(), "purge ") || !strings.Contains(err.Error(), fmt.Sprint(faultdb.Err(kind))) {
					t.Errorf("purge error %q: want what it purged and the database's error", err)
				}
			}
			fb.inj.Set()
			if failed == 0 || fb.inj.Faults("purge") != failed {
				t.Fatalf("%d purges failed, %d faults injected: want each fault to fail its purge", failed, fb.inj.Faults("purge"))
			}
			if want := (admin.PurgeCounts{Calls: 3, DeliveredEffects: 1, CancelledEffects: 1}); total != want {
				t.Errorf("purged in all %+v, want %+v", total, want)
			}
			if calls := keysOf(t, fb.db, `SELECT key FROM calls ORDER BY key`); calls != "[dead fresh pending unknown]" {
				t.Errorf("calls left: %s", calls)
			}
			effects := keysOf(t, fb.db, `SELECT e.state || ':' || coalesce(c.key, '-') FROM effects e LEFT JOIN calls c ON c.id = e.call_id ORDER BY e.id`)
			if want := "[delivered:- pending:pending dead:dead unknown:unknown delivered:fresh]"; effects != want {
				t.Errorf("effects left (state:call key): %s, want %s", effects, want)
			}
		})
	}
}
