package admin_test

import (
	"context"
	"slices"
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
	f, err = admin.ForgetPrincipal(ctx, db, "tenant:acme/user:bob", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Calls != 1 || f.Unknown {
		t.Errorf("forget tenant:acme/user:bob: %+v, want its call erased", f)
	}
}
