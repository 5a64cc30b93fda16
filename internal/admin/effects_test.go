package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func effectState(t *testing.T, db *schema.DB, key string) string {
	t.Helper()
	var s string
	if err := db.Read.QueryRow(`SELECT e.state FROM effects e JOIN calls c ON c.id = e.call_id WHERE c.key = $1`, key).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func effectID(t *testing.T, db *schema.DB, key string) int64 {
	t.Helper()
	return int64(count(t, db.Read, `SELECT e.id FROM effects e JOIN calls c ON c.id = e.call_id WHERE c.key = $1`, key))
}

// TestResolveEffect settles unknown effects by the typed outcome: delivered
// or retry (send again); any other outcome, and any effect not unknown or dead, is
// refused and nothing changes.
func TestResolveEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for i, key := range []string{"arrived", "lost", "pending"} {
		callCharge(t, b.session, key, 100+i)
	}
	settle(t, b.db, "arrived", "unknown", time.Now())
	settle(t, b.db, "lost", "unknown", time.Now())
	arrived, lost, pending := effectID(t, b.db, "arrived"), effectID(t, b.db, "lost"), effectID(t, b.db, "pending")

	for _, bad := range []admin.EffectOutcome{"", "resend", "Delivered"} {
		err := admin.ResolveEffect(ctx, b.db, arrived, bad)
		if !errors.Is(err, admin.ErrEffectOutcome) || !strings.Contains(err.Error(), `outcome "`+string(bad)+`"`) {
			t.Errorf("outcome %q: err = %v, want ErrEffectOutcome naming it", bad, err)
		}
	}
	if got := effectState(t, b.db, "arrived"); got != "unknown" {
		t.Fatalf("after refused outcomes: %s, want unknown", got)
	}
	if err := admin.ResolveEffect(ctx, b.db, arrived, admin.EffectDelivered); err != nil {
		t.Fatal(err)
	}
	if err := admin.ResolveEffect(ctx, b.db, lost, admin.EffectRetry); err != nil {
		t.Fatal(err)
	}
	if got := effectState(t, b.db, "arrived") + " " + effectState(t, b.db, "lost"); got != "delivered pending" {
		t.Errorf("resolved: %s, want delivered pending", got)
	}
	err := admin.ResolveEffect(ctx, b.db, pending, admin.EffectDelivered)
	if !errors.Is(err, admin.ErrNotResolvable) || !errors.Is(err, admin.ErrEffectState) || !strings.Contains(err.Error(), "is pending") {
		t.Errorf("resolving a pending effect: %v, want not resolvable, naming its state", err)
	}
	if err := admin.ResolveEffect(ctx, b.db, 999, admin.EffectDelivered); !errors.Is(err, admin.ErrNoEffect) {
		t.Errorf("resolving a missing effect: %v, want no such effect", err)
	}
}

// Purge with nil options purges now with the default retention: what is
// old enough goes, what is young stays.
func TestPurge_NilOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, key := range []string{"old", "young"} {
		callCharge(t, b.session, key, 100)
	}
	settle(t, b.db, "old", "delivered", time.Now().Add(-8*24*time.Hour))
	settle(t, b.db, "young", "delivered", time.Now())
	got, err := admin.Purge(context.Background(), b.db, nil)
	if err != nil || got != (admin.PurgeCounts{DeliveredEffects: 1}) {
		t.Errorf("purge with nil options: %+v, %v; want the old delivered effect", got, err)
	}
}
