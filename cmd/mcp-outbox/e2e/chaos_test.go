package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestChaosSoak makes CHAOS_CALLS logical charge calls (keyed and keyless,
// some whose real result is a tool error) from concurrent clients over
// stdio and Streamable HTTP, while a monkey SIGKILLs the serve processes
// and the downstream payments API and starts them again, the downstream
// drops answers after charging and answers 503 at random, and the clients
// time out. Every logical call is retried by its client until it gets its
// real result. Then, after a final `mcp-outbox drain`:
//
//   - every logical call got its real result, the same (charge id, or tool
//     error, and the layer's call id) on every answer;
//   - exactly one charges row per charged call, none for the others;
//   - no call left in_flight (or unknown);
//   - one effect per charge, delivered, with a distinct Idempotency-Key,
//     applied exactly once downstream.
//
// CHAOS_SEED (logged) replays the same plan, monkey and faults; the
// interleaving of processes is the machine's. `make chaos` runs 10,000 calls.
// TestChaosSoakPostgres runs the same soak on PostgreSQL.
func TestChaosSoak(t *testing.T) {
	t.Parallel()
	n := chaosEnvInt(t, "CHAOS_CALLS", 500)
	if testing.Short() && os.Getenv("CHAOS_CALLS") == "" {
		n = 100
	}
	runChaosSoak(t, n, chaosStore{db: filepath.Join(t.TempDir(), "ledger.db")})
}

// chaosStore is the database the soak's processes share.
type chaosStore struct {
	// db is what every process gets as --db: an SQLite file, or a
	// postgres:// URL.
	db string
	// pg is the PostgreSQL cluster db is on, which the monkey kills too;
	// nil on SQLite.
	pg *pgtest.Server
}

// runChaosSoak runs the soak of n logical calls on store and checks its
// end state.
func runChaosSoak(t *testing.T, n int, store chaosStore) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("chaos soak on %s: CHAOS_CALLS=%d CHAOS_SEED=%d", store.name(), n, seed)

	dir := t.TempDir()
	log, err := newChaosLog(filepath.Join(dir, "processes.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with CHAOS_SEED=%d CHAOS_CALLS=%d; the processes' log ends:\n%s", seed, n, log.tail(60))
		}
		log.close()
	})
	h := &chaosHarness{
		t: t, n: n, seed: seed, log: log, store: store,
		journal: filepath.Join(dir, "downstream.jsonl"),
	}
	h.soak()
	if n := h.stats.unexpectedN.Load(); n > 0 {
		// The bug the soak is for: say so first.
		t.Errorf("%d wrong answers; the first:\n  %s", n, strings.Join(h.stats.unexpected, "\n  "))
	}
	if h.cutShort {
		t.FailNow() // the soak said why; the end state would only repeat it
	}
	h.check()
}

func (s chaosStore) name() string {
	if s.pg != nil {
		return "PostgreSQL"
	}
	return "SQLite"
}

// chaosEnvInt reads a positive integer from the environment.
func chaosEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}

// The soak's knobs. The downstream's faults and the clients' timeouts are
// per request; the monkey's pauses set how often a process dies.
var (
	chaosFaultRates = chaosFaults{Unavailable: 0.06, Drop: 0.05, Reset: 0.02, Slow: 0.02, SlowDelay: 1500 * time.Millisecond}
	// The destination's timeout is below SlowDelay: a slow answer is lost.
	chaosDest         = ";timeout=1s"
	chaosClientTiming = chaosTiming{
		shortTimeoutP:   0.15,
		shortTimeoutMax: 60 * time.Millisecond,
		longTimeout:     20 * time.Second,
		perCall:         3 * time.Minute,
		reaskP:          0.2,
		switchP:         0.3,
		hedgeP:          0.1,
	}
	// Failpoints that only sleep: they widen the windows between a commit
	// and its answer, and between sending an effect and reading the
	// response, so that kills land in them more often.
	chaosFailpoints = "call.after_commit=sleep(2ms);dispatch.after_send=sleep(2ms)"
	// The claims' lease (--lease), short so that the monkey's freezes
	// outlast it: another process then takes a frozen owner's call over.
	chaosLease = time.Second
	// On PostgreSQL, the share of the monkey's turns that kill PostgreSQL
	// itself, and how long it stays down before it is started again (on
	// top of the half second or so pg_ctl takes to stop and start it).
	chaosPGKillP   = 0.15
	chaosPGDownMax = 300 * time.Millisecond
)

const (
	chaosMaxWrong       = 10 // wrong answers that end the soak early
	chaosCallsPerKill   = 10 // logical call i starts once the monkey has killed i/10 processes
	chaosStdioClients   = 2  // each with its own serve process
	chaosHTTPClients    = 3  // one stateful (2025-11-25), the others stateless (2026-07-28)
	chaosWorkersPerConn = 3  // concurrent logical calls per client
)

