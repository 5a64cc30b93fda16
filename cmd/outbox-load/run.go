package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const usage = `Usage: outbox-load [--store sqlite|postgres] [--clients 1,8,32,128] [--duration D] [--rounds N] [--quick]
       outbox-load --tasks [--store sqlite|postgres] [--clients 1,8] [--duration D] [--rounds N]

Measures mcp-outbox serve from outside, as a user's load arrives: the
servers are processes of their own, this process is the load (go-sdk
clients calling charge, each caller one call at a time, a fresh
_meta.idempotencyKey per call). Every cell of the plan measures, in
alternating rounds and each on a fresh database,

  limit     the same charge tool on a bare go-sdk server that keeps
            nothing, its HTTP routed exactly as serve routes it
  careful   the same bare server writing each charge in one transaction
            of its own: what a careful user writes without the layer
  expert    SQLite: the same bare server as an expert writes it, one
            writer goroutine committing every waiting call in one
            transaction (group commit), answering each after the commit
  pgx       PostgreSQL: the same bare server on pgxpool, three round
            trips per call (BEGIN; INSERT … RETURNING; the effect's
            INSERT and COMMIT in one batch)
  layer     mcp-outbox serve (one replica; on PostgreSQL also --replicas)

and prints calls per second, p50, p99 and the largest latency, and the servers' CPU
time and heap allocations per call. The plan: Streamable HTTP stateless
(2026-07-28) at each --clients level; then, at the level nearest 32, a
2025-11-25 session per client, calls without a key, and stdio with one
and with that many calls in flight on its one pipe (--quick skips those).

--store sqlite (the default) uses files in a temporary directory;
--store postgres starts a throwaway PostgreSQL cluster (initdb, fsync on)
and adds a side of --replicas replicas sharing one database. --rtt 0,1ms
puts a proxy between every server and PostgreSQL that delays each
direction by half the RTT, and measures each cell at each RTT; the proxy
counts the round trips per call (RT/call), and pg_stat_database the
commits per call (over the warm-up and the measured time, read once the
servers are gone).
mcp-outbox is built unless --mcp-outbox names a binary. Every server runs
with GOGC=400 (serve's default, which the bare servers share) unless
--gogc gives another value for all of them.

--tasks measures what an MCP task costs against a plain call (2026-07-28,
raw JSON-RPC over stateless Streamable HTTP): one mcp-outbox serve --task
charge=always per round, and at each --clients level (default 1,8) plain
charges (no tasks extension declared: the baseline), charges answered with
a CreateTaskResult (the task committed before the answer), and tasks/get
polls of the tasks so created. CPU/call counts serve alone, not PostgreSQL.

Flags:
`

