package e2e

import (
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/history"
	"github.com/mcp-outbox/mcp-outbox/internal/nemesis"
	"github.com/mcp-outbox/mcp-outbox/internal/netfault"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// jepsenLease is the replicas' call lease: short, so that a pause outlasts
// it within a short run.
const jepsenLease = 3 * time.Second

func jepsenSeed(t *testing.T) uint64 {
	seed, err := nemesis.Seed()
	if err != nil {
		t.Fatalf("%s: %v", nemesis.EnvSeed, err)
	}
	t.Logf("seed %d (%s=%d replays this schedule)", seed, nemesis.EnvSeed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: rerun with %s=%d", seed, nemesis.EnvSeed, seed)
		}
	})
	return seed
}

// Three replicas on PostgreSQL, each through its own link (one netfault
// proxy), behind a round-robin front; the nemesis black-holes, resets and
// slows links (50 ms ± 20 ms each way), skews clocks by up to 2 minutes,
// pauses a replica past its lease, kills one and restarts PostgreSQL;
// faults may overlap on different replicas.
func TestJepsen_Postgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and three servers")
	}
	t.Parallel()
	seed := jepsenSeed(t)
	srv, err := pgtest.Start()
	if err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	t.Cleanup(func() { srv.Stop() })
	pgURL, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fake := downstream.Start(t, nil)

	const n = 3
	var (
		links    []*netfault.Proxy
		replicas []*jepsenReplica
	)
	for i := range n {
		link, err := netfault.Start(pgURL.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { link.Close() })
		links = append(links, link)
		u := *pgURL
		u.Host = link.Addr()
		r := &jepsenReplica{t: t, i: i, db: u.String(), clock: skewFile(t, i),
			args: append([]string{"--lease", jepsenLease.String(), "--in-flight-wait", "3s", "--dest", paymentsDest(fake, "timeout=2s")}, jepsenTaskArgs...)}
		r.start()
		replicas = append(replicas, r)
	}

	kinds := []nemesis.Kind{nemesis.Blackhole, nemesis.Reset, nemesis.Slow, nemesis.Skew, nemesis.Pause, nemesis.Kill, nemesis.RestartStore}
	faults := nemesis.Schedule(seed, time.Hour, nemesis.Options{Replicas: n, Kinds: kinds,
		Hold: 2 * time.Second, PauseHold: jepsenLease + time.Second, Gap: 1500 * time.Millisecond, MaxSkew: 2 * time.Minute, Overlap: 0.3})
	noop := func(nemesis.Fault) error { return nil }
	acts := nemesis.Actions{
		nemesis.Blackhole: {Do: func(f nemesis.Fault) error { links[f.Replica].Blackhole(); return nil }, Heal: func(f nemesis.Fault) error { links[f.Replica].Heal(); return nil }},
		nemesis.Reset:     {Do: func(f nemesis.Fault) error { links[f.Replica].Reset(); return nil }, Heal: noop},
		// 50 ms ± 20 ms one way: 30 ms plus up to 40 ms of jitter.
		nemesis.Slow: {Do: func(f nemesis.Fault) error {
			links[f.Replica].SetDelay(30*time.Millisecond, 40*time.Millisecond)
			return nil
		}, Heal: func(f nemesis.Fault) error { links[f.Replica].SetDelay(0, 0); return nil }},
		nemesis.Skew:         {Do: func(f nemesis.Fault) error { return replicas[f.Replica].skew(f.Skew) }, Heal: func(f nemesis.Fault) error { return replicas[f.Replica].skew(0) }},
		nemesis.Pause:        {Do: func(f nemesis.Fault) error { return replicas[f.Replica].signal(syscall.SIGSTOP) }, Heal: func(f nemesis.Fault) error { return replicas[f.Replica].signal(syscall.SIGCONT) }},
		nemesis.Kill:         {Do: func(f nemesis.Fault) error { return replicas[f.Replica].kill() }, Heal: func(f nemesis.Fault) error { replicas[f.Replica].start(); return nil }},
		nemesis.RestartStore: {Do: func(nemesis.Fault) error { return srv.Kill() }, Heal: func(nemesis.Fault) error { return srv.Restart() }},
	}
	c := &campaign{t: t, h: history.New(), front: jepsenFront(t, replicas), ops: jepsenOps(t, 300), clients: 6,
		callTimeout: 3 * time.Second, keyOf: map[int64]string{}, taskEvery: 4}
	c.diag = func() {
		if os.Getenv("MCP_OUTBOX_JEPSEN_DUMP") != "" {
			for _, r := range replicas {
				_ = r.signal(syscall.SIGQUIT) // its goroutines, on its stderr
			}
		}
		for _, q := range []string{
			`SELECT key, state, owner, lease_until - (extract(epoch from clock_timestamp())*1000)::bigint, attempts, coalesce(task_id,'') FROM calls WHERE state = 'in_flight'`,
			`SELECT pid, state, coalesce(wait_event_type,''), coalesce(wait_event,''), coalesce(now() - xact_start, '0')::text, left(query, 160) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`,
		} {
			rows, err := db.Query(q)
			if err != nil {
				t.Logf("diag: %v", err)
				continue
			}
			cols, _ := rows.Columns()
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				_ = rows.Scan(ptrs...)
				t.Logf("diag: %v", vals)
			}
			rows.Close()
		}
	}
	start := time.Now()
	count := c.play(faults, acts, len(kinds)*jepsenRounds(t))
	w := c.world(db, fake)
	c.check("PostgreSQL, 3 replicas", seed, w, count, kinds, time.Since(start))
}

