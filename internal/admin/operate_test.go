package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// TestResolveCall settles unknown calls: completed and failed are replayed
// to a retry with the operator's note, rerun lets the retry run the call,
// and anything but an unknown call is refused naming its state.
func TestResolveCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	// A call whose outcome was lost, as a proxy leaves it: its row made
	// by a real charge (so that a retry's arguments match), then unknown.
	for i, key := range []string{"ran", "refused", "never-ran", "completed"} {
		callCharge(t, b.session, key, 100+i)
	}
	if _, err := b.db.Write.Exec(`UPDATE calls SET state = 'unknown', result = NULL, completed_at = NULL, on_lost = 'unknown'
		WHERE key IN ('ran', 'refused', 'never-ran')`); err != nil {
		t.Fatal(err)
	}
	unknown, err := opsquery.ListUnknownCalls(ctx, b.db, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 3 || unknown[0].Key != "ran" || unknown[0].Principal != "local" || unknown[0].Tool != "charge" ||
		unknown[0].Attempts != 1 || unknown[0].CallID == "" || unknown[0].CreatedAt.IsZero() {
		t.Fatalf("unknown calls: %+v", unknown)
	}
	if n, err := opsquery.CountUnknownCalls(ctx, b.db); err != nil || n != 3 {
		t.Errorf("CountUnknownCalls = %d, %v; want 3", n, err)
	}
	before := charges(t, b)

	for _, tc := range []struct {
		key     string
		outcome admin.CallOutcome
		err     error
		want    string
	}{
		{"nobody", admin.CallCompleted, admin.ErrNoCall, `call "nobody" of local: no such call`},
		{"completed", admin.CallRerun, admin.ErrCallNotUnknown, `call "completed" of local is completed`},
		{"ran", "done", admin.ErrCallOutcome, `outcome "done"`},
		{"ran", "", admin.ErrCallOutcome, `outcome ""`},
	} {
		err := admin.ResolveCall(ctx, b.db, admin.CallRef{Principal: "local", Key: tc.key}, admin.Resolution{Outcome: tc.outcome})
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resolve %s %q: err = %v, want %v containing %q", tc.key, tc.outcome, err, tc.err, tc.want)
		}
	}
	// Another principal's call of the same key is not this one.
	if err := admin.ResolveCall(ctx, b.db, admin.CallRef{Principal: "user:mallory", Key: "ran"}, admin.Resolution{Outcome: admin.CallRerun}); !errors.Is(err, admin.ErrNoCall) {
		t.Errorf("another principal: err = %v, want no such call", err)
	}

	if err := admin.ResolveCall(ctx, b.db, admin.CallRef{Principal: "local", Key: "ran"}, admin.Resolution{Outcome: admin.CallCompleted, Note: "charge ch_42 found at the processor"}); err != nil {
		t.Fatal(err)
	}
	if err := admin.ResolveCall(ctx, b.db, admin.CallRef{Principal: "local", Key: "refused"}, admin.Resolution{Outcome: admin.CallFailed}); err != nil {
		t.Fatal(err)
	}
	if err := admin.ResolveCall(ctx, b.db, admin.CallRef{Principal: "local", Key: "never-ran"}, admin.Resolution{Outcome: admin.CallRerun, Note: "not at the processor"}); err != nil {
		t.Fatal(err)
	}
	// Once resolved, a call is no longer unknown: resolving it again is refused.
	if err := admin.ResolveCall(ctx, b.db, admin.CallRef{Principal: "local", Key: "ran"}, admin.Resolution{Outcome: admin.CallFailed}); !errors.Is(err, admin.ErrCallNotUnknown) ||
		!strings.Contains(err.Error(), "is completed") {
		t.Errorf("resolving twice: err = %v", err)
	}

	st, err := query.Lookup(ctx, b.db, "local", "ran", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.State != query.Completed || st.CompletedAt == nil ||
		string(st.Result) != `{"content":[{"type":"text","text":"[resolved by an operator] charge ch_42 found at the processor"}]}` {
		t.Errorf("resolved as completed: %+v, result %s", st, st.Result)
	}
	res := callCharge(t, b.session, "ran", 100)
	if res.IsError || callMeta(res)["replayed"] != true || !strings.Contains(text(res), "[resolved by an operator] charge ch_42") {
		t.Errorf("retry of a call resolved as completed: %s %v", text(res), res.Meta)
	}
	res = callCharge(t, b.session, "refused", 101)
	if !res.IsError || !strings.Contains(text(res), "[resolved by an operator]") {
		t.Errorf("retry of a call resolved as failed: %s", text(res))
	}
	if got := charges(t, b); got != before {
		t.Errorf("%d charges after replaying resolved calls, want %d", got, before)
	}
	if st, _ := query.Lookup(ctx, b.db, "local", "never-ran", time.Now()); st.State != query.NotFound {
		t.Errorf("call resolved as rerun: %s, want not_found", st.State)
	}
	if res := callCharge(t, b.session, "never-ran", 102); res.IsError || callMeta(res)["replayed"] != false {
		t.Errorf("retry of a call resolved as rerun: %s %v", text(res), res.Meta)
	}
	if got := charges(t, b); got != before+1 {
		t.Errorf("%d charges, want %d: the call resolved as rerun runs on its retry", got, before+1)
	}
	if unknown, _ := opsquery.ListUnknownCalls(ctx, b.db, 10); len(unknown) != 0 {
		t.Errorf("unknown calls left: %+v", unknown)
	}
}

