package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Target 6: the status lookup's 99th percentile with the whole history
// recorded, against the same lookups in a history of a thousand calls.

// smallHistory is the size of the baselines' histories.
const smallHistory = 1_000

func (e *env) measureStatus(ctx context.Context, big *history) (Result, error) {
	small, err := e.seedHistory(ctx, "status-small.db", min(smallHistory, big.calls), 0)
	if err != nil {
		return Result{}, err
	}
	e.logf("target 6: %d status lookups in %s calls, and in %s", e.cfg.Lookups, group(int64(big.calls)), group(int64(small.calls)))
	// Interleaved, so that neither side gets the quieter moment.
	var d [2][]time.Duration
	for round := range e.cfg.Rounds {
		for i, h := range []*history{small, big} {
			got, err := lookups(ctx, h, e.cfg.Lookups, uint64(round))
			if err != nil {
				return Result{}, err
			}
			d[i] = append(d[i], got...)
		}
	}
	p99 := func(d []time.Duration) float64 { return float64(percentile(d, 0.99).Nanoseconds()) / 1e6 }
	return newResult(6, fmt.Sprintf("status lookup p99, %s calls", group(int64(big.calls))), "ms",
		p99(d[1]), p99(d[0]), group(int64(small.calls))+" calls", AtMost(1)), nil
}

// lookups times n status lookups of random calls of h, one after another.
func lookups(ctx context.Context, h *history, n int, seed uint64) ([]time.Duration, error) {
	db, err := schema.Open(ctx, h.path, nil)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rng := rand.New(rand.NewPCG(seed, uint64(h.calls)))
	now := time.Now()
	out := make([]time.Duration, 0, n)
	for range n {
		key := historyKey(rng.IntN(h.calls) + 1)
		start := time.Now()
		st, err := query.Lookup(ctx, db, callkey.LocalPrincipal, key, now)
		took := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("look up %s: %w", key, err)
		}
		if st.State != query.Completed || len(st.Effects) != 1 {
			return nil, fmt.Errorf("look up %s: state %s with %d effects, want completed with 1", key, st.State, len(st.Effects))
		}
		out = append(out, took)
	}
	return out, nil
}
