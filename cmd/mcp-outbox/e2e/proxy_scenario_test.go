package e2e

import (
	"context"
	"database/sql"
	"errors"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestProxyScenarios runs the four seed scenarios (five runs: 1, 2, 3a, 3b
// and 4) through `mcp-outbox proxy --cooperating` in front of each upstream
// (TypeScript, Python), with a key and without one: each must end with
// exactly one row in the upstream's charges table, every answer naming it,
// and exactly one distinct Idempotency-Key applied at the downstream fake.
//
// Through the proxy:
//   - the server the scenarios start, kill and restart is the proxy, which
//     starts `node server.mjs` (`python server.py`) as its child; in
//     scenario 2 the SIGKILL hits the proxy while the upstream is inside the
//     charge, and the upstream then sees its stdin close and exits without
//     committing. The restarted proxy on the same file gets the retry and
//     takes the call over.
//   - the charge's slow work is UPSTREAM_CHARGE_DELAY_MS, which does not end
//     on cancellation: a timed-out original still tries to commit, and the
//     claim's fence (released when the client cancelled) rolls it back.
//   - scenario 3b: the proxy serves Streamable HTTP with sessions only, and
//     both upstreams speak up to 2025-11-25. The go-sdk client
//     asks for its default, the stateless 2026-07-28 (server/discover), and
//     falls back to initialize; it runs over a 2025-11-25 session, so its
//     notifications/cancelled does reach the proxy, as in 3a. It still is
//     what that client does against this sidecar, so it runs, but it proves
//     no more than 3a: there is no stateless path through the proxy yet.
//   - the bare mode is not run: the upstream alone would be it.
//
// The proxies of a run all exit before it counts; the effect a run's last
// proxy committed may not be delivered by then, so one more proxy on the
// same file (the sidecar as it would be restarted) delivers what is left.
func TestProxyScenarios(t *testing.T) {
	t.Parallel()
	// up.check skips, or fails, early without node or the Python venv.
	forEachUpstream(t, upstreamKinds, func(t *testing.T, up upstreamKind) {
		for _, sc := range scenario.All() {
			for _, mode := range []scenario.Mode{scenario.LayerKey, scenario.LayerNoKey} {
				t.Run(string(sc.ID)+"/"+string(mode), func(t *testing.T) {
					t.Parallel()
					runProxyScenario(t, up, sc, mode)
				})
			}
		}
	})
}

func runProxyScenario(t *testing.T, up upstreamKind, sc scenario.Scenario, mode scenario.Mode) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fake := downstream.Start(t, nil)
	var dbPath string
	srv := scenario.Server{
		// The outbox tables exist before the upstream starts, as the
		// contract requires (the upstream refuses a file without them).
		Prepare: func(ctx context.Context, db string) error {
			dbPath = db
			sdb, err := schema.Open(ctx, db, nil)
			if err != nil {
				return err
			}
			return sdb.Close()
		},
		Command: func(db string, mode scenario.Mode, delay time.Duration, http bool) (*exec.Cmd, error) {
			if mode == scenario.Bare {
				return nil, errors.New("no bare mode through the proxy")
			}
			return upstreamProxyCommand(t, up, db, fake, delay, http), nil
		},
		ChargeArgs:    map[string]any{"customer": "ada", "amount_cents": 4200},
		ChargeIDField: "chargeId",
		CountCharges:  `SELECT count(*) FROM charges`,
		SessionsOnly:  true,
	}
	cfg := scenario.Config{Binary: bin, Dir: t.TempDir(), Delay: testDelay, Timeout: testTimeout,
		ServerLog: testWriter{t}, Logf: t.Logf, Server: srv}
	res, err := scenario.Run(ctx, cfg, sc.ID, mode)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range res.Attempts {
		t.Logf("attempt %d: %s", i+1, a.What)
	}
	if len(res.Attempts) != sc.Calls {
		t.Fatalf("%d tools/call, want %d", len(res.Attempts), sc.Calls)
	}
	// The first attempt failed the way the scenario is about, and the
	// logical call ended with a charge: without that, one row proves
	// nothing.
	if err := res.Check(); err != nil {
		t.Fatal(err)
	}
	db := openLedgerDB(t, dbPath)
	if res.Charges != 1 {
		t.Errorf("%d charges in the upstream's table, want exactly 1", res.Charges)
	}
	var id int64
	if err := db.QueryRow(`SELECT id FROM charges ORDER BY id LIMIT 1`).Scan(&id); err != nil {
		t.Fatalf("read the charge: %v", err)
	}
	for i, a := range res.Attempts {
		if a.ChargeID != 0 && a.ChargeID != id {
			t.Errorf("attempt %d answered with charge #%d, want #%d", i+1, a.ChargeID, id)
		}
	}
	// In scenario 4 the original completed and was never cancelled: the
	// node's re-runs must be replays of it, not runs rolled back.
	if sc.ID == scenario.FrameworkRetry {
		for i, a := range res.Attempts[1:] {
			if !a.Replayed {
				t.Errorf("attempt %d: %s; want a replay", i+2, a.What)
			}
		}
	}

	deliverLeftovers(t, up, db, dbPath, fake)
	effects := wantExactlyOnce(t, db, fake, 1)
	if len(effects) == 1 {
		var named int64
		if err := db.QueryRow(`SELECT json_extract(CAST(body AS TEXT), '$.charge_id') FROM effects WHERE id = ?`, effects[0].id).Scan(&named); err != nil || named != id {
			t.Errorf("the effect names charge %d (%v), want %d", named, err, id)
		}
		t.Logf("1 charge (#%d), 1 effect delivered under key %s, %d request(s) downstream", id, effects[0].key, len(requestsFor(fake, effects[0].key)))
	}
}

// upstreamProxyCommand is `bin proxy --cooperating --dest payments=FAKE ...
// -- node server.mjs` (or `python server.py`: kind) on db, its upstream's
// charge taking delay, serving stdio, or Streamable HTTP on a free loopback
// port when http is set.
func upstreamProxyCommand(t *testing.T, kind upstreamKind, db string, fake *downstream.Server, delay time.Duration, http bool) *exec.Cmd {
	up := kind.command(t, db, "UPSTREAM_CHARGE_DELAY_MS="+strconv.FormatInt(delay.Milliseconds(), 10))
	args := []string{"proxy", "--db", db, "--cooperating", "--dest", paymentsDest(fake), "--log-level", "warn"}
	if http {
		args = append(args, "--http", "127.0.0.1:0")
	}
	args = append(args, "--", up.Path)
	args = append(args, up.Args[1:]...)
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = up.Env, up.Dir
	return cmd
}

// deliverLeftovers starts the proxy once more on the run's file and waits
// until its dispatcher has delivered every effect, then stops it (closing
// its stdin, as a client would).
func deliverLeftovers(t *testing.T, up upstreamKind, db *sql.DB, dbPath string, fake *downstream.Server) {
	t.Helper()
	cmd := upstreamProxyCommand(t, up, dbPath, fake, 0, false)
	cmd.Stderr = testWriter{t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("the delivering proxy: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("the delivering proxy did not exit within 30s of its stdin closing")
		}
	}()
	waitEffects(t, db, 1, 30*time.Second, "delivered")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fake.WaitIdle(ctx); err != nil {
		t.Fatalf("downstream: %v", err)
	}
}
