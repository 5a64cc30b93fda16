package outbox_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
)

// histogram returns the sample count and sum of the histogram series of
// name whose labels include want; it fails the test if there is none.
func histogram(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (uint64, float64) {
	t.Helper()
	return outboxtest.Histogram(t, g, name, want)
}

// waitingOnOriginal counts goroutines parked in the layer's wait for
// another attempt of their key. The wait has no other observable sign, and
// a duplicate must be in it before the original finishes to be a join
// rather than a replay.
func waitingOnOriginal() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "/outbox.waitFor[")
		}
		buf = make([]byte, 2*len(buf))
	}
}

func expectMetrics(t *testing.T, reg prometheus.Gatherer, want string, names ...string) {
	t.Helper()
	outboxtest.ExpectMetrics(t, reg, want, names...)
}

// Not parallel: waitingOnOriginal looks at every goroutine of the test
// binary, and parallel tests wait for the sequential ones to end.
func TestMetrics_CallOutcomes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := outbox.NewMetrics(reg)
	b := setup(t, &outbox.Options{Metrics: m}, nil)

	if res := callCharge(t, b.session, "k1", 100); res.IsError {
		t.Fatal(text(res))
	}
	if res := callCharge(t, b.session, "k1", 100); callMeta(res)["replayed"] != true {
		t.Fatalf("second call with k1 not replayed: %s", text(res))
	}
	if res := callCharge(t, b.session, "k1", 200); errorCode(res) != "key_conflict" {
		t.Fatalf("k1 with another amount: %s", text(res))
	}
	if res := call(t, b.session, "refund", "r1", map[string]any{"charge_id": 42}); !res.IsError {
		t.Fatalf("refund of a missing charge succeeded: %s", text(res))
	}
	if res := call(t, b.session, "charge", "bad", map[string]any{"amount": "abc"}); !res.IsError {
		t.Fatalf("charge with a string amount succeeded: %s", text(res))
	}

	// A duplicate that arrives while the original runs waits and joins it.
	g := addGate(b.layer, b.server)
	orig := make(chan error, 1)
	go func() {
		_, err := callErr(context.Background(), b.session, "gate", "g1", map[string]any{"n": 1})
		orig <- err
	}()
	<-g.started
	dup := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := callErr(context.Background(), connect(t, b.server), "gate", "g1", map[string]any{"n": 1})
		if err != nil {
			t.Error(err)
		}
		dup <- res
	}()
	waitFor(t, func() bool { return waitingOnOriginal() == 1 })
	close(g.release)
	if err := <-orig; err != nil {
		t.Fatal(err)
	}
	if res := <-dup; res == nil || callMeta(res)["replayed"] != true {
		t.Fatalf("duplicate of a running call: %v", res)
	}

	// One whose wait runs out gets in_progress. Same metrics, another layer.
	b2 := setup(t, &outbox.Options{Metrics: m, InFlightWait: time.Millisecond}, nil)
	g2 := addGate(b2.layer, b2.server)
	orig2 := make(chan error, 1)
	go func() {
		_, err := callErr(context.Background(), b2.session, "gate", "g2", map[string]any{"n": 2})
		orig2 <- err
	}()
	<-g2.started
	if res := call(t, connect(t, b2.server), "gate", "g2", map[string]any{"n": 2}); errorCode(res) != "in_progress" {
		t.Fatalf("duplicate past its wait: %s", text(res))
	}
	close(g2.release)
	if err := <-orig2; err != nil {
		t.Fatal(err)
	}

	expectMetrics(t, reg, `
# HELP mcp_outbox_calls_total Tool calls through the layer, by tool and outcome (executed, replayed, joined, conflict, in_progress, not_recorded, failed).
# TYPE mcp_outbox_calls_total counter
mcp_outbox_calls_total{outcome="conflict",tool="charge"} 1
mcp_outbox_calls_total{outcome="executed",tool="charge"} 1
mcp_outbox_calls_total{outcome="not_recorded",tool="charge"} 1
mcp_outbox_calls_total{outcome="replayed",tool="charge"} 1
mcp_outbox_calls_total{outcome="failed",tool="refund"} 1
mcp_outbox_calls_total{outcome="executed",tool="gate"} 2
mcp_outbox_calls_total{outcome="joined",tool="gate"} 1
mcp_outbox_calls_total{outcome="in_progress",tool="gate"} 1
`, "mcp_outbox_calls_total")

	// Every call is timed, whatever its outcome.
	for tool, want := range map[string]uint64{"charge": 4, "refund": 1, "gate": 4} {
		if n, _ := histogram(t, reg, "mcp_outbox_call_duration_seconds", map[string]string{"tool": tool}); n != want {
			t.Errorf("call_duration_seconds{tool=%q} count = %d, want %d", tool, n, want)
		}
	}
	// Commits that recorded an outcome: k1, r1 (failed), g1, g2.
	if n, sum := histogram(t, reg, "mcp_outbox_commit_batch_size", map[string]string{"kind": "calls"}); n != 4 || sum != 4 {
		t.Errorf("commit_batch_size{kind=calls} count, sum = %d, %v, want 4, 4", n, sum)
	}
}

// The age is measured from the effect's created_at, so it shows however
// long the effect has been waiting, across restarts and other processes.
func TestMetrics_OldestPendingAge(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 1, nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewDepthCollector(s.db))
	if _, err := s.db.Write.Exec(`UPDATE effects SET created_at = created_at - 90000`); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "mcp_outbox_oldest_pending_age_seconds" {
			if age := mf.GetMetric()[0].GetGauge().GetValue(); age < 90 || age > 3600 {
				t.Errorf("oldest pending age = %vs, want about 90s", age)
			}
			return
		}
	}
	t.Fatal("no mcp_outbox_oldest_pending_age_seconds")
}

// A nil *Metrics is a valid Options.Metrics (the dispatch tests run without one).
func TestMetrics_Nil(t *testing.T) {
	t.Parallel()
	var m *outbox.Metrics
	b := setup(t, &outbox.Options{Metrics: m}, nil)
	if res := callCharge(t, b.session, "n1", 1); res.IsError {
		t.Fatal(text(res))
	}
}

// Calls in state unknown are counted from the database at each scrape,
// whoever made them unknown; 0 is reported, not left out.
func TestMetrics_UnknownCalls(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewDepthCollector(db))
	const head = `
# HELP mcp_outbox_calls_unknown Calls in state unknown: forwarded, their outcome lost; each waits for an operator (mcp-outbox outbox resolve-call).
# TYPE mcp_outbox_calls_unknown gauge
`
	expectMetrics(t, reg, head+"mcp_outbox_calls_unknown 0\n", "mcp_outbox_calls_unknown")
	for i, state := range []string{"unknown", "unknown", "completed", "in_flight"} {
		if _, err := db.Write.Exec(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, created_at, expires_at, on_lost)
			VALUES ($1, 'local', $1, 'meta', 'charge', '', $2, 1, 2, 'unknown')`, "call-"+string(rune('a'+i)), state); err != nil {
			t.Fatal(err)
		}
	}
	expectMetrics(t, reg, head+"mcp_outbox_calls_unknown 2\n", "mcp_outbox_calls_unknown")
}