type chaosHarness struct {
	t                *testing.T
	n                int
	seed             uint64
	log              *chaosLog
	store            chaosStore
	journal          string
	calls            []chaosCall
	answers          [][]chaosAnswer
	stats            *chaosStats
	monkey           *chaosMonkey
	soakTime         time.Duration
	cutShort         bool // the soak ended before every logical call was made
	stdio            []*chaosStdioClient
	httpSrv          *chaosHTTPServer
	http             []*chaosHTTPClient
	downstreamStarts int
}

// soak runs the workload under the monkey, then stops every process.
func (h *chaosHarness) soak() {
	t := h.t
	h.calls = chaosPlan(h.n, h.seed)
	h.answers = make([][]chaosAnswer, h.n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if d, ok := t.Deadline(); ok {
		// Leave time for the drain and the checks.
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, d.Add(-90*time.Second))
		defer cancelDeadline()
	}
	h.stats = newChaosStats(cancel, chaosMaxWrong)

	ds, err := newChaosDownstream(h.log, h.journal, h.seed, chaosFaultRates)
	if err != nil {
		t.Fatal(err)
	}
	// Normally stopped below; these only matter when the test ends early.
	t.Cleanup(func() { ds.kill(context.Background()) })
	serve := chaosServe{
		binary: failpointBin, db: h.store.db, log: h.log,
		dest:  "payments=" + ds.URL() + chaosDest,
		env:   []string{failpoint.EnvVar + "=" + chaosFailpoints},
		lease: chaosLease,
	}
	// The HTTP server first: it creates the database, which the stdio
	// servers then open.
	h.httpSrv, err = newChaosHTTPServer(serve)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.httpSrv.close(context.Background()) })
	var clients []chaosClient
	for i := range chaosStdioClients {
		c := &chaosStdioClient{id: fmt.Sprintf("stdio-%d", i+1), serve: serve}
		t.Cleanup(c.close)
		h.stdio = append(h.stdio, c)
		clients = append(clients, c)
	}
	for i := range chaosHTTPClients {
		id, version := fmt.Sprintf("http-stateless-%d", i), ""
		if i == 0 {
			id, version = "http-stateful", statefulVersion
		}
		c := newChaosHTTPClient(id, version, h.httpSrv)
		h.http = append(h.http, c)
		clients = append(clients, c)
	}

	h.monkey = &chaosMonkey{
		rng: rand.New(rand.NewPCG(h.seed, 1)), log: h.log,
		stdio: h.stdio, http: h.httpSrv, downstream: ds,
		pauseMin: 5 * time.Millisecond, pauseMax: 80 * time.Millisecond,
		httpDownMax: 150 * time.Millisecond, downstreamDownMax: 50 * time.Millisecond,
		freezeMax: 2 * chaosLease, lease: chaosLease,
		pg: h.store.pg, pgKillP: chaosPGKillP, pgDownMax: chaosPGDownMax,
	}
	monkeyCtx, stopMonkey := context.WithCancel(ctx)
	monkeyErr := make(chan error, 1)
	go func() {
		err := h.monkey.run(monkeyCtx)
		if err != nil {
			cancel() // the clients would wait for a server that will not come
		}
		monkeyErr <- err
	}()

	start := time.Now()
	jobs := make(chan chaosCall)
	go func() {
		defer close(jobs)
		for _, c := range h.calls {
			if !h.monkey.waitKills(ctx, c.i/chaosCallsPerKill) {
				return
			}
			select {
			case jobs <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for ci, c := range clients {
		for w := range chaosWorkersPerConn {
			rng := rand.New(rand.NewPCG(h.seed, uint64(2+ci*chaosWorkersPerConn+w)))
			wg.Go(func() { chaosWorker(ctx, c, clients, jobs, h.answers, rng, chaosClientTiming, h.stats) })
		}
	}
	wg.Wait()
	h.soakTime = time.Since(start)
	// Only a monkey that failed, ten wrong answers or the test's timeout
	// end ctx before every worker is done.
	h.cutShort = ctx.Err() != nil
	stopMonkey()
	if err := <-monkeyErr; err != nil {
		t.Errorf("monkey: %v", err)
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		t.Errorf("the soak ran out of time after %s (the test's -timeout)", h.soakTime.Round(time.Millisecond))
	case h.cutShort && h.stats.unexpectedN.Load() >= chaosMaxWrong:
		t.Errorf("the soak stopped after %d wrong answers", chaosMaxWrong)
	}

	// Stop everything for good: SIGKILL, like the monkey.
	for _, c := range clients {
		c.close()
	}
	kctx, kcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer kcancel()
	if err := h.httpSrv.close(kctx); err != nil {
		t.Errorf("stop the HTTP server: %v", err)
	}
	if _, err := ds.kill(kctx); err != nil {
		t.Errorf("stop the downstream: %v", err)
	}
	ds.mu.Lock()
	h.downstreamStarts = int(ds.cfg.Incarnation)
	ds.mu.Unlock()
}
