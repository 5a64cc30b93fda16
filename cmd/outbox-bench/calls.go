package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Measurements 1, 2, 3 and 7: the ledger's charge tool served by the bare
// go-sdk server (the same handler, each statement in autocommit, as
// ledger.RegisterBare writes it) and by the same server behind the outbox
// layer, over in-memory transports. Target 1 also measures a stricter bare
// server, one transaction per call (ledger.RegisterBareTransactional).

// side is which server serves the charges.
type side int

const (
	sideBare   side = iota // the go-sdk server, each statement committing on its own
	sideLayer              // the same server behind the outbox layer
	sideBareTx             // the go-sdk server, one transaction per call
)

func (s side) String() string {
	return [...]string{"bare", "layer", "bare, one transaction per call"}[s]
}

// server is one MCP server on its own database with connected clients.
type server struct {
	db       *schema.DB
	metrics  *prometheus.Registry // the layer's metrics; nil for a bare server
	sessions []*mcp.ClientSession
	closers  []func()
}

func (s *server) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// openLedger opens (creating) a database with the outbox and ledger tables.
func openLedger(ctx context.Context, path string) (*schema.DB, error) {
	db, err := schema.Open(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	if err := ledger.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// startServer serves the ledger on db, as side says, to clients in-memory
// clients.
func startServer(ctx context.Context, db *schema.DB, sd side, clients int) (*server, error) {
	s := &server{db: db}
	impl := &mcp.Implementation{Name: "outbox-bench", Version: "v0"}
	var srv *mcp.Server
	wrap := func(t mcp.Transport) mcp.Transport { return t }
	switch sd {
	case sideLayer:
		s.metrics = prometheus.NewRegistry()
		l, err := outbox.New(db, &outbox.Options{Metrics: outbox.NewMetrics(s.metrics)})
		if err != nil {
			return nil, err
		}
		srv = l.NewServer(impl, nil)
		ledger.Register(l, srv, nil)
		wrap = func(t mcp.Transport) mcp.Transport { return mcpstdio.NewTransport(t, nil) } // part of the layer: it lifts top-level params keys
	case sideBareTx:
		srv = mcp.NewServer(impl, nil)
		ledger.RegisterBareTransactional(db, srv, nil)
	default:
		srv = mcp.NewServer(impl, nil)
		ledger.RegisterBare(db, srv, nil)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "outbox-bench-client", Version: "v0"}, nil)
	for range clients {
		st, ct := mcp.NewInMemoryTransports()
		ss, err := srv.Connect(ctx, wrap(st), nil)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("connect server: %w", err)
		}
		cs, err := client.Connect(ctx, ct, nil)
		if err != nil {
			ss.Close()
			s.close()
			return nil, fmt.Errorf("connect client: %w", err)
		}
		s.sessions = append(s.sessions, cs)
		s.closers = append(s.closers, func() { cs.Close(); ss.Wait() })
	}
	return s, nil
}

// commitsOfCalls returns how many commits carried call outcomes, and how
// many outcomes they carried, from the layer's metrics.
func (s *server) commitsOfCalls() (commits uint64, calls float64) {
	if s.metrics == nil {
		return 0, 0
	}
	mfs, err := s.metrics.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "mcp_outbox_commit_batch_size" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == "calls" {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

// charge makes one charge under key (ignored by the bare server).
func charge(ctx context.Context, cs *mcp.ClientSession, key string) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge",
		Arguments: map[string]any{"amount": 100}, Meta: mcp.Meta{"idempotencyKey": key}})
	if err != nil {
		return err
	}
	if res.IsError {
		return fmt.Errorf("charge %s: tool error %v", key, res.Content)
	}
	return nil
}