type config struct {
	store     string
	levels    []int
	duration  time.Duration
	warmup    time.Duration
	rounds    int
	replicas  int
	quick     bool
	only      string
	gogc      string
	before    string
	serveArgs []string
	rtts      []time.Duration // PostgreSQL: the round-trip times put between servers and the database
	binary    string
	tasks     bool
	replay    bool
	// keyFile, with --encrypt, is the key file of the side "encrypted":
	// serve with --encryption-key-file, beside the layer without.
	keyFile string
	// profileDir, with --profile-dir, receives each server's CPU and
	// allocations profiles (profenv).
	profileDir string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("outbox-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	var cfg config
	levels := fs.String("clients", "1,8,32,128", "concurrency levels, comma-separated")
	fs.StringVar(&cfg.store, "store", "sqlite", "sqlite or postgres")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured time of each side in each round")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "unmeasured load before each measurement")
	fs.IntVar(&cfg.rounds, "rounds", 2, "alternating rounds")
	fs.IntVar(&cfg.replicas, "replicas", 3, "with --store postgres, the replicas of the last side (1: no such side)")
	fs.BoolVar(&cfg.quick, "quick", false, "only the HTTP stateless cells")
	serveArgs := fs.String("serve-args", "", "extra flags for every mcp-outbox serve, space-separated (e.g. \"--durability normal\")")
	fs.StringVar(&cfg.before, "before", "", "another mcp-outbox binary, measured as side \"before\" beside the layer (before and after a change)")
	fs.StringVar(&cfg.gogc, "gogc", "", "GOGC for every server (default: each server's own, which for serve and the bare servers alike is 400)")
	rtts := fs.String("rtt", "", "with --store postgres, round-trip times to put between every server and PostgreSQL, comma-separated (e.g. 0,1ms): each server then reaches it through a delaying proxy, which counts round trips per call")
	only := fs.String("sides", "", "measure only these sides, comma-separated (limit, careful, expert or pgx, layer, before, layer-xN; for profiling one)")
	fs.BoolVar(&cfg.tasks, "tasks", false, "measure MCP Tasks instead: plain charge vs a charge answered with a task, and tasks/get polls (default --clients 1,8)")
	fs.BoolVar(&cfg.replay, "replay", false, "add a cell of replays at each --clients level: each caller cycles through 16 keys, so every measured call is a replay")
	encrypt := fs.Bool("encrypt", false, "add the side \"encrypted\": mcp-outbox serve with --encryption-key-file (a fresh key), beside the layer without")
	fs.StringVar(&cfg.profileDir, "profile-dir", "", "write each server's CPU and allocations profiles, warm-up included, into this directory as cellN-SIDE-CLIENTSc-rROUND[-REPLICA].{cpu,allocs}.pprof (see go tool pprof)")
	fs.StringVar(&cfg.binary, "mcp-outbox", "", "the mcp-outbox binary (default: go build ./cmd/mcp-outbox)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg.only = *only
	cfg.serveArgs = strings.Fields(*serveArgs)
	if *encrypt {
		dir, err := os.MkdirTemp("", "outbox-load-keys")
		if err != nil {
			fmt.Fprintln(stderr, "outbox-load:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if cfg.keyFile, err = writeKeyFile(dir); err != nil {
			fmt.Fprintln(stderr, "outbox-load:", err)
			return 1
		}
	}
	var err error
	if cfg.levels, err = parseLevels(*levels); err != nil {
		fmt.Fprintln(stderr, "outbox-load:", err)
		return 2
	}
	if *rtts != "" {
		if cfg.rtts, err = parseRTTs(*rtts); err != nil {
			fmt.Fprintln(stderr, "outbox-load:", err)
			return 2
		}
		if cfg.store != "postgres" {
			fmt.Fprintln(stderr, "outbox-load: --rtt needs --store postgres")
			return 2
		}
	}
	if cfg.store != "sqlite" && cfg.store != "postgres" {
		fmt.Fprintf(stderr, "outbox-load: --store %q: want sqlite or postgres\n", cfg.store)
		return 2
	}
	if cfg.rounds < 1 || cfg.replicas < 1 || cfg.duration <= 0 || cfg.warmup < 0 {
		fmt.Fprintln(stderr, "outbox-load: --rounds, --replicas and --duration must be positive")
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbox-load: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if cfg.tasks {
		clientsGiven := false
		fs.Visit(func(f *flag.Flag) { clientsGiven = clientsGiven || f.Name == "clients" })
		if !clientsGiven {
			cfg.levels = []int{1, 8}
		}
		rep, err := measureTasks(ctx, cfg, "outbox-load "+strings.Join(args, " "), stderr)
		if err != nil {
			fmt.Fprintln(stderr, "outbox-load:", err)
			return 1
		}
		rep.write(stdout)
		return 0
	}
	rep, err := measure(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "outbox-load:", err)
		return 1
	}
	rep.write(stdout)
	return 0
}

// parseRTTs reads "0,1ms".
func parseRTTs(s string) ([]time.Duration, error) {
	var rtts []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "0" {
			rtts = append(rtts, 0)
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("--rtt: %q is not a duration", f)
		}
		rtts = append(rtts, d)
	}
	return rtts, nil
}

func measure(ctx context.Context, cfg config, logw io.Writer) (*report, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(logw, "outbox-load: "+format+"\n", a...) }
	dir, err := os.MkdirTemp("", "outbox-load-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if cfg.binary, err = buildOrGiven(ctx, cfg.binary, dir, logf, logw); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	st, stopStore, err := openStore(ctx, cfg.store, dir, logf)
	if err != nil {
		return nil, err
	}
	defer stopStore()
	sides := sidesFor(cfg, self)
	if cfg.only != "" {
		want := strings.Split(cfg.only, ",")
		sides = slices.DeleteFunc(sides, func(s side) bool { return !slices.Contains(want, s.short) })
		if len(sides) == 0 {
			return nil, fmt.Errorf("--sides %q names no side", cfg.only)
		}
	}
	rep := &report{cfg: cfg, sides: sides}
	if cfg.profileDir != "" {
		if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
			return nil, err
		}
	}
	for ci, c := range plan(cfg.levels, cfg.store, cfg.quick, cfg.replay, cfg.rtts) {
		row := &cellResult{cell: c, results: make([]*result, len(sides))}
		for i := range sides {
			row.results[i] = &result{}
		}
		rep.cells = append(rep.cells, row)
		for round := range cfg.rounds {
			for i, s := range sides {
				if s.replicas > 1 && c.transport == stdio {
					continue
				}
				logf("%s: round %d: %s", c, round+1, s.name)
				prof := ""
				if cfg.profileDir != "" {
					prof = filepath.Join(cfg.profileDir, fmt.Sprintf("cell%d-%s-%dc-r%d", ci+1, s.short, c.clients, round+1))
				}
				if err := runSide(ctx, cfg, st, c, s, row.results[i], prof); err != nil {
					return nil, fmt.Errorf("%s, %s: %w", c, s.name, err)
				}
			}
		}
	}
	return rep, nil
}

// buildOrGiven builds mcp-outbox into dir unless binary names one.
func buildOrGiven(ctx context.Context, binary, dir string, logf func(string, ...any), logw io.Writer) (string, error) {
	if binary != "" {
		return binary, nil
	}
	binary = filepath.Join(dir, "mcp-outbox")
	logf("building mcp-outbox")
	build := exec.CommandContext(ctx, "go", "build", "-o", binary, "./cmd/mcp-outbox")
	build.Stderr = logw
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("build mcp-outbox (run from the module's root, or give --mcp-outbox): %w", err)
	}
	return binary, nil
}

