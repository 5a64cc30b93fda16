package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/scenario"
)

const demoUsage = `Usage: mcp-outbox demo [flags]

Reproduces the four ways one logical MCP tool call became several actual
calls in a measurement with the reference SDKs (2, 2, 2 and 3 charges), with
this binary's example ledger as the server and the go-sdk as the client:

  1   stdio: the client times out on a slow charge, then retries
  2   stdio: the server is killed mid-charge; the client restarts it, retries
  3a  Streamable HTTP with a session (2025-11-25): timeout, then retry
  3b  Streamable HTTP, stateless (2026-07-28): timeout, then retry
  4   an agent framework's retry policy (3 attempts, like LangGraph's
      RetryPolicy) re-runs a node that failed after its charge returned

Each scenario runs three times, each run with its own server processes and
its own SQLite file in a temporary directory that is removed afterwards:
without the layer (serve --bare), with the layer and an idempotency key in
_meta (the same key on every retry of the call), and with the layer and no
key (the layer then recognises the retry by tool and arguments). Each run counts the rows of the ledger's charges table,
one row per actual charge. Progress goes to stderr, the table (or JSON with
--json) to stdout. It takes a few seconds.

Exits 0 when the layer charged exactly once in every scenario, with and
without a key. Exits 1 when it did not, when a run could not be carried out,
or when a scenario did not reproduce what it is about: a first attempt that
did not time out or lose its connection, or no duplicate without the layer,
makes the count of 1 beside it prove nothing.`

// demoWorkers bounds the runs in flight. Runs mostly wait on the charge's
// delay, so a few at once keep the demo short even on two cores; the
// timeout-to-delay margin does not depend on CPU time.
const demoWorkers = 4

