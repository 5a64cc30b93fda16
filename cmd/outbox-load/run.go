package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

const usage = `Usage: outbox-load [--clients N] [--duration D] [--rounds N] [--replicas N] [--mcp-outbox PATH]

Measures, from outside, the layer on PostgreSQL against a bare go-sdk
server writing PostgreSQL one transaction per call, and one replica of
mcp-outbox serve against several on the same database. It starts its own
PostgreSQL cluster (initdb, fsync on) in a temporary directory, builds
mcp-outbox unless --mcp-outbox names a binary, and alternates the sides
round by round. Every side gets a fresh database.

Flags:
`

type config struct {
	clients  int
	duration time.Duration
	warmup   time.Duration
	rounds   int
	replicas int
	binary   string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("outbox-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	var cfg config
	fs.IntVar(&cfg.clients, "clients", 32, "concurrent clients, each with its own session")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time of each side in each round")
	fs.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unmeasured load before each measurement")
	fs.IntVar(&cfg.rounds, "rounds", 2, "alternating rounds")
	fs.IntVar(&cfg.replicas, "replicas", 3, "replicas of the last side")
	fs.StringVar(&cfg.binary, "mcp-outbox", "", "the mcp-outbox binary (default: go build ./cmd/mcp-outbox)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.clients < 1 || cfg.rounds < 1 || cfg.replicas < 1 || cfg.duration <= 0 {
		fmt.Fprintln(stderr, "outbox-load: --clients, --rounds, --replicas and --duration must be positive")
		return 2
	}
	rows, err := measure(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "outbox-load:", err)
		return 1
	}
	writeTable(stdout, cfg, rows)
	return 0
}

// side is one way of serving the charges.
type side struct {
	name     string
	replicas int
	command  func(db, addr string) *exec.Cmd
}

// result is one side's figures, summed over rounds.
type result struct {
	side      side
	calls     int
	errors    int
	elapsed   time.Duration
	latencies []time.Duration
	cpu       time.Duration // the servers' user+system time while measured
}

func measure(ctx context.Context, cfg config, logw io.Writer) ([]*result, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(logw, "outbox-load: "+format+"\n", a...) }
	dir, err := os.MkdirTemp("", "outbox-load-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if cfg.binary == "" {
		cfg.binary = filepath.Join(dir, "mcp-outbox")
		logf("building mcp-outbox")
		build := exec.CommandContext(ctx, "go", "build", "-o", cfg.binary, "./cmd/mcp-outbox")
		build.Stderr = logw
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("build mcp-outbox (run from the module's root, or give --mcp-outbox): %w", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf("starting PostgreSQL (fsync on)")
	pg, err := pgtest.StartDurable()
	if err != nil {
		return nil, err
	}
	defer pg.Stop()

	layer := func(db, addr string) *exec.Cmd {
		return exec.Command(cfg.binary, "serve", "--db", db, "--http", addr, "--log-level", "error")
	}
	sides := []side{
		{name: "bare go-sdk server, one transaction per call", replicas: 1, command: func(db, addr string) *exec.Cmd {
			return exec.Command(self, serveBareCommand, "--db", db, "--http", addr)
		}},
		{name: "layer, 1 replica", replicas: 1, command: layer},
	}
	if cfg.replicas > 1 {
		sides = append(sides, side{name: fmt.Sprintf("layer, %d replicas", cfg.replicas), replicas: cfg.replicas, command: layer})
	}
	results := make([]*result, len(sides))
	for i, s := range sides {
		results[i] = &result{side: s}
	}
	n := 0
	for round := range cfg.rounds {
		for i, s := range sides {
			n++
			db := fmt.Sprintf("load_%d", n)
			if err := createDatabase(ctx, pg.URL, db); err != nil {
				return nil, err
			}
			logf("round %d: %s", round+1, s.name)
			if err := runSide(ctx, cfg, s, pgtest.WithDatabase(pg.URL, db), results[i]); err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
		}
	}
	return results, nil
}

func createDatabase(ctx context.Context, url, name string) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "CREATE DATABASE "+name)
	return err
}

