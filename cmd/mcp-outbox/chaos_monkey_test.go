package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// The monkey SIGKILLs one of the soak's processes after each random chaosPause:
// a stdio client's server (its client starts another on its next call), the
// HTTP server (started again after a random downtime, on its address), or
// the downstream (the same). Its pauses are the workload's rhythm, not a
// wait for anything.

type chaosMonkey struct {
	rng        *rand.Rand
	log        *chaosLog
	stdio      []*chaosStdioClient
	http       *chaosHTTPServer
	downstream *chaosDownstream

	pauseMin, pauseMax time.Duration // between kills
	// A killed HTTP server or downstream stays down up to this long. The
	// downstream's outages are kept short: what its kills are for is the
	// requests they cut (applied or not, never answered). Long or frequent
	// outages only pile up failed attempts, whose backoff (doubling to 10
	// minutes) the final drain would then have to wait out.
	httpDownMax, downstreamDownMax time.Duration

	// What the monkey did; read after run returns.
	stdioKills, httpKills, downstreamKills int
}

// between draws a duration uniform in [lo, hi].
func (m *chaosMonkey) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(m.rng.Int64N(int64(hi-lo)+1))
}

// chaosPause waits d, or less if ctx ends; it reports whether ctx is still on.
func chaosPause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// run kills until ctx ends. An error (a process that would not start
// again) ends it early.
func (m *chaosMonkey) run(ctx context.Context) error {
	for chaosPause(ctx, m.between(m.pauseMin, m.pauseMax)) {
		switch r := m.rng.Float64(); {
		case r < 0.45:
			if m.stdio[m.rng.IntN(len(m.stdio))].kill() {
				m.stdioKills++
			}
		case r < 0.75:
			killed, err := m.http.kill(ctx)
			if err != nil {
				return err
			}
			if killed {
				m.httpKills++
			}
			// Restarted even when the soak just ended, so that the last
			// calls are not left without a server.
			chaosPause(ctx, m.between(0, m.httpDownMax))
			if err := m.http.start(); err != nil {
				return fmt.Errorf("start the HTTP server again: %w", err)
			}
		default:
			killed, err := m.downstream.kill(ctx)
			if err != nil {
				return err
			}
			if killed {
				m.downstreamKills++
			}
			chaosPause(ctx, m.between(0, m.downstreamDownMax))
			if err := m.downstream.start(); err != nil {
				return fmt.Errorf("start the downstream again: %w", err)
			}
		}
	}
	return nil
}
