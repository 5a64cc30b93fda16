package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/faultdb"
)

// Claims whose batch did not commit: the claim does not wait for its
// commit (see claim.go), so its attempt learns of the loss only at its
// handler's first statement, when it checks that the row still names it.

// A claim whose batch did not commit gives its row id back (AUTOINCREMENT
// only skips committed ids), and the next claim takes it. The attempt
// whose claim was lost must learn that its claim is gone, and its client
// that a retry runs the call: not that another attempt took the call over
// and has its outcome, which was another call's.
func TestFault_LostClaimRowReused(t *testing.T) {
	t.Parallel()
	fb := faultSetup(t, 1, 2, nil)
	g := addGate(fb.layer, fb.server)
	fb.inj.Set(faultdb.Rule{Name: "claim", Op: faultdb.Commit, Tx: claimsOnly, Kind: faultdb.IOErr, Rate: 1, Max: 1})

	resA := make(chan string, 1)
	go func() {
		r, err := callErr(context.Background(), fb.sessions[0], "gate", "lost", map[string]any{"n": 1})
		if err != nil {
			resA <- err.Error()
			return
		}
		resA <- errorCode(r) + ": " + text(r)
	}()
	<-g.started // A's claim was committed, and failed: A waits before its first statement
	if fb.inj.Faults("claim") != 1 {
		t.Fatalf("A's claim commit was not failed (%d picked)", fb.inj.Seen("claim"))
	}
	// B's claim takes the row id A's claim had.
	if res := callCharge(t, fb.sessions[1], "other", 5); res.IsError {
		t.Fatal(text(res))
	}
	close(g.release)
	got := <-resA
	if !strings.HasPrefix(got, "not_recorded: ") || !strings.Contains(got, "a retry runs it again") {
		t.Fatalf("attempt whose claim was lost: %s; want not_recorded, a retry runs it", got)
	}
	if r := call(t, fb.sessions[0], "gate", "lost", map[string]any{"n": 1}); r.IsError || callMeta(r)["replayed"] != false {
		t.Fatalf("retry: %v %s", r.Meta, text(r))
	}
	if got := charges(t, fb.bundle); got != 2 {
		t.Errorf("charges = %d, want 2 (B's and A's retry)", got)
	}
}

// A takeover whose batch did not commit leaves the row naming the attempt
// it took over from, which is not running. Nobody took the call from the
// attempt whose takeover was lost: its client must hear that a retry runs
// the call, not that another attempt has it.
func TestFault_LostTakeover(t *testing.T) {
	t.Parallel()
	fb := faultSetup(t, 1, 1, nil)
	canonical, _ := callkey.Canonical([]byte(`{"amount":100}`))
	now := time.Now().UnixMilli()
	_, err := fb.db.Write.Exec(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at)
		VALUES ('call_dead', 'local', 'left-behind', 'meta', 'charge', $1, 'in_flight', $2, $3, $4, $5)`,
		callkey.ArgsHash(canonical), deadOwner(t), now+time.Hour.Milliseconds(), now, now+time.Hour.Milliseconds())
	if err != nil {
		t.Fatal(err)
	}
	fb.inj.Set(faultdb.Rule{Name: "takeover", Op: faultdb.Commit, Tx: faultdb.Ran("UPDATE calls SET owner = $1, lease_until = $2"),
		Kind: faultdb.IOErr, Rate: 1, Max: 1})
	res := callCharge(t, fb.session, "left-behind", 100)
	if fb.inj.Faults("takeover") != 1 {
		t.Fatalf("the takeover's commit was not failed (%d picked)", fb.inj.Seen("takeover"))
	}
	if errorCode(res) != "not_recorded" || !strings.Contains(text(res), "a retry runs it again") {
		t.Fatalf("attempt whose takeover was lost: %v %s; want not_recorded, a retry runs it", res.Meta, text(res))
	}
	res = callCharge(t, fb.session, "left-behind", 100)
	if res.IsError || callMeta(res)["callId"] != "call_dead" || callMeta(res)["replayed"] != false {
		t.Fatalf("retry: %v %s", res.Meta, text(res))
	}
	if got := charges(t, fb.bundle); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}