// A call resolved long after its key expired is remembered for its window
// again from the resolution, so that the client's retries replay it.
func TestResolveCall_RenewsAnExpiredKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	long := time.Now().Add(-72 * time.Hour).UnixMilli()
	if _, err := b.db.Write.Exec(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, created_at, expires_at, on_lost)
		VALUES ('call_old', 'local', 'old', 'meta', 'charge', '', 'unknown', $1, $2, 'unknown')`, long, long+3600000); err != nil {
		t.Fatal(err)
	}
	if st, _ := query.Lookup(ctx, b.db, "local", "old", time.Now()); st.State != query.OutcomeUnknown {
		t.Errorf("an unknown call past its key's expiry: %s, want unknown", st.State)
	}
	if err := admin.ResolveCall(ctx, b.db, admin.CallRef{Principal: "local", Key: "old"}, admin.Resolution{Outcome: admin.CallCompleted, Note: "done by hand"}); err != nil {
		t.Fatal(err)
	}
	st, err := query.Lookup(ctx, b.db, "local", "old", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.State != query.Completed || st.ExpiresAt.Sub(*st.CompletedAt) != time.Hour {
		t.Errorf("resolved: %s, completed %v, expires %v; want completed, remembered an hour from now", st.State, st.CompletedAt, st.ExpiresAt)
	}
}

// TestResolveCallUID names the call by its uid: a resolution for a call
// that was rerun cannot reach the next call with the same key, and errors
// name the uid, not the key.
func TestResolveCallUID(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	markUnknown := func() string {
		t.Helper()
		var uid string
		if err := b.db.Write.QueryRow(`UPDATE calls SET state = 'unknown', result = NULL, completed_at = NULL, on_lost = 'unknown'
			WHERE key = 'secret-key' RETURNING uid`).Scan(&uid); err != nil {
			t.Fatal(err)
		}
		return uid
	}
	callCharge(t, b.session, "secret-key", 100)
	old := markUnknown()
	if err := admin.ResolveCallUID(ctx, b.db, old, admin.Resolution{Outcome: admin.CallRerun}); err != nil {
		t.Fatal(err)
	}
	// The next call with the key runs, and is lost again: a new uid.
	callCharge(t, b.session, "secret-key", 100)
	newer := markUnknown()
	if newer == old {
		t.Fatalf("the new call has the old uid %s", old)
	}
	err := admin.ResolveCallUID(ctx, b.db, old, admin.Resolution{Outcome: admin.CallCompleted, Note: "meant for the old call"})
	if !errors.Is(err, admin.ErrNoCall) || !strings.Contains(err.Error(), old) || strings.Contains(err.Error(), "secret-key") {
		t.Errorf("resolving the rerun call again: %v, want no such call naming %s and not the key", err, old)
	}
	if st, _ := query.Lookup(ctx, b.db, "local", "secret-key", time.Now()); st.State != query.OutcomeUnknown {
		t.Errorf("the newer call is %s, want it still unknown", st.State)
	}
	if err := admin.ResolveCallUID(ctx, b.db, newer, admin.Resolution{Outcome: admin.CallFailed}); err != nil {
		t.Fatal(err)
	}
	if err := admin.ResolveCallUID(ctx, b.db, newer, admin.Resolution{Outcome: admin.CallRerun}); !errors.Is(err, admin.ErrCallNotUnknown) ||
		!strings.Contains(err.Error(), newer+" is failed") {
		t.Errorf("resolving twice: %v", err)
	}
}
