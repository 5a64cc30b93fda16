package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
)

// Generous margins: the first attempt must time out while the charge is in
// progress even on a loaded CI machine. The margin is wall time spent
// sleeping in the server, not CPU time.
const (
	testDelay   = time.Second
	testTimeout = 300 * time.Millisecond
)

// TestScenarios runs every scenario in every mode against the real binary:
// without the layer the duplicate must appear, with it there must be exactly
// one charge, with a key and without.
func TestScenarios(t *testing.T) {
	t.Parallel()
	for _, sc := range scenario.All() {
		for _, mode := range scenario.Modes() {
			t.Run(string(sc.ID)+"/"+string(mode), func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				cfg := scenario.Config{Binary: bin, Dir: t.TempDir(), Delay: testDelay, Timeout: testTimeout,
					ServerLog: testWriter{t}, Logf: t.Logf}
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
				checkScenarioPremise(t, sc.ID, res)
				if err := res.Check(); err != nil {
					t.Error(err)
				}
				checkScenarioCharges(t, sc.ID, mode, res)
			})
		}
	}
}

// checkScenarioPremise fails the test when the first attempt did not fail the way
// the scenario is about: then the count proves nothing.
func checkScenarioPremise(t *testing.T, id scenario.ID, res scenario.Result) {
	t.Helper()
	first := res.Attempts[0]
	switch id {
	case scenario.Timeout, scenario.HTTPSession, scenario.HTTPStateless:
		if !errors.Is(first.Err, context.DeadlineExceeded) {
			t.Fatalf("first attempt: %s; want a client timeout", first.What)
		}
		if first.ElapsedMS >= testDelay.Milliseconds() {
			t.Fatalf("first attempt took %dms, not less than the charge's %v", first.ElapsedMS, testDelay)
		}
	case scenario.Crash:
		if !scenario.ConnectionClosed(first.Err) {
			t.Fatalf("first attempt: %s; want the connection closed by the killed server", first.What)
		}
	case scenario.FrameworkRetry:
		for i, a := range res.Attempts[:len(res.Attempts)-1] {
			if a.Err != nil || a.ChargeID == 0 || a.NodeErr == nil {
				t.Fatalf("attempt %d: %s; want a charge, then the node failing", i+1, a.What)
			}
		}
	}
	last := res.Attempts[len(res.Attempts)-1]
	if last.Err != nil || last.ToolError != "" || last.ChargeID == 0 {
		t.Fatalf("last attempt: %s; want a charge", last.What)
	}
}

func checkScenarioCharges(t *testing.T, id scenario.ID, mode scenario.Mode, res scenario.Result) {
	t.Helper()
	if mode == scenario.Bare {
		want := 2
		if id == scenario.FrameworkRetry {
			want = 3
		}
		// The measured duplicates must reproduce, or the layer's 1 below
		// would prove nothing.
		if res.Charges < want || (id == scenario.FrameworkRetry && res.Charges != want) {
			t.Errorf("without the layer: %d charges, want %d", res.Charges, want)
		}
		return
	}
	if res.Charges != 1 {
		t.Errorf("with the layer (%s): %d charges, want exactly 1", mode, res.Charges)
	}
	// Every answer the client got names that one charge.
	for i, a := range res.Attempts {
		if a.ChargeID != 0 && a.ChargeID != 1 {
			t.Errorf("attempt %d answered with charge #%d, want #1", i+1, a.ChargeID)
		}
	}
	// Where the original is never cancelled, the retry must be a replay
	// of it, not a second run that happened to be rolled back.
	switch id {
	case scenario.HTTPStateless, scenario.FrameworkRetry:
		for i, a := range res.Attempts[1:] {
			if !a.Replayed {
				t.Errorf("attempt %d: %s; want a replay", i+2, a.What)
			}
		}
	}
}
