package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Report is every scenario run in every mode: what `mcp-outbox demo`
// prints, as a table ([Report.WriteTable]) or, with --json, as it is.
type Report struct {
	Delay     string    `json:"delay"`
	Timeout   string    `json:"timeout"`
	OK        bool      `json:"ok"`
	Summary   string    `json:"summary"`
	Problems  []string  `json:"problems,omitempty"`
	Scenarios []Outcome `json:"scenarios"`
}

// Outcome is one row of the table: a scenario and its runs.
type Outcome struct {
	Scenario
	// Charges maps each mode to the actual charges of its run.
	Charges map[Mode]int `json:"charges"`
	Runs    []Result     `json:"runs"`
}

// reportWorkers bounds the runs in flight. Runs mostly wait on the
// charge's delay, so a few at once keep the demo short even on two cores;
// the timeout-to-delay margin does not depend on CPU time.
const reportWorkers = 4

// RunAll runs every scenario in every mode, a few at once, each run on its
// own server processes and database file under cfg.Dir, and reports a
// progress line per run to progress (prefixed "mcp-outbox demo: "). The
// results name no database file. The report's Problems say what did not
// reproduce or was charged more than once; an error is a run that could not
// be carried out, or ctx ending.
func RunAll(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
	type job struct {
		row, col int
		sc       Scenario
		mode     Mode
	}
	scs, modes := All(), Modes()
	rep := &Report{Delay: cfg.Delay.String(), Timeout: cfg.Timeout.String(), Scenarios: make([]Outcome, len(scs))}
	var jobs []job
	for i, sc := range scs {
		rep.Scenarios[i] = Outcome{Scenario: sc, Charges: map[Mode]int{}, Runs: make([]Result, len(modes))}
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
	for range min(reportWorkers, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for jb := range queue {
				res, err := Run(ctx, cfg, jb.sc.ID, jb.mode)
				res.DB = "" // under cfg.Dir, which the demo removes when it ends
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
			if res.Mode == Bare && res.Charges < o.Calls {
				// Then the layer's count beside it shows nothing either.
				rep.Problems = append(rep.Problems, fmt.Sprintf("scenario %s without the layer: %s from %d tools/call, "+
					"the duplicate did not reproduce (a longer --delay may help)", o.Number, plural(res.Charges, "charge"), res.Calls))
			}
			if res.Mode != Bare && res.Charges != o.LogicalCalls {
				layerFailed = true
				rep.Problems = append(rep.Problems, fmt.Sprintf("scenario %s, %s: %d charges for %d logical call, want %d",
					o.Number, modeLabel(res.Mode), res.Charges, o.LogicalCalls, o.LogicalCalls))
			}
		}
		bare = append(bare, strconv.Itoa(o.Charges[Bare]))
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

// modeLabel is m as the table's column and the progress lines say it.
func modeLabel(m Mode) string {
	switch m {
	case Bare:
		return "without the layer"
	case LayerKey:
		return "layer + key"
	case LayerNoKey:
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

// WriteTable prints the report for a terminal: a row a scenario with the
// charges of each mode, then the summary wrapped at 78 columns.
func (rep *Report) WriteTable(w io.Writer) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\t\t\t\tlogical\tactual charges:\t\t")
	fmt.Fprintln(tw, "#\tscenario\ttransport\twho retries\tcalls\twithout the layer\tlayer + key\tlayer, no key")
	for _, o := range rep.Scenarios {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", o.Number, o.Title, o.Transport, o.Retrier, o.LogicalCalls,
			o.Charges[Bare], o.Charges[LayerKey], o.Charges[LayerNoKey])
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