// runSide starts the side's servers, loads them for the warm-up and the
// measured time, and adds the figures to res.
func runSide(ctx context.Context, cfg config, s side, db string, res *result) error {
	var (
		procs []*exec.Cmd
		urls  []string
	)
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(os.Interrupt)
			_ = p.Wait()
		}
	}()
	for range s.replicas {
		cmd := s.command(db, "127.0.0.1:0")
		u, err := startServer(cmd)
		if err != nil {
			return err
		}
		procs = append(procs, cmd)
		urls = append(urls, u)
	}
	sessions, err := connect(ctx, urls, cfg.clients)
	if err != nil {
		return err
	}
	defer func() {
		for _, cs := range sessions {
			cs.Close()
		}
	}()
	if _, _, _, err := load(ctx, sessions, cfg.warmup); err != nil {
		return err
	}
	cpu0 := cpuOf(procs)
	start := time.Now()
	calls, errs, lat, err := load(ctx, sessions, cfg.duration)
	if err != nil {
		return err
	}
	res.elapsed += time.Since(start)
	res.cpu += cpuOf(procs) - cpu0
	res.calls += calls
	res.errors += errs
	res.latencies = append(res.latencies, lat...)
	return nil
}

// startServer starts cmd and returns the /mcp URL it prints on stderr.
func startServer(cmd *exec.Cmd) (string, error) {
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if _, u, ok := strings.Cut(sc.Text(), "serving MCP at "); ok {
				urls <- u
			}
		}
	}()
	select {
	case u := <-urls:
		return u, nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return "", fmt.Errorf("%s did not report its address", filepath.Base(cmd.Path))
	}
}

// connect opens clients sessions, spread round-robin over urls.
func connect(ctx context.Context, urls []string, clients int) ([]*mcp.ClientSession, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = clients
	hc := &http.Client{Transport: tr}
	client := mcp.NewClient(&mcp.Implementation{Name: "outbox-load", Version: "v0"}, nil)
	var sessions []*mcp.ClientSession
	for i := range clients {
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: urls[i%len(urls)], HTTPClient: hc, MaxRetries: -1}, nil)
		if err != nil {
			for _, s := range sessions {
				s.Close()
			}
			return nil, fmt.Errorf("connect: %w", err)
		}
		sessions = append(sessions, cs)
	}
	return sessions, nil
}

// load has every session call charge, one call at a time each, with a
// fresh key, for d.
func load(ctx context.Context, sessions []*mcp.ClientSession, d time.Duration) (calls, errs int, lat []time.Duration, err error) {
	deadline := time.Now().Add(d)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
	)
	for _, cs := range sessions {
		wg.Go(func() {
			var mine []time.Duration
			bad := 0
			for time.Now().Before(deadline) && ctx.Err() == nil {
				p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 100},
					Meta: mcp.Meta{"idempotencyKey": newKey()}}
				t0 := time.Now()
				res, cerr := cs.CallTool(ctx, p)
				took := time.Since(t0)
				if cerr != nil || res.IsError {
					bad++
					mu.Lock()
					if firstErr == nil && cerr != nil {
						firstErr = cerr
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, took)
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(lat) == 0 && firstErr != nil {
		return 0, errs, nil, firstErr
	}
	return len(lat), errs, lat, ctx.Err()
}

func newKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "load-" + hex.EncodeToString(b[:])
}

// cpuOf sums the user and system time of the processes (Linux /proc).
func cpuOf(procs []*exec.Cmd) time.Duration {
	var total time.Duration
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Process.Pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
	}
	return total
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func writeTable(w io.Writer, cfg config, rows []*result) {
	fmt.Fprintf(w, "outbox-load: %d clients over Streamable HTTP (stateless), %d rounds of %s per side, on %d CPUs, PostgreSQL with fsync on\n\n",
		cfg.clients, cfg.rounds, cfg.duration, runtime.NumCPU())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "side\tcalls/s\tvs bare\tp50\tp99\tserver CPU/call\terrors")
	base := 0.0
	for i, r := range rows {
		slices.Sort(r.latencies)
		rate := float64(r.calls) / r.elapsed.Seconds()
		if i == 0 {
			base = rate
		}
		cpu := time.Duration(0)
		if r.calls > 0 {
			cpu = r.cpu / time.Duration(r.calls)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.2fx\t%s\t%s\t%s\t%d\n", r.side.name, rate, rate/base,
			percentile(r.latencies, 0.5).Round(10*time.Microsecond), percentile(r.latencies, 0.99).Round(10*time.Microsecond),
			cpu.Round(time.Microsecond), r.errors)
	}
	tw.Flush()
}