// Two processes on one SQLite file behind the front: the nemesis pauses
// one past its lease, skews its clock by up to 2 minutes, and kills it; a
// skew may overlap a pause or a kill of the other process (never both
// processes out of service at once).
func TestJepsen_SQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers")
	}
	t.Parallel()
	seed := jepsenSeed(t)
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	fake := downstream.Start(t, nil)
	const n = 2
	var replicas []*jepsenReplica
	for i := range n {
		r := &jepsenReplica{t: t, i: i, db: dbPath, clock: skewFile(t, i),
			args: append([]string{"--lease", jepsenLease.String(), "--in-flight-wait", "3s", "--dest", paymentsDest(fake, "timeout=2s")}, jepsenTaskArgs...)}
		r.start()
		replicas = append(replicas, r)
	}
	kinds := []nemesis.Kind{nemesis.Skew, nemesis.Pause, nemesis.Kill}
	faults := nemesis.Schedule(seed, time.Hour, nemesis.Options{Replicas: n, Kinds: kinds,
		Hold: 2 * time.Second, PauseHold: jepsenLease + time.Second, Gap: 1500 * time.Millisecond, MaxSkew: 2 * time.Minute, Overlap: 0.3})
	acts := nemesis.Actions{
		nemesis.Skew:  {Do: func(f nemesis.Fault) error { return replicas[f.Replica].skew(f.Skew) }, Heal: func(f nemesis.Fault) error { return replicas[f.Replica].skew(0) }},
		nemesis.Pause: {Do: func(f nemesis.Fault) error { return replicas[f.Replica].signal(syscall.SIGSTOP) }, Heal: func(f nemesis.Fault) error { return replicas[f.Replica].signal(syscall.SIGCONT) }},
		nemesis.Kill:  {Do: func(f nemesis.Fault) error { return replicas[f.Replica].kill() }, Heal: func(f nemesis.Fault) error { replicas[f.Replica].start(); return nil }},
	}
	c := &campaign{t: t, h: history.New(), front: jepsenFront(t, replicas), ops: jepsenOps(t, 300), clients: 4,
		callTimeout: 2 * time.Second, keyOf: map[int64]string{}, taskEvery: 4}
	start := time.Now()
	count := c.play(faults, acts, len(kinds)*jepsenRounds(t))
	db := openLedgerDB(t, dbPath)
	w := c.world(db, fake)
	c.check("SQLite, 2 processes", seed, w, count, kinds, time.Since(start))
}

// The campaign's clock skew reaches the layer of a real serve process: a
// call made while its clock file says +2m is recorded two minutes ahead,
// and one made after the file says -2m, two minutes behind (the file is
// read again while the process runs).
func TestJepsen_ClockSkewReachesTheLayer(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	r := &jepsenReplica{t: t, db: dbPath, clock: skewFile(t, 0)}
	if err := r.skew(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	r.start()
	cs := connectHTTP(t, r.url, "", httpClient(t, ""))
	db := openLedgerDB(t, dbPath)
	createdAt := func(key string) time.Duration {
		var ms int64
		if err := db.QueryRow(`SELECT created_at FROM calls WHERE key = ?`, key).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		return time.Until(time.UnixMilli(ms)).Round(time.Minute)
	}
	mustSucceed(t, cs, chargeCall("k-ahead", 100))
	if got := createdAt("k-ahead"); got != 2*time.Minute {
		t.Fatalf("a call under +2m was recorded %v from now", got)
	}
	if err := r.skew(-2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	pollReplicas(t, 10*time.Second, "the process to read -2m", func() bool {
		key := "k-behind-" + strconv.FormatInt(time.Now().UnixNano(), 10)
		mustSucceed(t, cs, chargeCall(key, 100))
		return createdAt(key) == -2*time.Minute
	})
}