func runDemo(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "demo", demoUsage)
	delay := fs.Duration("delay", scenario.DefaultDelay, "how long charge takes in scenarios 1 to 3b, which need a call in progress (serve --demo-delay); must be longer than --timeout")
	timeout := fs.Duration("timeout", scenario.DefaultTimeout, "the client's timeout on the first attempt in scenarios 1, 3a and 3b")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *delay <= 0 || *timeout <= 0 {
		return usagef("--delay and --timeout must be positive")
	}
	if *timeout >= *delay {
		return usagef("--timeout (%v) must be shorter than --delay (%v), or no call times out", *timeout, *delay)
	}
	binary, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	dir, err := os.MkdirTemp("", "mcp-outbox-demo-")
	if err != nil {
		return fmt.Errorf("create temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)

	cfg := scenario.Config{Binary: binary, Dir: dir, Delay: *delay, Timeout: *timeout}
	rep, err := runDemoScenarios(ctx, env.stderr, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
	} else {
		printDemoTable(env.stdout, rep)
	}
	if len(rep.Problems) > 0 {
		return errors.New(strings.Join(rep.Problems, "; "))
	}
	return nil
}

// demoReport is the demo's output; --json prints it as it is.
type demoReport struct {
	Delay     string        `json:"delay"`
	Timeout   string        `json:"timeout"`
	OK        bool          `json:"ok"`
	Summary   string        `json:"summary"`
	Problems  []string      `json:"problems,omitempty"`
	Scenarios []demoOutcome `json:"scenarios"`
}

// demoOutcome is one row of the table: a scenario and its runs.
type demoOutcome struct {
	scenario.Scenario
	// Charges maps each mode to the actual charges of its run.
	Charges map[scenario.Mode]int `json:"charges"`
	Runs    []scenario.Result     `json:"runs"`
}

func runDemoScenarios(ctx context.Context, progress io.Writer, cfg scenario.Config) (*demoReport, error) {
	type job struct {
		row, col int
		sc       scenario.Scenario
		mode     scenario.Mode
	}
	scs, modes := scenario.All(), scenario.Modes()
	rep := &demoReport{Delay: cfg.Delay.String(), Timeout: cfg.Timeout.String(), Scenarios: make([]demoOutcome, len(scs))}
	var jobs []job
	for i, sc := range scs {
		rep.Scenarios[i] = demoOutcome{Scenario: sc, Charges: map[scenario.Mode]int{}, Runs: make([]scenario.Result, len(modes))}
		for j, m := range modes {
			jobs = append(jobs, job{i, j, sc, m})
		}
	}
	fmt.Fprintf(progress, "mcp-outbox demo: %d scenarios x %d modes, each run on its own server and database (charge takes %v, client timeout %v)\n",
		len(scs), len(modes), cfg.Delay, cfg.Timeout)

	start := time.Now()
	queue := make(chan job)
	errs := make([]error, len(jobs))
	var mu sync.Mutex // serialises progress lines and the report
	var wg sync.WaitGroup
	done := 0
	for range min(demoWorkers, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for jb := range queue {
				res, err := scenario.Run(ctx, cfg, jb.sc.ID, jb.mode)
				res.DB = "" // in the temporary directory, gone when the demo ends
				mu.Lock()
				done++
				var line string
				if err != nil {
					errs[jb.row*len(modes)+jb.col] = err
					line = "error: " + err.Error()
				} else {
					line = fmt.Sprintf("%d tools/call, %s", res.Calls, plural(res.Charges, "charge"))
				}
				fmt.Fprintf(progress, "mcp-outbox demo: [%2d/%d] %-3s %-28s %s: %s (%.1fs)\n", done, len(jobs),
					jb.sc.Number, jb.sc.Transport, modeLabel(jb.mode), line, float64(res.ElapsedMS)/1000)
				rep.Scenarios[jb.row].Runs[jb.col] = res
				rep.Scenarios[jb.row].Charges[jb.mode] = res.Charges
				mu.Unlock()
			}
		}()
	}
feed:
	for _, jb := range jobs {
		select {
		case queue <- jb:
		case <-ctx.Done():
			break feed
		}
	}
	close(queue)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "mcp-outbox demo: done in %.1fs\n", time.Since(start).Seconds())

	var bare, numbers []string
	layerFailed := false
	for _, o := range rep.Scenarios {
		for _, res := range o.Runs {
			if err := res.Check(); err != nil {
				rep.Problems = append(rep.Problems, "scenario "+o.Number+" did not reproduce: "+err.Error())
			}
			if res.Mode == scenario.Bare && res.Charges < o.Calls {
				// Then the layer's count beside it shows nothing either.
				rep.Problems = append(rep.Problems, fmt.Sprintf("scenario %s without the layer: %s from %d tools/call, "+
					"the duplicate did not reproduce (a longer --delay may help)", o.Number, plural(res.Charges, "charge"), res.Calls))
			}
			if res.Mode != scenario.Bare && res.Charges != o.LogicalCalls {
				layerFailed = true
				rep.Problems = append(rep.Problems, fmt.Sprintf("scenario %s, %s: %d charges for %d logical call, want %d",
					o.Number, modeLabel(res.Mode), res.Charges, o.LogicalCalls, o.LogicalCalls))
			}
		}
		bare = append(bare, strconv.Itoa(o.Charges[scenario.Bare]))
		numbers = append(numbers, o.Number)
	}
	rep.OK = len(rep.Problems) == 0
	if rep.OK {
		rep.Summary = fmt.Sprintf("Without the layer, one logical charge became %s actual charges in scenarios %s: "+
			"every retry charged again. With the layer it was charged exactly once in each, whether the client sent an "+
			"idempotency key or not (the layer then knows the retry by its tool and arguments): a retry of a committed "+
			"call replays its result, and a call cut off before its commit leaves nothing behind.",
			joinAnd(bare), joinAnd(numbers))
	} else if layerFailed {
		rep.Summary = "With the layer, one logical charge did NOT always become exactly one actual charge: " +
			strings.Join(rep.Problems, "; ") + "."
	} else {
		rep.Summary = "This run could not show what the layer prevents: " + strings.Join(rep.Problems, "; ") + "."
	}
	return rep, nil
}

// joinAnd joins "2", "2", "3" as "2, 2 and 3".
func joinAnd(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func modeLabel(m scenario.Mode) string {
	switch m {
	case scenario.Bare:
		return "without the layer"
	case scenario.LayerKey:
		return "layer + key"
	case scenario.LayerNoKey:
		return "layer, no key"
	}
	return string(m)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func printDemoTable(w io.Writer, rep *demoReport) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\t\t\t\tlogical\tactual charges:\t\t")
	fmt.Fprintln(tw, "#\tscenario\ttransport\twho retries\tcalls\twithout the layer\tlayer + key\tlayer, no key")
	for _, o := range rep.Scenarios {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", o.Number, o.Title, o.Transport, o.Retrier, o.LogicalCalls,
			o.Charges[scenario.Bare], o.Charges[scenario.LayerKey], o.Charges[scenario.LayerNoKey])
	}
	tw.Flush()
	// tabwriter pads the header's empty cells.
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	fmt.Fprintf(w, "\n%s\n", wrap(rep.Summary, 78))
}

// wrap breaks s into lines of at most width columns at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(s) {
		switch {
		case n == 0:
		case n+1+len(word) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}