// concurrentLoad makes n charges with distinct keys from one goroutine per
// session and returns calls per second.
func concurrentLoad(ctx context.Context, s *server, n int, prefix string) (float64, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(s.sessions))
	start := time.Now()
	for _, cs := range s.sessions {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				if err := charge(ctx, cs, fmt.Sprintf("%s-%d", prefix, i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// sequential times n charges made one after another, under key(i).
func sequential(ctx context.Context, cs *mcp.ClientSession, n int, key func(int) string) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		if err := charge(ctx, cs, key(i)); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// percentile returns the p-th percentile (0 < p <= 1) of d, which it sorts.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(float64(len(d))*p+0.5) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// measureConcurrent is target 1 (throughput with 32 callers) and target 7
// (peak RSS under that load). The sides alternate; each keeps its best
// round, and its highest peak.
func (e *env) measureConcurrent(ctx context.Context) (Result, Result, error) {
	var best [3]float64
	var peak [3]float64
	var commits uint64
	var committed float64
	for round := range e.cfg.Rounds {
		for _, sd := range []side{sideBare, sideLayer, sideBareTx} {
			i, name := int(sd), sd.String()
			e.logf("target 1: %d charges from %d callers, %s, round %d of %d", e.cfg.Calls, e.cfg.Callers, name, round+1, e.cfg.Rounds)
			db, err := openLedger(ctx, filepath.Join(e.dir, fmt.Sprintf("concurrent-%d-%d.db", sd, round)))
			if err != nil {
				return Result{}, Result{}, err
			}
			s, err := startServer(ctx, db, sd, e.cfg.Callers)
			if err != nil {
				db.Close()
				return Result{}, Result{}, err
			}
			resetPeak := resetPeakRSS()
			rate, err := concurrentLoad(ctx, s, e.cfg.Calls, fmt.Sprintf("c%d", round))
			mb, rssErr := peakRSS()
			n, calls := s.commitsOfCalls()
			commits, committed = commits+n, committed+calls
			s.close()
			db.Close()
			if err != nil {
				return Result{}, Result{}, fmt.Errorf("%s: %w", name, err)
			}
			best[i] = max(best[i], rate)
			if rssErr == nil && resetPeak == nil {
				peak[i] = max(peak[i], mb)
			}
		}
	}
	// The baseline is the careful bare server (one transaction, one fsync,
	// per call), the best a user writes without the layer; the one whose
	// statements commit each on their own is in the note.
	r1 := newResult(1, fmt.Sprintf("%d callers, distinct keys", e.cfg.Callers), "calls/s",
		best[sideLayer], best[sideBareTx], "bare server, 1 tx per call", AtLeastRatio(0.9))
	r1.Note = fmt.Sprintf("against a bare server whose two statements commit each on their own (two fsyncs per call): %s calls/s, ratio %s",
		group(int64(best[sideBare])), trim(best[sideLayer]/best[sideBare], 2)+"×")
	if commits > 0 {
		r1.Note += fmt.Sprintf("; group commit: %s calls per commit on average", trim(committed/float64(commits), 1))
	}
	r7 := newResult(7, fmt.Sprintf("peak RSS, %d callers", e.cfg.Callers), "MiB",
		peak[1], peak[0], "bare server", AtMost(60))
	if peak[1] == 0 {
		r7.Met = false
		r7.Note = "peak RSS not measured: /proc/self/clear_refs or VmHWM unavailable"
	}
	return r1, r7, nil
}

// measureSequential is target 2 (added median latency of one caller) and
// target 3 (a replay against a bare call).
func (e *env) measureSequential(ctx context.Context) (Result, Result, error) {
	commit, err := e.commitCost(ctx)
	if err != nil {
		return Result{}, Result{}, err
	}
	var lat [2][]time.Duration
	var replays []time.Duration
	wrote := false
	for round := range e.cfg.Rounds {
		for i, sd := range []side{sideBare, sideLayer} {
			name := sd.String()
			e.logf("targets 2 and 3: %d sequential charges, %s, round %d of %d", e.cfg.Sequential, name, round+1, e.cfg.Rounds)
			db, err := openLedger(ctx, filepath.Join(e.dir, fmt.Sprintf("sequential-%s-%d.db", name, round)))
			if err != nil {
				return Result{}, Result{}, err
			}
			s, err := startServer(ctx, db, sd, 1)
			if err != nil {
				db.Close()
				return Result{}, Result{}, err
			}
			d, err := sequential(ctx, s.sessions[0], e.cfg.Sequential, func(i int) string { return fmt.Sprintf("s%d-%d", round, i) })
			if err == nil && sd == sideLayer {
				var w bool
				var r []time.Duration
				r, w, err = replayCost(ctx, s, e.cfg.Sequential)
				replays, wrote = append(replays, r...), wrote || w
			}
			s.close()
			db.Close()
			if err != nil {
				return Result{}, Result{}, fmt.Errorf("%s: %w", name, err)
			}
			lat[i] = append(lat[i], d...)
		}
	}
	bare, layer := percentile(lat[0], 0.5), percentile(lat[1], 0.5)
	budget := commit + 50*time.Microsecond
	r2 := newResult(2, "1 caller, median latency", "µs", micros(layer), micros(bare), "bare server",
		Target{Of: "figure", Op: "<=", Value: micros(bare + budget)})
	r2.Target.Text = fmt.Sprintf("≤ bare + 1 commit (%s µs) + 50 µs", trim(micros(commit), 0))
	r2.Note = fmt.Sprintf("layer minus bare: %s µs; the bare charge commits each of its 2 statements on its own, the layer commits once",
		trim(micros(layer-bare), 0))

	r3 := newResult(3, "replay, median latency", "µs", micros(percentile(replays, 0.5)), micros(bare), "bare call", AtMostRatio(1.1))
	if wrote {
		r3.Met = false
		r3.Note = "replays wrote to the database"
	} else {
		r3.Note = "no write during the replays (PRAGMA data_version and the WAL's size unchanged)"
	}
	return r2, r3, nil
}

// replayCost records one call, then times n replays of it and reports
// whether anything was written meanwhile: another connection's
// data_version changes with every commit, and a write grows the WAL.
func replayCost(ctx context.Context, s *server, n int) ([]time.Duration, bool, error) {
	const key = "replayed"
	if err := charge(ctx, s.sessions[0], key); err != nil {
		return nil, false, err
	}
	conn, err := s.db.Read.Conn(ctx)
	if err != nil {
		return nil, false, err
	}
	defer conn.Close()
	version := func() (int64, int64, error) {
		var v int64
		if err := conn.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
			return 0, 0, err
		}
		fi, err := os.Stat(s.db.Path + "-wal")
		if err != nil {
			return 0, 0, err
		}
		return v, fi.Size(), nil
	}
	v0, w0, err := version()
	if err != nil {
		return nil, false, err
	}
	d, err := sequential(ctx, s.sessions[0], n, func(int) string { return key })
	if err != nil {
		return nil, false, err
	}
	v1, w1, err := version()
	if err != nil {
		return nil, false, err
	}
	return d, v0 != v1 || w0 != w1, nil
}

// commitCost is the median time of one small autocommit INSERT with
// synchronous=FULL, on a database of its own in the same directory.
func (e *env) commitCost(ctx context.Context) (time.Duration, error) {
	db, err := schema.Open(ctx, filepath.Join(e.dir, "commit.db"), nil)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if _, err := db.Write.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS bench_commit (id INTEGER PRIMARY KEY, v INTEGER)`); err != nil {
		return 0, err
	}
	n := max(e.cfg.Sequential/4, 10)
	d := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		if _, err := db.Write.ExecContext(ctx, `INSERT INTO bench_commit (v) VALUES ($1)`, i); err != nil {
			return 0, err
		}
		d = append(d, time.Since(start))
	}
	return percentile(d, 0.5), nil
}

// historyRSS repeats target 7's layer load on the history's database: the
// peak must stay under the target there too.
func (e *env) historyRSS(ctx context.Context, big *history, r7 *Result) error {
	e.logf("target 7: %d charges from %d callers, layer, on %s calls of history", e.cfg.Calls, e.cfg.Callers, group(int64(big.calls)))
	db, err := openLedger(ctx, big.path)
	if err != nil {
		return err
	}
	defer db.Close()
	s, err := startServer(ctx, db, sideLayer, e.cfg.Callers)
	if err != nil {
		return err
	}
	resetErr := resetPeakRSS()
	_, err = concurrentLoad(ctx, s, e.cfg.Calls, "rss")
	mb, rssErr := peakRSS()
	s.close()
	if err != nil {
		return err
	}
	if resetErr != nil || rssErr != nil {
		return nil // reported by the first measurement already
	}
	note := fmt.Sprintf("with %s calls of history: %s MiB", group(int64(big.calls)), trim(mb, 1))
	if r7.Note != "" {
		note = r7.Note + "; " + note
	}
	r7.Note = note
	if mb > r7.Target.Value {
		r7.Met = false
	}
	return nil
}
