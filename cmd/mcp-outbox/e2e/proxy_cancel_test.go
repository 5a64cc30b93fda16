package e2e

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestProxyCancelNonCooperating is the seed's scenario 1 (and 3a, over
// Streamable HTTP) through the proxy in front of an upstream that does not
// record its own outcome (the TypeScript and the Python one, told not to): the client times out on a charge that is still
// running, its SDK sends notifications/cancelled, and it retries.
//
// The TypeScript SDK server never answers a request it was told to cancel,
// as the spec allows. Had the proxy passed the cancel on, the charge would
// still have happened (a cancel cannot undo a side effect), its answer
// would never have come, and the retry would have been told "outcome
// unknown". The proxy keeps waiting instead, records the answer, and the
// retry, which joined the call, gets the charge.
//
// The Python SDK's server (mcp 1.x, the upstream's default environment)
// does answer a cancelled request ("Request cancelled"), which is no answer
// to the call either; mcp 2.3.0 does not answer it. Through either upstream
// the retry must get the charge.
func TestProxyCancelNonCooperating(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, func(t *testing.T, up upstreamKind) {
		t.Parallel()
		for _, id := range []scenario.ID{scenario.Timeout, scenario.HTTPSession} {
			for _, mode := range []scenario.Mode{scenario.LayerKey, scenario.LayerNoKey} {
				t.Run(string(id)+"/"+string(mode), func(t *testing.T) {
					t.Parallel()
					runCancelNonCooperating(t, up, id, mode)
				})
			}
		}
	})
}

func runCancelNonCooperating(t *testing.T, upKind upstreamKind, id scenario.ID, mode scenario.Mode) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var dbPath string
	srv := scenario.Server{
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
			up := upKind.command(t, db, "UPSTREAM_COOPERATE=0",
				"UPSTREAM_CHARGE_DELAY_MS="+strconv.FormatInt(delay.Milliseconds(), 10))
			args := []string{"proxy", "--db", db, "--log-level", "warn"}
			if http {
				args = append(args, "--http", "127.0.0.1:0")
			}
			args = append(append(args, "--", up.Path), up.Args[1:]...)
			cmd := exec.Command(bin, args...)
			cmd.Env, cmd.Dir = up.Env, up.Dir
			return cmd, nil
		},
		ChargeArgs:    map[string]any{"customer": "ada", "amount_cents": 4200},
		ChargeIDField: "chargeId",
		CountCharges:  `SELECT count(*) FROM charges`,
		SessionsOnly:  true,
	}
	cfg := scenario.Config{Binary: bin, Dir: t.TempDir(), Delay: testDelay, Timeout: testTimeout,
		ServerLog: testWriter{t}, Logf: t.Logf, Server: srv}
	res, err := scenario.Run(ctx, cfg, id, mode)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range res.Attempts {
		t.Logf("attempt %d: %s", i+1, a.What)
	}
	// The first attempt timed out while the charge ran, and the retry got
	// a charge: not an "outcome unknown" tool error.
	if err := res.Check(); err != nil {
		t.Fatal(err)
	}
	if res.Charges != 1 {
		t.Errorf("%d charges, want exactly 1", res.Charges)
	}
	db := openLedgerDB(t, dbPath)
	var chargeID int64
	if err := db.QueryRow(`SELECT id FROM charges`).Scan(&chargeID); err != nil {
		t.Fatal(err)
	}
	if last := res.Attempts[len(res.Attempts)-1]; last.ChargeID != chargeID {
		t.Errorf("the retry answered charge #%d, want #%d", last.ChargeID, chargeID)
	}
	if got := countRows(t, db, `SELECT count(*) FROM calls WHERE tool = 'charge' AND state = 'completed'`); got != 1 {
		t.Errorf("%d completed charge calls, want 1 (the upstream's answer recorded)", got)
	}
	if got := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'unknown'`); got != 0 {
		t.Errorf("%d unknown calls, want 0: the answer was not lost", got)
	}
}
