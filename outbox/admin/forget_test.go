package admin_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/admin"
)

// TestForgetPrincipal_Forms: the library takes a principal as an operator
// writes it, as the command and the admin API do. A user's bare ID used to
// match nothing (calls are recorded under "user:ID") and erase nothing,
// silently, as did a tenant's user given without the tenant; now the ID is
// read as the user's, and a principal the database never saw is reported
// as unknown, with the tenants' principals it may have meant.
func TestForgetPrincipal_Forms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t)
	ms := time.Now().UnixMilli()
	for i, p := range []string{"user:alice", "tenant:acme/user:bob"} {
		if _, err := db.Write.ExecContext(ctx, `INSERT INTO calls (id, uid, principal, key, key_source, tool, args_hash, state, result, created_at, completed_at, expires_at)
			VALUES ($1, $2, $3, 'k', 'meta', 'charge', 'h', 'completed', '{"content":[]}', $4, $4, $5)`,
			i+1, "call_"+p, p, ms, ms+3_600_000); err != nil {
			t.Fatal(err)
		}
	}
	f, err := admin.ForgetPrincipal(ctx, db, "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Principal != "user:alice" || f.Calls != 1 || f.Unknown {
		t.Errorf("forget alice: %+v, want user:alice's call erased", f)
	}
	f, err = admin.ForgetPrincipal(ctx, db, "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Calls != 0 || f.Unknown {
		t.Errorf("forget alice again: %+v, want nothing erased, and not unknown: the principal was forgotten", f)
	}
	f, err = admin.ForgetPrincipal(ctx, db, "bob", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Calls != 0 || !f.Unknown || !slices.Equal(f.Similar, []string{"tenant:acme/user:bob"}) {
		t.Errorf("forget bob: %+v, want unknown, similar to tenant:acme/user:bob", f)
	}
	// A typo in case: the stranger's "Alice" erased nothing and looked done.
	f, err = admin.ForgetPrincipal(ctx, db, "Alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Calls != 0 || !f.Unknown || !slices.Equal(f.Similar, []string{"user:alice"}) {
		t.Errorf("forget Alice: %+v, want unknown, similar to user:alice", f)
	}
	f, err = admin.ForgetPrincipal(ctx, db, "tenant:acme/user:bob", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Calls != 1 || f.Unknown {
		t.Errorf("forget tenant:acme/user:bob: %+v, want its call erased", f)
	}
}

// TestForgetPrincipal_ErasedEffectsStayUnsent: a retry of an effect whose
// principal was forgotten made it pending again, and the dispatcher sent
// its erased body as an empty request, which the destination accepted. No
// retry, resolve or retry of the dead makes one pending now, whatever
// state it was in, and after the purge took its call too.
func TestForgetPrincipal_ErasedEffectsStayUnsent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	keys := []string{"dead", "unknown", "cancelled", "pending"}
	for i, key := range keys {
		callCharge(t, b.session, key, 100+i)
		settle(t, b.db, key, key, time.Now())
	}
	f, err := admin.ForgetPrincipal(ctx, b.db, "local", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Effects != int64(len(keys)) {
		t.Fatalf("forget: %+v, want %d effects erased", f, len(keys))
	}
	ids := make([]int64, len(keys))
	for i, key := range keys {
		ids[i] = effectID(t, b.db, key)
	}
	try := func(when string) {
		t.Helper()
		for i, id := range ids {
			if err := admin.RetryEffect(ctx, b.db, id); !errors.Is(err, admin.ErrEffectErased) ||
				!strings.Contains(err.Error(), "forgotten") {
				t.Errorf("%s: retry of the %s effect: %v, want ErrEffectErased", when, keys[i], err)
			}
			if err := admin.ResolveEffect(ctx, b.db, id, admin.EffectRetry); err == nil {
				t.Errorf("%s: resolve retry of the %s effect: accepted", when, keys[i])
			}
		}
		if n, err := admin.RetryDead(ctx, b.db); n != 0 || err != nil {
			t.Errorf("%s: retry dead: %d, %v; want none", when, n, err)
		}
		if n := count(t, b.db.Read, `SELECT count(*) FROM effects WHERE state <> 'cancelled'`); n != 0 {
			t.Errorf("%s: %d effects not cancelled, want none", when, n)
		}
	}
	try("after the forget")
	// What the retention's purge of the calls leaves (ON DELETE SET NULL).
	if _, err := b.db.Write.ExecContext(ctx, `UPDATE effects SET call_id = NULL`); err != nil {
		t.Fatal(err)
	}
	try("after the calls went")
}