// sidesFor lists the sides: this binary re-run as the bare servers, and
// mcp-outbox serve.
func sidesFor(cfg config, self string) []side {
	bareMode := func(mode string) func(db, addr string) *exec.Cmd {
		return func(db, addr string) *exec.Cmd {
			args := []string{serveBareCommand, "--db", db, "--mode", mode}
			if addr != "" {
				args = append(args, "--http", addr)
			}
			return exec.Command(self, args...)
		}
	}
	bare := bareMode("tx")
	serveWith := func(binary string) func(db, addr string) *exec.Cmd {
		return func(db, addr string) *exec.Cmd {
			args := append([]string{"serve", "--db", db, "--log-level", "error"}, cfg.serveArgs...)
			if addr != "" {
				args = append(args, "--http", addr)
			}
			return exec.Command(binary, args...)
		}
	}
	layer := serveWith(cfg.binary)
	sides := []side{
		{name: "limit: bare go-sdk server, nothing kept", short: "limit", replicas: 1, role: roleLimit,
			command: func(_, addr string) *exec.Cmd { return bare("", addr) }},
		{name: "careful: bare go-sdk server, one transaction per call", short: "careful", replicas: 1, role: roleCareful, command: bare, needsDB: true},
	}
	if cfg.store == "postgres" {
		sides = append(sides, side{name: "pgx: bare go-sdk server on pgxpool, BEGIN / INSERT … RETURNING / the effect's INSERT and COMMIT in one batch",
			short: "pgx", replicas: 1, role: roleExpert, command: bareMode("pgx"), needsDB: true})
	} else {
		sides = append(sides, side{name: "expert: bare go-sdk server, one writer goroutine committing every waiting call in one transaction",
			short: "expert", replicas: 1, role: roleExpert, command: bareMode("group"), needsDB: true})
	}
	sides = append(sides,
		side{name: "layer: mcp-outbox serve", short: "layer", replicas: 1, role: roleLayer, command: layer, needsDB: true},
	)
	if cfg.keyFile != "" {
		encrypted := func(db, addr string) *exec.Cmd {
			cmd := layer(db, addr)
			cmd.Args = append(cmd.Args, "--encryption-key-file", cfg.keyFile)
			return cmd
		}
		sides = append(sides, side{name: "encrypted: mcp-outbox serve --encryption-key-file", short: "encrypted", replicas: 1,
			role: roleLayer, command: encrypted, needsDB: true})
	}
	if cfg.before != "" {
		sides = append(sides, side{name: "before: mcp-outbox serve of " + cfg.before, short: "before", replicas: 1,
			role: roleLayer, command: serveWith(cfg.before), needsDB: true})
	}
	if cfg.store == "postgres" && cfg.replicas > 1 {
		sides = append(sides, side{name: fmt.Sprintf("layer: %d replicas of serve, one database", cfg.replicas),
			short: fmt.Sprintf("layer-x%d", cfg.replicas), replicas: cfg.replicas, role: roleLayer, command: layer, needsDB: true})
	}
	return sides
}
