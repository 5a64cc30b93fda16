package admin_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
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

// TestForgetPrincipal_EffectsWithoutCall: a forget found effects only
// through their calls, so two kinds kept their bodies (plaintext on a
// database without a key file) after their principal was forgotten: those
// whose call the retention purge had removed, and those of a call that is
// not recorded (an idempotent tool's). Each effect now carries its
// principal (written with it, or given its call's when the call is
// deleted), and the forget finds them by it; another principal's stay.
func TestForgetPrincipal_EffectsWithoutCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	type in struct {
		Note string `json:"note"`
	}
	notify := func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in in) (*mcp.CallToolResult, any, error) {
		_, err := tx.Enqueue(ctx, outbox.Effect{Destination: "mail", Path: "/send", Body: []byte(in.Note)})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil, err
	}
	outbox.AddTool(l, s, &mcp.Tool{Name: "notify"}, notify, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "notify_idempotent", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, notify, nil)
	cs := outboxtest.Connect(t, s)
	for _, c := range []struct{ tool, key string }{
		{"notify", "purged"}, {"notify_idempotent", "never-recorded"},
	} {
		if res := outboxtest.Call(t, cs, c.tool, c.key, map[string]any{"note": "secret " + c.key}); res.IsError {
			t.Fatalf("%s: %v", c.tool, res)
		}
	}
	// Another principal's effect without a call, which the forget must leave.
	if _, err := db.Write.ExecContext(ctx, `INSERT INTO effects (principal, seq, destination, method, path, headers, body,
		idempotency_key, state, next_attempt_at, created_at, updated_at) VALUES ('user:bob', 1, 'mail', 'POST', '/send', '{}', $1, 'k-bob', 'pending', 0, 0, 0)`,
		[]byte("bob's")); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM effects WHERE call_id IS NULL`); n != 2 {
		t.Fatalf("%d effects without a call before the purge, want 2: the idempotent tool's and bob's", n)
	}
	// What the retention's purge of a call leaves: its delivered effect,
	// with call_id set NULL. Inserted as a cooperating upstream does,
	// without its principal: the call's delete gives it the call's.
	if _, err := db.Write.ExecContext(ctx, `UPDATE effects SET state = 'delivered', delivered_at = 1, response = $1, principal = NULL
		WHERE call_id IS NOT NULL`, []byte("receipt")); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write.ExecContext(ctx, `DELETE FROM calls`); err != nil {
		t.Fatal(err)
	}
	f, err := admin.ForgetPrincipal(ctx, db, "local", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.Effects != 2 || f.Unknown {
		t.Errorf("forget: %+v, want both of local's effects erased", f)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM effects WHERE principal = 'local'
		AND (body IS NOT NULL OR response IS NOT NULL OR state NOT IN ('delivered', 'cancelled'))`); n != 0 {
		t.Errorf("%d of local's effects kept a body or a response, or can still be sent", n)
	}
	if n := count(t, db.Read, `SELECT count(*) FROM effects WHERE principal = 'user:bob' AND body IS NOT NULL AND state = 'pending'`); n != 1 {
		t.Errorf("bob's effect: %d left as it was, want 1", n)
	}
	// A second forget finds the principal by its effects alone: known,
	// nothing more to erase.
	if f, err = admin.ForgetPrincipal(ctx, db, "local", time.Now()); err != nil || f.Unknown || f.Effects != 0 {
		t.Errorf("forget again: %+v, %v; want known, nothing erased", f, err)
	}
}
