package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"
)

// result is one side's figures in one cell, summed over rounds.
type result struct {
	calls        int
	errors       int
	elapsed      time.Duration
	latencies    []time.Duration
	cpu          time.Duration // the servers' user+system time while measured
	loadCPU      time.Duration // this process's, for the same calls
	mallocs      float64       // the servers' heap allocations while measured
	mallocsKnown bool
	peakRSS      int64 // the servers' peak resident memory, summed
	// roundTrips: client bursts to PostgreSQL that got an answer, counted
	// by the delaying proxy while measured (--rtt).
	roundTrips      int64
	roundTripsKnown bool
	// commits: pg_stat_database's xact_commit over the warm-up and the
	// measured time, whose calls commitCalls counts.
	commits     int64
	commitCalls int
	// dbCPU: the PostgreSQL cluster's user+system time while measured
	// (every process of it: see pgtest.Server.CPU).
	dbCPU      time.Duration
	dbCPUKnown bool
}

func (r *result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.calls) / r.elapsed.Seconds()
}

func (r *result) p(q float64) time.Duration {
	slices.Sort(r.latencies)
	return percentile(r.latencies, q)
}

type cellResult struct {
	cell    cell
	results []*result // by side
}

type report struct {
	cfg   config
	sides []side
	cells []*cellResult
}

func (rep *report) write(w io.Writer) {
	store := "SQLite files (WAL, synchronous=FULL)"
	if rep.cfg.store == "postgres" {
		store = "PostgreSQL (fsync on)"
	}
	fmt.Fprintf(w, "outbox-load: %s, %d rounds of %s per side and cell, on %d CPUs\n",
		store, rep.cfg.rounds, rep.cfg.duration, runtime.NumCPU())
	fmt.Fprintln(w, "sides:")
	for _, s := range rep.sides {
		fmt.Fprintf(w, "  %-9s %s\n", s.short, s.name)
	}
	limit := slices.IndexFunc(rep.sides, func(s side) bool { return s.role == roleLimit })
	careful := slices.IndexFunc(rep.sides, func(s side) bool { return s.role == roleCareful })
	expert := slices.IndexFunc(rep.sides, func(s side) bool { return s.role == roleExpert })
	for _, c := range rep.cells {
		fmt.Fprintf(w, "\n%s\n", c.cell)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		// PostgreSQL's own CPU: on SQLite the database is the server's
		// CPU already.
		pg := rep.cfg.store == "postgres"
		dbHeader := ""
		if pg {
			dbHeader = "DB CPU/call\tDB vs careful\t"
		}
		fmt.Fprintln(tw, "side\tcalls/s\tvs limit\tvs careful\tvs expert\tp50\tp99\tmax\tp99 vs limit\tCPU/call\t"+dbHeader+"load CPU/call\tallocs/call\tpeak RSS\tRT/call\tcommits/call\terrors\t")
		lr, cr, er := &result{}, &result{}, &result{}
		if expert >= 0 {
			er = c.results[expert]
		}
		if limit >= 0 {
			lr = c.results[limit]
		}
		if careful >= 0 {
			cr = c.results[careful]
		}
		for i, s := range rep.sides {
			r := c.results[i]
			if r.elapsed == 0 {
				continue
			}
			allocs := "n/a"
			if r.mallocsKnown && r.calls > 0 {
				allocs = fmt.Sprintf("%.0f", r.mallocs/float64(r.calls))
			}
			cpu, loadCPU := time.Duration(0), time.Duration(0)
			if r.calls > 0 {
				cpu, loadCPU = r.cpu/time.Duration(r.calls), r.loadCPU/time.Duration(r.calls)
			}
			rts, commits := "-", "-"
			if r.roundTripsKnown && r.calls > 0 {
				rts = fmt.Sprintf("%.1f", float64(r.roundTrips)/float64(r.calls))
			}
			if r.commitCalls > 0 {
				commits = fmt.Sprintf("%.2f", float64(r.commits)/float64(r.commitCalls))
			}
			db := ""
			if pg {
				dbCPU, dbRatio := "-", "-"
				if r.dbCPUKnown && r.calls > 0 {
					dbCPU = (r.dbCPU / time.Duration(r.calls)).Round(time.Microsecond).String()
					if cr.dbCPUKnown && cr.calls > 0 {
						dbRatio = ratio(float64(r.dbCPU)/float64(r.calls), float64(cr.dbCPU)/float64(cr.calls))
					}
				}
				db = dbCPU + "\t" + dbRatio + "\t"
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s%s\t%s\t%dMiB\t%s\t%s\t%d\t\n", s.short, r.rate(),
				ratio(r.rate(), lr.rate()), ratio(r.rate(), cr.rate()), ratio(r.rate(), er.rate()),
				round(r.p(0.5)), round(r.p(0.99)), round(r.p(1)), ratio(float64(r.p(0.99)), float64(lr.p(0.99))),
				cpu.Round(time.Microsecond), db, loadCPU.Round(time.Microsecond), allocs, r.peakRSS>>20, rts, commits, r.errors)
		}
		tw.Flush()
	}
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func round(d time.Duration) time.Duration {
	switch {
	case d > 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}
