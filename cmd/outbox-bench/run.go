package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

const usage = `Usage: outbox-bench [--json] [--quick] [--only LIST] [--history N] [--rounds N] [--dir DIR]

Runs the seven measurements of mcp-outbox's performance targets, each next
to a baseline measured in the same run, with synchronous=FULL, and prints
figure, baseline, ratio, target and whether it is met:

  1  throughput of 32 concurrent callers, distinct keys: layer vs bare server
     (and vs a bare server with one transaction per call)
  2  median latency of one caller: layer vs bare server
  3  median latency of a replay vs a bare call (and that it writes nothing)
  4  effects delivered per second: dispatcher vs a bare http.Client
  5  start to first delivery with the history and 10,000 pending effects
  6  status lookup p99 with the history recorded
  7  peak RSS under target 1's load (and with the history)

The bare server is the same ledger charge tool on the go-sdk server without
the layer (each statement commits on its own), over the same in-memory
transports. The history (1,000,000 calls by default) is generated once into
a temporary directory and removed at the end. The machine's other work
shows in the figures: compare the ratios.

Flags:
`

// Config sizes a run.
type Config struct {
	Calls      int    `json:"calls"`      // charges per side and round, target 1 and 7
	Callers    int    `json:"callers"`    // concurrent callers, target 1
	Sequential int    `json:"sequential"` // charges (and replays) per side and round, targets 2 and 3
	Effects    int    `json:"effects"`    // effects per side and round, target 4
	History    int    `json:"history"`    // calls in the history, targets 5, 6 and 7
	Pending    int    `json:"pending"`    // pending effects in the history, target 5
	Lookups    int    `json:"lookups"`    // lookups per side and round, target 6
	Starts     int    `json:"starts"`     // starts per side, target 5
	Rounds     int    `json:"rounds"`     // alternating rounds of both sides
	Dir        string `json:"-"`
	// Only selects targets by number; nil means all.
	Only map[int]bool `json:"-"`
}

// wants reports whether any of the targets ids is selected.
func (c Config) wants(ids ...int) bool {
	if c.Only == nil {
		return true
	}
	for _, id := range ids {
		if c.Only[id] {
			return true
		}
	}
	return false
}

// parseOnly reads a list of target numbers such as "1,3".
func parseOnly(list string) (map[int]bool, error) {
	only := map[int]bool{}
	for _, f := range strings.Split(list, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || id < 1 || id > 7 {
			return nil, fmt.Errorf("--only %q: want target numbers from 1 to 7, separated by commas", list)
		}
		only[id] = true
	}
	return only, nil
}

func defaultConfig() Config {
	return Config{Calls: 2000, Callers: 32, Sequential: 1000, Effects: 4000, History: 1_000_000,
		Pending: 10_000, Lookups: 5000, Starts: 3, Rounds: 2}
}

// quickConfig is for checking that the program works, not for figures.
func quickConfig() Config {
	return Config{Calls: 64, Callers: 32, Sequential: 10, Effects: 40, History: 300,
		Pending: 20, Lookups: 50, Starts: 1, Rounds: 1}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("outbox-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	quick := fs.Bool("quick", false, "tiny sizes: checks that everything runs; the figures mean nothing")
	history := fs.Int("history", 0, "calls in the history (default 1,000,000; 300 with --quick)")
	rounds := fs.Int("rounds", 0, "alternating rounds of each comparison (default 2; 1 with --quick)")
	onlyList := fs.String("only", "", "run only these targets, e.g. 1,2 (default all)")
	dir := fs.String("dir", "", "where to make the temporary directory (default the system's)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbox-bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	cfg := defaultConfig()
	if *quick {
		cfg = quickConfig()
	}
	if *history > 0 {
		cfg.History = *history
		cfg.Pending = min(cfg.Pending, *history)
	}
	if *rounds > 0 {
		cfg.Rounds = *rounds
	}
	cfg.Dir = *dir
	if *onlyList != "" {
		only, err := parseOnly(*onlyList)
		if err != nil {
			fmt.Fprintf(stderr, "outbox-bench: %v\n", err)
			return 2
		}
		cfg.Only = only
	}

	rep, err := measure(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-bench: %v\n", err)
		return 1
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "outbox-bench: %v\n", err)
		return 1
	}
	return 0
}

// env is what the measurements share: the run's directory, sizes and log.
type env struct {
	dir  string
	cfg  Config
	logw io.Writer
}

// logf reports progress on stderr: stdout is for the report.
func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.logw, "outbox-bench: "+format+"\n", args...)
}

// measure runs every measurement. The ones on small databases come first,
// so that peak RSS (target 7) is read before the history is generated.
func measure(ctx context.Context, cfg Config, logw io.Writer) (*Report, error) {
	dir, err := os.MkdirTemp(cfg.Dir, "outbox-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e := &env{dir: dir, cfg: cfg, logw: logw}
	rep := &Report{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Config: cfg}
	add := func(rs ...Result) { rep.Results = append(rep.Results, rs...) }

	var r7 Result
	if cfg.wants(1, 7) {
		r1, r, err := e.measureConcurrent(ctx)
		if err != nil {
			return nil, fmt.Errorf("target 1: %w", err)
		}
		add(r1)
		r7 = r
	}
	if cfg.wants(2, 3) {
		r2, r3, err := e.measureSequential(ctx)
		if err != nil {
			return nil, fmt.Errorf("targets 2 and 3: %w", err)
		}
		add(r2, r3)
	}
	if cfg.wants(4) {
		r4, err := e.measureDelivery(ctx)
		if err != nil {
			return nil, fmt.Errorf("target 4: %w", err)
		}
		add(r4)
	}

	if cfg.wants(5, 6, 7) {
		e.logf("seeding %s calls with %s pending effects", group(int64(cfg.History)), group(int64(cfg.Pending)))
		big, err := e.seedHistory(ctx, "history.db", cfg.History, cfg.Pending)
		if err != nil {
			return nil, err
		}
		if cfg.wants(6) {
			r6, err := e.measureStatus(ctx, big)
			if err != nil {
				return nil, fmt.Errorf("target 6: %w", err)
			}
			add(r6)
		}
		if cfg.wants(5) {
			r5, err := e.measureStartup(ctx, big)
			if err != nil {
				return nil, fmt.Errorf("target 5: %w", err)
			}
			add(r5)
		}
		if cfg.wants(7) {
			if err := e.historyRSS(ctx, big, &r7); err != nil {
				return nil, fmt.Errorf("target 7: %w", err)
			}
		}
	}
	if cfg.wants(7) {
		add(r7)
	}
	rep.Results = slices.DeleteFunc(rep.Results, func(r Result) bool { return !cfg.wants(r.ID) })
	sort.Slice(rep.Results, func(i, j int) bool { return rep.Results[i].ID < rep.Results[j].ID })
	return rep, nil
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.Join(strings.Fields(v), " ")
				break
			}
		}
	}
	return m
}
